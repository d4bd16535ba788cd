// The link-state table: every rank's latest figures on each of its paths to each peer, one
// row per rank. Each rank measures its own row (probes and the channels' delivered rates)
// and sends it to every other rank on a slow period, so every rank holds the whole table;
// rank 0 plans from it, meridian-probe and the metrics show it.
//
// Missing values are explicit (std::nullopt): a path with no echo yet has no RTT, a path
// that never carried data has no rate. The view the planner needs fills the gaps in a
// documented order (LinkStateTable::view) instead of inventing numbers silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "routing/planner.h"
#include "transport/channel.h"

namespace meridian::routing {

// One (peer, path) as one rank sees it.
struct LinkFigures {
  int peer = 0;
  int path = 0;
  std::optional<double> minRttUs;
  std::optional<double> srttUs;
  std::optional<double> jitterUs;
  std::optional<double> loss;              // 0..1
  std::optional<double> rateBytesPerSec;   // delivered rate while the path was busy
  bool congested = false;
  // The path's kind: TCP paths are probed (RTT, jitter, loss); fabric and shared-memory paths
  // carry their measured rate alone. A shared-memory link is a link kind of its own in the
  // view: where a pair has one, its rate is that link's, not a sum with the TCP paths that
  // stand by beside it.
  transport::PathKind kind = transport::PathKind::kTcp;
};

struct LinkRow {
  int rank = 0;
  std::int64_t atUs = 0;  // sender's monotonic clock, only compared with its own rows
  std::vector<LinkFigures> links;
};

// Bounds on a row from the wire: its encoded size and paths per peer.
inline constexpr std::size_t kMaxLinkRowBytes = std::size_t{1} << 20;
inline constexpr int kMaxPathsPerPeer = 64;

// The row as JSON text.
std::vector<std::uint8_t> encodeLinkRow(const LinkRow& row);
// Parses and checks a row from `worldSize` ranks: size bound, types, ranks and peers in
// range, paths below kMaxPathsPerPeer, numbers finite and >= 0, loss <= 1, at most
// (worldSize-1) * kMaxPathsPerPeer links. invalidArgument naming the first problem.
Result<LinkRow> decodeLinkRow(std::span<const std::uint8_t> bytes, int worldSize);

// Rates assumed for a pair no path of which has carried data, when nothing measured can
// stand in for it (see LinkStateTable::view): what a 4 MiB TCP window gives over the pair's
// RTT, capped at 10 Gbit/s.
inline constexpr double kPriorWindowBytes = 4.0 * 1024 * 1024;
inline constexpr double kPriorMaxBytesPerSec = 1.25e9;

class LinkStateTable {
 public:
  explicit LinkStateTable(int worldSize);
  int worldSize() const { return worldSize_; }

  // Keeps `row` as its rank's latest (an older atUs than the kept one is ignored).
  // invalidArgument when the rank is out of range.
  Status update(LinkRow row);
  const std::optional<LinkRow>& row(int rank) const { return rows_[static_cast<std::size_t>(rank)]; }

  // Every ordered pair has an RTT from at least one side (RTTs are round trips: either
  // end's measurement serves both directions).
  bool complete() const;

  // How many (rank, peer, path) cells hold a measured rate. It only grows as paths carry
  // data: a rise means the table knows something a plan made before it did not.
  std::size_t measuredRates() const;

  // The planner's view. Per ordered pair (i, j):
  //  - latency: half the smaller smoothed RTT over j's paths in i's row, else in j's row;
  //    a pair with none is unusable (rate 0);
  //  - rate: the measured rate of i's shared-memory link to j where there is one, else the
  //    sum over i's paths to j of their measured rates; missing, the first of: the measured
  //    j -> i rate (links are near symmetric), the median measured rate between the same two
  //    regions, the median of measured pairs whose RTT is within 1.5x (these two over pairs
  //    without a shared-memory link, so on two hosts), and kPriorWindowBytes / RTT (at most
  //    kPriorMaxBytesPerSec).
  // `regionOf` (per rank, in [0, regions)) is copied into the view.
  NetworkView view(const std::vector<int>& regionOf, int regions) const;

  // The RTT matrix in microseconds (smaller smoothed RTT over the paths, either side; -1
  // where unknown), as inferRegions wants it.
  std::vector<double> rttMatrixUs() const;

 private:
  int worldSize_;
  std::vector<std::optional<LinkRow>> rows_;
};

}  // namespace meridian::routing
