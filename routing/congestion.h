// Congestion detection for one path: queueing delay, loss and delivery-rate collapse, with
// hysteresis (separate enter and exit thresholds, and runs of consecutive samples) so that a
// path hovering near a threshold does not flap between states and make the planner re-plan.
#pragma once

#include <cstdint>
#include <string>

#include "routing/estimators.h"
#include "transport/channel.h"

namespace meridian::routing {

struct CongestionConfig {
  // Queueing delay (srtt - minRtt) enters congestion above max(enterQueueingUs,
  // enterQueueingFraction * minRtt). The absolute floor keeps short paths, where a few ms of
  // queue are harmless noise, from tripping; the fraction scales to long paths, where 5 ms is
  // nothing against 200 ms of propagation but a queue half as long as the path is real.
  double enterQueueingUs = 5000, enterQueueingFraction = 0.5;
  // Leaving needs the queue well below the entry mark, so a queue that hovers at the mark
  // stays congested instead of flapping.
  double exitQueueingUs = 2000, exitQueueingFraction = 0.2;
  // Loss over the estimator's window: 2% hurts TCP-like transfers badly; 0.5% is background.
  double enterLoss = 0.02, exitLoss = 0.005;
  // Delivery rate below this fraction of its recent peak (only when the sample gives a rate).
  // Exit uses the same mark; hysteresis comes from exitSamples and from the slowly decaying peak.
  // When the path is judged clear again the peak starts over from the rate it cleared with:
  // the rate a path comes back with is its new normal, so a path that recovered from a queue
  // at half its old rate is not sent straight back by the rate it already had when it cleared.
  double rateCollapse = 0.5;
  // The peak rate halves every this many microseconds without being matched, so a peak from a
  // quiet period long ago does not keep a path congested forever: a rate stuck at 20% of an
  // old peak counts as collapsed for about 40 s (1.3 half-lives), then as the new normal.
  double ratePeakHalfLifeUs = 30'000'000;
  // Consecutive samples needed to change state: entering fast (3) protects transfers soon,
  // leaving slowly (10) waits until the path has really recovered.
  int enterSamples = 3, exitSamples = 10;
};

enum class CongestionState { kClear, kCongested };

struct CongestionSample {
  std::int64_t nowUs = 0;
  PathFigures figures;
  // Measured while the path was busy (transport::RateEstimator); 0 = unknown, not judged.
  // An idle or application-limited path would look collapsed, so give no rate for those.
  double deliveryBytesPerSec = 0;
};

// The delivery rate to judge a path on, from its channel's figures now and the bytes it had
// sent `dtUs` earlier, or 0 (unknown, not judged) when the rate would say nothing about the
// path: dead, rate not yet measured, held below a neutral weight by routing (it is sent less
// than it could carry, so its rate is the sender's, not the path's), or it sent less than
// half of what its rate carries in the interval (idle or application-limited).
double busyDeliveryRate(const transport::PathStats& now, std::uint64_t bytesSentBefore, std::int64_t dtUs);

// Feeds on one sample at a time. A sample "signals congestion" when any trigger is over its
// entry mark and "signals clear" when every measure is under its exit mark; a sample in
// between breaks a run of either kind. Figures without an echo (valid == false) are not
// judged on queueing; their loss still counts (a path that echoes nothing loses everything).
class CongestionDetector {
 public:
  explicit CongestionDetector(CongestionConfig config = {});

  // Returns true when the state changed with this sample.
  bool update(const CongestionSample& sample);

  CongestionState state() const { return state_; }
  // Why the current state began: for kCongested the triggers of the sample that tipped it,
  // e.g. "queueing 23.4 ms over min RTT 78.0 ms; loss 4.0%"; for kClear after congestion the
  // figures that ended it, "clear: queueing 0.4 ms, loss 0.0%"; "" before any change.
  const std::string& reason() const { return reason_; }
  // When the current state began: the first sample's time until the state changes (0 before any sample).
  std::int64_t sinceUs() const { return sinceUs_; }
  // The decayed peak delivery rate as of the last sample that gave a rate (0 = none yet).
  double peakBytesPerSec() const { return peakBytesPerSec_; }

 private:
  CongestionConfig config_;
  CongestionState state_ = CongestionState::kClear;
  std::string reason_;
  bool anySample_ = false;
  std::int64_t sinceUs_ = 0;
  int run_ = 0;  // consecutive samples pointing at the other state
  double peakBytesPerSec_ = 0;
  std::int64_t peakAtUs_ = 0;
};

}  // namespace meridian::routing
