// Chunk scheduling and rate estimation.
#include "transport/multipath/scheduler.h"

#include <algorithm>
#include <limits>

namespace meridian::transport {

std::optional<PathChoice> pickPath(std::span<const PathLoad> paths, std::uint64_t chunkBytes) {
  std::optional<PathChoice> best;
  double bestFinish = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const PathLoad& p = paths[i];
    if (!p.usable || p.rateBytesPerSec <= 0 || p.weight <= 0) continue;
    double finish = static_cast<double>(p.queuedBytes + chunkBytes) / (p.rateBytesPerSec * p.weight) + p.latencySec;
    if (finish < bestFinish) {
      bestFinish = finish;
      best = PathChoice{i, p.queuedBytes + chunkBytes <= p.windowBytes || p.queuedBytes == 0};
    }
  }
  return best;
}

std::optional<PathChoice> pickPathEvenly(std::span<const PathLoad> paths, std::span<const std::uint64_t> assignedBytes,
                                         std::uint64_t chunkBytes) {
  std::optional<PathChoice> best;
  std::uint64_t fewest = 0;
  for (std::size_t i = 0; i < paths.size() && i < assignedBytes.size(); ++i) {
    const PathLoad& p = paths[i];
    if (!p.usable) continue;
    if (!best || assignedBytes[i] < fewest) {
      fewest = assignedBytes[i];
      best = PathChoice{i, p.queuedBytes + chunkBytes <= p.windowBytes || p.queuedBytes == 0};
    }
  }
  return best;
}

void RateEstimator::onBusy(std::int64_t nowUs) {
  if (intervalStartUs_ < 0) {
    intervalStartUs_ = nowUs;
    intervalBytes_ = 0;
  }
}

void RateEstimator::onAcked(std::uint64_t bytes, std::int64_t nowUs, bool stillBusy) {
  if (intervalStartUs_ < 0) intervalStartUs_ = nowUs;
  intervalBytes_ += bytes;
  std::int64_t elapsed = nowUs - intervalStartUs_;
  if (elapsed >= minIntervalUs_ && intervalBytes_ >= kMinSampleBytes) {
    double sample = std::max(kMinRateBytesPerSec, static_cast<double>(intervalBytes_) * 1e6 / static_cast<double>(elapsed));
    rate_ = samples_ == 0 ? sample : 0.75 * rate_ + 0.25 * sample;
    ++samples_;
    intervalStartUs_ = stillBusy ? nowUs : -1;
    intervalBytes_ = 0;
  } else if (!stillBusy && elapsed >= minIntervalUs_) {
    // A long interval with too few bytes to measure (small or zero-byte messages): it
    // says nothing about the rate.
    intervalStartUs_ = -1;
    intervalBytes_ = 0;
  } else if (!stillBusy) {
    // Too short to measure: drop the partial interval rather than bias the rate.
    intervalStartUs_ = -1;
    intervalBytes_ = 0;
  }
}

}  // namespace meridian::transport
