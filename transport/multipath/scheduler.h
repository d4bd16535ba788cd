// The multipath chunk scheduler: a pure function that puts the next chunk on the path
// expected to finish it first, and the per-path delivery-rate estimator it feeds on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace meridian::transport {

struct PathLoad {
  bool usable = false;                // alive and not stalled
  std::uint64_t queuedBytes = 0;      // assigned to the path and not yet acknowledged
  std::uint64_t windowBytes = 0;      // most bytes the path may hold unacknowledged
  double rateBytesPerSec = 0;         // measured delivery rate (> 0)
  double latencySec = 0;              // one-way delay estimate (0 when unknown)
  double weight = 1.0;                // routing preference (> 0; larger takes more)
};

struct PathChoice {
  std::size_t path = 0;
  bool hasRoom = false;  // false: the best path is full; wait for it rather than use a worse one
};

// The usable path with the earliest expected finish of a `chunkBytes` chunk,
// (queuedBytes + chunkBytes) / (rate * weight) + latency; ties go to the lower index.
// nullopt when no path is usable.
std::optional<PathChoice> pickPath(std::span<const PathLoad> paths, std::uint64_t chunkBytes);

// Static striping: the usable path that has been assigned the fewest bytes so far
// (`assignedBytes[i]`), whatever its rate; hasRoom says whether its window takes the chunk
// now. Ties go to the lower index. nullopt when no path is usable.
std::optional<PathChoice> pickPathEvenly(std::span<const PathLoad> paths, std::span<const std::uint64_t> assignedBytes,
                                         std::uint64_t chunkBytes);

// Delivery rate from acknowledged bytes, sampled over busy intervals of at least
// `minIntervalUs` and smoothed with an EWMA. Times in microseconds.
class RateEstimator {
 public:
  // A sample needs this many bytes: tiny messages measure latency, not rate.
  static constexpr std::uint64_t kMinSampleBytes = 64 * 1024;
  // No sample drives a path's rate below this, so a path is never written off by one.
  static constexpr double kMinRateBytesPerSec = 1e5;

  explicit RateEstimator(double initialBytesPerSec = 1e9, std::int64_t minIntervalUs = 5000)
      : rate_(initialBytesPerSec), minIntervalUs_(minIntervalUs) {}
  // The path went from idle to busy at `nowUs`.
  void onBusy(std::int64_t nowUs);
  // `bytes` were acknowledged at `nowUs`; `stillBusy` says whether bytes remain in flight.
  void onAcked(std::uint64_t bytes, std::int64_t nowUs, bool stillBusy);
  // Starts over from `bytesPerSec` (e.g. routing says a path recovered: give it a fair
  // chance and let new samples correct it).
  void reset(double bytesPerSec) {
    rate_ = bytesPerSec > kMinRateBytesPerSec ? bytesPerSec : kMinRateBytesPerSec;
    intervalStartUs_ = -1;
    intervalBytes_ = 0;
  }
  double bytesPerSec() const { return rate_; }
  bool measured() const { return samples_ > 0; }

 private:
  double rate_;
  std::int64_t minIntervalUs_;
  std::int64_t intervalStartUs_ = -1;
  std::uint64_t intervalBytes_ = 0;
  std::uint64_t samples_ = 0;
};

}  // namespace meridian::transport
