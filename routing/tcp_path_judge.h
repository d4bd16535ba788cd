// TcpPathJudge: congestion detection and path weights for a channel that runs no probes (the
// NCCL plugin's connections, whose peers publish no probe endpoints), from the kernel's own
// figures of the channel's TCP streams (PathStats' TCP_INFO fields, read by the device about
// once a second): the segments retransmitted over those sent between two readings are the
// loss; the channel's delivery rate on readings in which the path was busy (busyDeliveryRate)
// feeds the rate-collapse trigger. The same CongestionDetector (hysteresis) and weightsFor as
// probed paths.
//
// Queueing is not judged here (the figures carry no RTT): a bulk transfer fills its bottleneck's queue
// by itself, so the kernel's RTT of the streams shows the transfer's own queue, which says
// nothing about other traffic. Measured in the lab: with wan-a flooded by UDP cross-traffic,
// a queueing-and-loss judge also flagged the saturated wan-b (22 ms over its 15 ms floor),
// sometimes first, and pushed the traffic onto the flooded plane: 6.2-6.4 MiB/s against
// 10.5-11.5 without a judge. Loss tells the two apart (14-25% on a flooded or cut-down plane,
// well under the 2% mark on a plane the transfer saturates alone).
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

struct TcpPathVerdict {
  CongestionState state = CongestionState::kClear;
  std::string reason;  // the detector's: why the state began
  int samples = 0;     // readings judged so far (busy ones only)
};

class TcpPathJudge {
 public:
  explicit TcpPathJudge(CongestionConfig config = {});

  // One reading of every path of the channel at `nowUs`. A path is judged only on readings in
  // which its streams sent segments since the last one it was judged on (an idle path's RTT is
  // stale, not clear). Returns the weights to apply when they differ from the last returned
  // (the first time: when they differ from neutral), else nullopt.
  std::optional<std::vector<double>> update(std::int64_t nowUs, const std::vector<transport::PathStats>& paths);

  const std::vector<TcpPathVerdict>& verdicts() const { return verdicts_; }
  // Indices of the paths whose state changed in the last update().
  const std::vector<std::size_t>& changed() const { return changed_; }

 private:
  struct Track {
    CongestionDetector detector;
    bool seen = false;
    std::uint64_t segments = 0, retransmits = 0;
    std::uint64_t bytesSent = 0;  // the channel's count at the last judged reading
    std::int64_t judgedAtUs = 0;
  };
  CongestionConfig config_;
  std::vector<Track> tracks_;
  std::vector<TcpPathVerdict> verdicts_;
  std::vector<std::size_t> changed_;
  std::vector<double> applied_;
};

}  // namespace meridian::routing
