// PathJudge: congestion detection and path weights for a channel that runs no probes (the
// NCCL plugin's connections, whose peers publish no probe endpoints), from the backend's own
// figures of each path (PathStats' telemetry: for TCP the kernel's TCP_INFO of the path's
// streams, read about once a second): the units resent over those sent between two readings
// are the loss; the channel's delivery rate on readings in which the path was busy (busyDeliveryRate)
// feeds the rate-collapse trigger. The same CongestionDetector (hysteresis) and weightsFor as
// probed paths.
//
// Queueing is not judged here: a bulk transfer fills its bottleneck's queue by itself, so the
// round trip of its own links shows the transfer's own queue, which says nothing about other
// traffic (a queueing judge flagged the plane the transfer saturated alone and pushed the
// traffic onto a flooded one; docs/nccl_plugin.md has the lab figures). Loss tells the two
// apart: a flooded or cut-down plane resends a large share, a saturated one almost nothing.
//
// Pure: no clock, no I/O; the caller feeds readings and applies the weights.
//
// Threads: one owner at a time (the plugin's monitor thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "routing/congestion.h"
#include "transport/channel.h"

namespace meridian::routing {

struct PathVerdict {
  CongestionState state = CongestionState::kClear;
  std::string reason;  // the detector's: why the state began
  int samples = 0;     // readings judged so far (busy ones only)
};

class PathJudge {
 public:
  explicit PathJudge(CongestionConfig config = {});

  // One reading of every path of the channel at `nowUs`. A path is judged only on readings in
  // which it sent units (TCP segments, packets) since the last one it was judged on (an idle
  // path's RTT is stale, not clear). Returns the weights to apply when they differ from the last returned
  // (the first time: when they differ from neutral), else nullopt.
  std::optional<std::vector<double>> update(std::int64_t nowUs, const std::vector<transport::PathStats>& paths);

  const std::vector<PathVerdict>& verdicts() const { return verdicts_; }
  // Indices of the paths whose state changed in the last update().
  const std::vector<std::size_t>& changed() const { return changed_; }

 private:
  struct Track {
    CongestionDetector detector;
    bool seen = false;
    std::uint64_t unitsSent = 0, unitsResent = 0;
    std::uint64_t bytesSent = 0;  // the channel's count at the last judged reading
    std::int64_t judgedAtUs = 0;
  };
  CongestionConfig config_;
  std::vector<Track> tracks_;
  std::vector<PathVerdict> verdicts_;
  std::vector<std::size_t> changed_;
  std::vector<double> applied_;
};

}  // namespace meridian::routing
