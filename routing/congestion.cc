// Congestion detection with hysteresis.
#include "routing/congestion.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace meridian::routing {
namespace {

// Rates for people: enough digits to compare, no more.
std::string formatRate(double bytesPerSec) {
  if (bytesPerSec >= 1e9) return fmt::format("{:.1f} GB/s", bytesPerSec / 1e9);
  if (bytesPerSec >= 10e6) return fmt::format("{:.0f} MB/s", bytesPerSec / 1e6);
  if (bytesPerSec >= 1e6) return fmt::format("{:.1f} MB/s", bytesPerSec / 1e6);
  return fmt::format("{:.0f} kB/s", bytesPerSec / 1e3);
}

void appendReason(std::string& out, const std::string& part) {
  if (!out.empty()) out += "; ";
  out += part;
}

}  // namespace

double busyDeliveryRate(const transport::PathStats& now, std::uint64_t bytesSentBefore, std::int64_t dtUs) {
  if (!now.alive || !(now.rateBytesPerSec > 0) || now.weight < 1.0 || dtUs <= 0 || now.bytesSent < bytesSentBefore) {
    return 0;
  }
  const double sent = static_cast<double>(now.bytesSent - bytesSentBefore);
  const double carries = now.rateBytesPerSec * static_cast<double>(dtUs) / 1e6;
  return sent >= 0.5 * carries ? now.rateBytesPerSec : 0;
}

CongestionDetector::CongestionDetector(CongestionConfig config) : config_(config) {
  // A run shorter than one sample means nothing; treat it as the most eager setting.
  config_.enterSamples = std::max(config_.enterSamples, 1);
  config_.exitSamples = std::max(config_.exitSamples, 1);
}

bool CongestionDetector::update(const CongestionSample& sample) {
  const PathFigures& f = sample.figures;
  if (!anySample_) {
    anySample_ = true;
    sinceUs_ = sample.nowUs;
  }

  // Rate peak: decay the old one to now, then let this sample raise it.
  double rate = sample.deliveryBytesPerSec;
  bool rateCollapsed = false;
  if (rate > 0) {
    if (peakBytesPerSec_ > 0 && config_.ratePeakHalfLifeUs > 0) {
      double dt = static_cast<double>(std::max<std::int64_t>(sample.nowUs - peakAtUs_, 0));
      peakBytesPerSec_ *= std::exp2(-dt / config_.ratePeakHalfLifeUs);
    }
    peakBytesPerSec_ = std::max(peakBytesPerSec_, rate);
    peakAtUs_ = sample.nowUs;
    rateCollapsed = rate < config_.rateCollapse * peakBytesPerSec_;
  }

  double queueing = f.valid ? f.queueingUs() : 0.0;
  double enterQueue = std::max(config_.enterQueueingUs, config_.enterQueueingFraction * f.minRttUs);
  double exitQueue = std::max(config_.exitQueueingUs, config_.exitQueueingFraction * f.minRttUs);

  std::string triggers;
  if (f.valid && queueing > enterQueue) {
    appendReason(triggers, fmt::format("queueing {:.1f} ms over min RTT {:.1f} ms", queueing / 1e3, f.minRttUs / 1e3));
  }
  if (f.loss > config_.enterLoss) appendReason(triggers, fmt::format("loss {:.1f}%", f.loss * 100));
  if (rateCollapsed) {
    appendReason(triggers, fmt::format("delivery rate {}, {:.0f}% of its {} peak", formatRate(rate),
                                       rate / peakBytesPerSec_ * 100, formatRate(peakBytesPerSec_)));
  }
  bool signalsCongestion = !triggers.empty();
  bool signalsClear = queueing < exitQueue && f.loss < config_.exitLoss && !rateCollapsed;

  bool towardOther = state_ == CongestionState::kClear ? signalsCongestion : signalsClear;
  run_ = towardOther ? run_ + 1 : 0;
  int needed = state_ == CongestionState::kClear ? config_.enterSamples : config_.exitSamples;
  if (run_ < needed) return false;

  run_ = 0;
  sinceUs_ = sample.nowUs;
  if (state_ == CongestionState::kClear) {
    state_ = CongestionState::kCongested;
    reason_ = triggers;
  } else {
    state_ = CongestionState::kClear;
    reason_ = fmt::format("clear: queueing {:.1f} ms, loss {:.1f}%", queueing / 1e3, f.loss * 100);
    if (rate > 0) reason_ += fmt::format(", delivery rate {}", formatRate(rate));
    peakBytesPerSec_ = rate;  // the new normal (CongestionConfig::rateCollapse)
    peakAtUs_ = sample.nowUs;
  }
  return true;
}

}  // namespace meridian::routing
