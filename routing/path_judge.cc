// Congestion from TCP_INFO figures (path_judge.h).
#include "routing/path_judge.h"

#include <algorithm>

#include "routing/path_monitor.h"

namespace meridian::routing {

PathJudge::PathJudge(CongestionConfig config) : config_(config) {}

std::optional<std::vector<double>> PathJudge::update(std::int64_t nowUs,
                                                       const std::vector<transport::PathStats>& paths) {
  changed_.clear();
  while (tracks_.size() < paths.size()) tracks_.push_back(Track{CongestionDetector(config_)});
  verdicts_.resize(tracks_.size());
  std::vector<CongestionState> liveStates;  // dead paths are no alternative to move traffic to
  std::vector<std::size_t> live;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const transport::PathStats& p = paths[i];
    Track& t = tracks_[i];
    if (p.alive && p.telemetry.rttUs >= 0) {
      // Totals are summed over the path's live streams: a stream that died takes its share
      // with it, so a total that went down starts a new baseline rather than a negative delta.
      const bool fresh = !t.seen || p.telemetry.unitsSent < t.unitsSent || p.telemetry.unitsResent < t.unitsResent;
      const std::uint64_t sent = fresh ? 0 : p.telemetry.unitsSent - t.unitsSent;
      const std::uint64_t resent = fresh ? 0 : p.telemetry.unitsResent - t.unitsResent;
      const bool judged = !fresh && sent > 0;
      const double rate = judged ? busyDeliveryRate(p, t.bytesSent, nowUs - t.judgedAtUs) : 0;
      if (fresh || sent > 0) {
        t.seen = true;
        t.unitsSent = p.telemetry.unitsSent;
        t.unitsResent = p.telemetry.unitsResent;
        t.bytesSent = p.bytesSent;
        t.judgedAtUs = nowUs;
      }
      if (judged) {
        // Loss and rate: figures without an echo (valid false) are not judged on queueing.
        PathFigures f;
        f.loss = std::min(1.0, static_cast<double>(resent) / static_cast<double>(sent));
        f.sent = t.unitsSent;
        if (t.detector.update(CongestionSample{nowUs, f, rate})) changed_.push_back(i);
        ++verdicts_[i].samples;
      }
    }
    verdicts_[i].state = t.detector.state();
    verdicts_[i].reason = t.detector.reason();
    if (p.alive) {
      live.push_back(i);
      liveStates.push_back(t.detector.state());
    }
  }
  std::vector<double> w(paths.size(), 1.0);
  const std::vector<double> liveWeights = weightsFor(liveStates);
  for (std::size_t k = 0; k < live.size(); ++k) w[live[k]] = liveWeights[k];
  if (applied_.size() != w.size()) applied_.assign(w.size(), 1.0);  // a channel starts neutral
  if (w == applied_) return std::nullopt;
  applied_ = w;
  return w;
}

}  // namespace meridian::routing
