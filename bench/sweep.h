// What meridian-bench, mpi-coll-bench and gloo-coll-bench share so that their sweeps match
// size for size and iteration for iteration (header-only: the MPI and Gloo tools link none
// of Meridian's libraries).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace meridian::bench {

// "64", "4k", "16M", "1G" (binary multiples); nullopt for anything else.
inline std::optional<std::size_t> parseSize(const std::string& s) {
  std::size_t mult = 1;
  std::string_view digits = s;
  const char last = s.empty() ? '\0' : s.back();
  if (last == 'k' || last == 'K') mult = std::size_t{1} << 10;
  if (last == 'm' || last == 'M') mult = std::size_t{1} << 20;
  if (last == 'g' || last == 'G') mult = std::size_t{1} << 30;
  if (mult != 1) digits.remove_suffix(1);
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || v > SIZE_MAX / mult) {
    return std::nullopt;
  }
  return v * mult;
}

// Fewer iterations for large sizes keep a sweep to minutes on small machines: about
// 128 MiB of data per size, at least min(iters, 5) and at most iters.
inline int itersFor(std::size_t bytes, int iters) {
  constexpr std::size_t kBudget = std::size_t{128} << 20;
  if (bytes == 0) return iters;
  return std::clamp(static_cast<int>(kBudget / bytes), std::min(iters, 5), iters);
}

}  // namespace meridian::bench
