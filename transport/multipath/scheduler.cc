// Chunk scheduling and rate estimation.
#include "transport/multipath/scheduler.h"

#include <algorithm>
#include <limits>

namespace meridian::transport {

std::optional<PathChoice> pickPath(std::span<const PathLoad> paths, std::uint64_t chunkBytes) {
  std::optional<PathChoice> best;
  std::optional<std::size_t> fullCold;
  double bestFinish = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const PathLoad& p = paths[i];
    if (!p.usable || p.rateBytesPerSec <= 0 || p.weight <= 0) continue;
    const bool room = p.queuedBytes + chunkBytes <= p.windowBytes || p.queuedBytes == 0;
    if (p.cold && !room) {
      if (!fullCold) fullCold = i;
      continue;
    }
    double finish = static_cast<double>(p.queuedBytes + chunkBytes) / (p.rateBytesPerSec * p.weight) + p.latencySec;
    if (finish < bestFinish) {
      bestFinish = finish;
      best = PathChoice{i, room};
    }
  }
  if (!best && fullCold) return PathChoice{*fullCold, false};
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

RateStamp RateEstimator::onSent(std::int64_t nowUs, bool idle) {
  if (idle) {
    // A new flight: neither the idle time before it nor an old send time belongs in its
    // intervals.
    deliveredUs_ = nowUs;
    firstSentUs_ = nowUs;
  }
  return RateStamp{delivered_, deliveredUs_, firstSentUs_, nowUs, rate_};
}

void RateEstimator::onAcked(std::uint64_t bytes, const RateStamp& stamp, std::int64_t nowUs) {
  delivered_ += bytes;
  deliveredUs_ = nowUs;
  firstSentUs_ = stamp.sentUs;  // the next samples' send intervals start where this chunk's ended
  const std::int64_t interval = std::max(stamp.sentUs - stamp.firstSentUs, nowUs - stamp.deliveredUs);
  const std::uint64_t inFlight = delivered_ - stamp.delivered;
  if (probing()) {
    onProbeAck(stamp, interval, inFlight);
    return;
  }
  if (stamp.delivered < settledFrom_) return;  // sent during a probe: measures its smaller share
  if (interval < minIntervalUs_ || inFlight < kMinSampleBytes) {
    // Too little to measure a rate on, but enough to prove a floor: the path delivered
    // `inFlight` bytes within the interval (a shorter one counts as the shortest). An estimate
    // under that floor is stale, made while the path was slower: it is raised to the floor,
    // and the larger share that buys is then measured properly. Never lowered this way.
    if (samples_ > 0) {
      const double floor =
          static_cast<double>(inFlight) * 1e6 / static_cast<double>(std::max(interval, minIntervalUs_));
      rate_ = std::max(rate_, floor);
    }
    return;
  }
  double sample = std::max(kMinRateBytesPerSec, static_cast<double>(inFlight) * 1e6 / static_cast<double>(interval));
  rate_ = samples_ == 0 ? sample : 0.75 * rate_ + 0.25 * sample;
  ++samples_;
}

void RateEstimator::probe(double fromBytesPerSec, double ceilingBytesPerSec) {
  reset(fromBytesPerSec);
  if (rate_ >= ceilingBytesPerSec) return;
  probeCeiling_ = ceilingBytesPerSec;
  roundStart_ = delivered_;
  roundMeasured_ = roundKeptUp_ = false;
  roundBest_ = shortBest_ = 0;
  shortRounds_ = 0;
}

void RateEstimator::onProbeAck(const RateStamp& stamp, std::int64_t intervalUs, std::uint64_t inFlight) {
  // Round trips only end a probe that fails. One ends when a chunk sent after it began is
  // acknowledged, and that chunk's sample belongs to the next one: the first acknowledgements
  // of a bunch, which cover only themselves, never make up a round of their own.
  if (stamp.delivered >= roundStart_) {
    roundStart_ = delivered_;
    if (roundMeasured_ && !roundKeptUp_) {
      shortBest_ = std::max(shortBest_, roundBest_);
      if (++shortRounds_ >= kProbeShortRounds) {
        rate_ = std::max(kMinRateBytesPerSec, shortBest_);  // what the path showed it carries
        probeCeiling_ = 0;
        return;
      }
    } else if (roundMeasured_) {
      shortRounds_ = 0;
      shortBest_ = 0;
    }
    roundMeasured_ = roundKeptUp_ = false;
    roundBest_ = 0;
  }
  if (inFlight < kMinSampleBytes) return;
  // A flight quicker than the shortest interval counts as that long: a lower bound, which is
  // all a probe needs.
  const double sample =
      static_cast<double>(inFlight) * 1e6 / static_cast<double>(std::max(intervalUs, minIntervalUs_));
  ++samples_;
  roundMeasured_ = true;
  roundBest_ = std::max(roundBest_, sample);
  if (sample < kProbeKeepUp * stamp.rateBytesPerSec) return;
  // It carried what its share at that rate gave it: it may have twice that share. Relative to
  // the chunk's rate, not the current one, so a flight raises the rate once however many
  // samples it gives.
  roundKeptUp_ = true;
  rate_ = std::max(rate_, std::min(kProbeGain * stamp.rateBytesPerSec, probeCeiling_));
  if (rate_ >= probeCeiling_) {
    probeCeiling_ = 0;
    settledFrom_ = delivered_;
  }
}

}  // namespace meridian::transport
