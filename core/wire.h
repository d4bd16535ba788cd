// Little-endian load/store helpers for wire formats. Offsets and lengths are bytes.
#pragma once

#include <cstdint>
#include <cstring>

namespace meridian::wire {

template <typename T>
inline void store(std::uint8_t* p, T v) {
  static_assert(std::is_integral_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i));
}

template <typename T>
inline T load(const std::uint8_t* p) {
  static_assert(std::is_integral_v<T>);
  std::uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace meridian::wire
