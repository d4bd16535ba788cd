// idx(i): an int (a rank, a path, a count) as a container index. Ranks and counts are ints
// in the interfaces and size_t in the containers; this is the one place that says so.
#pragma once

#include <cstddef>

namespace meridian {

constexpr std::size_t idx(int i) { return static_cast<std::size_t>(i); }

}  // namespace meridian
