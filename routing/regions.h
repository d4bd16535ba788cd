// Which region each rank is in: from the names ranks were launched with (MERIDIAN_REGION), or,
// when those are missing, inferred from measured RTTs, since ranks in one region are a fraction
// of a millisecond apart and ranks in different regions tens to hundreds.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::routing {

struct RegionAssignment {
  std::vector<int> regionOf;       // per rank, an index into names
  std::vector<std::string> names;  // per region; regions are numbered by their lowest member rank
  bool inferred = false;           // true when clustered from RTTs rather than named
};

// From per-rank names (MERIDIAN_REGION of each rank), compared exactly. Regions are numbered in
// order of first appearance, i.e. by lowest member rank. Empty names anywhere ->
// invalidArgument listing the ranks without one; no ranks at all -> invalidArgument.
Result<RegionAssignment> regionsFromNames(const std::vector<std::string>& names);

// The smallest gap (ratio between consecutive sorted RTTs) taken as a region boundary.
// Noise and route differences spread inter-region RTTs by less than this; intra vs inter
// region is a factor of tens to hundreds.
inline constexpr double kMinRegionGapRatio = 3.0;
// An RTT below this never separates regions: ranks this close are in one metro area (hosts in
// one data centre, or availability zones of one region), whatever finer gaps they show
// (e.g. 0.05 ms on one host vs 0.4 ms across racks). The closest distinct cloud regions are
// several ms apart.
inline constexpr double kMinInterRegionRttUs = 2000.0;

// Clusters ranks by their RTT matrix (rttUs[i * ranks + j], measured by i towards j; < 0 or NaN
// = unknown; the diagonal is ignored). The matrix is made symmetric by taking the smaller of
// the two directions where both are known (queueing only ever inflates an RTT, so the smaller
// is nearer the path's propagation delay). Single-linkage threshold clustering: two ranks share
// a region when a known RTT between them is at or below the threshold, transitively. The
// threshold sits at the largest multiplicative gap between consecutive sorted RTTs, counting
// only gaps of at least kMinRegionGapRatio whose upper side is at least kMinInterRegionRttUs;
// with no such gap (a uniform matrix, or one metro area) every known RTT links, giving one
// region where the known entries connect all ranks. Unknown entries give no evidence either way.
// Regions are named "region-0", "region-1", ... by lowest member rank. Deterministic.
// Errors (invalidArgument): ranks < 1, a matrix of the wrong size, a rank with no known RTT to
// any other rank (it cannot be placed).
Result<RegionAssignment> inferRegions(const std::vector<double>& rttUs, int ranks);

}  // namespace meridian::routing
