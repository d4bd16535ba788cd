// Region assignment from names or from RTT clustering.
#include "routing/regions.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

namespace meridian::routing {
namespace {

// "1, 4, 7" for an error message, shortened for large jobs so the message stays readable.
std::string listRanks(const std::vector<std::size_t>& ranks) {
  constexpr std::size_t kShown = 16;
  std::string out;
  for (std::size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShown) out += fmt::format(", ... ({} in all)", ranks.size());
  return out;
}

bool known(double rtt) { return rtt >= 0; }  // false for NaN too

// Union-find with path halving; ranks are few (hundreds), so no union by rank is needed.
std::size_t findRoot(std::vector<std::size_t>& parent, std::size_t x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

}  // namespace

Result<RegionAssignment> regionsFromNames(const std::vector<std::string>& names) {
  if (names.empty()) return invalidArgument("no ranks to assign regions to");
  std::vector<std::size_t> missing;
  for (std::size_t r = 0; r < names.size(); ++r) {
    if (names[r].empty()) missing.push_back(r);
  }
  if (!missing.empty()) {
    return invalidArgument("MERIDIAN_REGION is not set for rank{} {}", missing.size() == 1 ? "" : "s",
                           listRanks(missing));
  }
  RegionAssignment a;
  a.regionOf.reserve(names.size());
  std::unordered_map<std::string, int> index;
  for (const std::string& name : names) {
    auto [it, added] = index.try_emplace(name, static_cast<int>(a.names.size()));
    if (added) a.names.push_back(name);
    a.regionOf.push_back(it->second);
  }
  return a;
}

Result<RegionAssignment> inferRegions(const std::vector<double>& rttUs, int ranks) {
  if (ranks < 1) return invalidArgument("cannot infer regions for {} ranks", ranks);
  const auto n = static_cast<std::size_t>(ranks);
  if (rttUs.size() != n * n) {
    return invalidArgument("RTT matrix has {} entries, {} ranks need {}", rttUs.size(), n, n * n);
  }

  // Symmetric distances for i < j; NaN = unknown.
  const double kUnknown = std::numeric_limits<double>::quiet_NaN();
  struct Edge {
    double rtt;
    std::size_t a, b;
  };
  std::vector<Edge> edges;
  std::vector<bool> placed(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      double ij = rttUs[i * n + j], ji = rttUs[j * n + i];
      double d = known(ij) && known(ji) ? std::min(ij, ji) : known(ij) ? ij : known(ji) ? ji : kUnknown;
      if (!known(d)) continue;
      edges.push_back(Edge{d, i, j});
      placed[i] = placed[j] = true;
    }
  }
  if (n > 1) {
    std::vector<std::size_t> isolated;
    for (std::size_t r = 0; r < n; ++r) {
      if (!placed[r]) isolated.push_back(r);
    }
    if (!isolated.empty()) {
      return invalidArgument("no RTT known between rank{} {} and any other rank", isolated.size() == 1 ? "" : "s",
                             listRanks(isolated));
    }
  }

  // Threshold at the largest qualifying multiplicative gap; none -> everything links.
  // Ties in the ratio go to the lower gap, which only matters for contrived matrices.
  std::vector<double> sorted;
  sorted.reserve(edges.size());
  for (const Edge& e : edges) sorted.push_back(e.rtt);
  std::sort(sorted.begin(), sorted.end());
  double threshold = std::numeric_limits<double>::infinity();
  double bestRatio = 0;
  for (std::size_t k = 0; k + 1 < sorted.size(); ++k) {
    double lo = sorted[k], hi = sorted[k + 1];
    if (hi < kMinInterRegionRttUs) continue;
    // A 1 us floor keeps a zero RTT (same host, coarse clock) from making an infinite ratio.
    double ratio = hi / std::max(lo, 1.0);
    if (ratio >= kMinRegionGapRatio && ratio > bestRatio) {
      bestRatio = ratio;
      threshold = lo;
    }
  }

  std::vector<std::size_t> parent(n);
  std::iota(parent.begin(), parent.end(), std::size_t{0});
  for (const Edge& e : edges) {
    if (e.rtt > threshold) continue;
    std::size_t ra = findRoot(parent, e.a), rb = findRoot(parent, e.b);
    if (ra != rb) parent[std::max(ra, rb)] = std::min(ra, rb);
  }

  RegionAssignment a;
  a.inferred = true;
  a.regionOf.assign(n, -1);
  std::vector<int> regionOfRoot(n, -1);
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t root = findRoot(parent, r);
    if (regionOfRoot[root] < 0) {
      regionOfRoot[root] = static_cast<int>(a.names.size());
      a.names.push_back(fmt::format("region-{}", a.names.size()));
    }
    a.regionOf[r] = regionOfRoot[root];
  }
  return a;
}

}  // namespace meridian::routing
