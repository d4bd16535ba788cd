// Checkable message contents for the transport tests: `n` bytes from a seeded generator, so
// a byte in the wrong place or from the wrong message shows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace meridian::transport {

inline std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng());
  return v;
}

}  // namespace meridian::transport
