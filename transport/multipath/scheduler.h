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
  // The path's rate is still a guess (no sample, and less than a cold window acknowledged:
  // a path that moves that much too fast to sample is not slow): it holds at most
  // windowBytes (the caller's cold window), and when that is full the chunk goes to the next
  // best path instead of waiting for it.
  bool cold = false;
};

struct PathChoice {
  std::size_t path = 0;
  bool hasRoom = false;  // false: the best path is full; wait for it rather than use a worse one
};

// The usable path with the earliest expected finish of a `chunkBytes` chunk,
// (queuedBytes + chunkBytes) / (rate * weight) + latency; ties go to the lower index. A cold
// path without room is passed over (hasRoom false on it only when no other path is left).
// nullopt when no path is usable.
std::optional<PathChoice> pickPath(std::span<const PathLoad> paths, std::uint64_t chunkBytes);

// Static striping: the usable path that has been assigned the fewest bytes so far
// (`assignedBytes[i]`), whatever its rate; hasRoom says whether its window takes the chunk
// now. Ties go to the lower index. nullopt when no path is usable.
std::optional<PathChoice> pickPathEvenly(std::span<const PathLoad> paths, std::span<const std::uint64_t> assignedBytes,
                                         std::uint64_t chunkBytes);

// What the rate estimator notes about a chunk as it goes onto a path (see RateEstimator).
struct RateStamp {
  std::uint64_t delivered = 0;   // the path's acknowledged bytes when the chunk was sent
  std::int64_t deliveredUs = 0;  // when the last of those was acknowledged (or the flight began)
  std::int64_t firstSentUs = 0;  // when the first chunk of this sample's send interval went out
  std::int64_t sentUs = 0;       // when this chunk went out; 0 = not written on its path yet
  double rateBytesPerSec = 0;    // the path's rate then, which its share of chunks was cut by
};

// A path's delivery rate, sampled per acknowledged chunk as TCP samples its own (Linux's
// tcp_rate.c, after Cheng et al.'s delivery-rate estimation draft): a chunk's sample is the
// bytes acknowledged while it was in flight, over the longer of its ack interval (now minus
// the last acknowledgement before it went out) and its send interval. Taking the longer one
// means that acknowledgements arriving in a bunch (queued behind data going the other way on
// the same stream, or behind a slow reader) cannot inflate the rate, and a flight that starts
// after an idle period starts its intervals afresh, so idle time does not deflate it.
// Samples are smoothed with an EWMA. A flight too small to sample still proves a floor (its
// bytes over its interval): an estimate below it is raised to it, so a path that was slow
// and is kept short for it wins its share back once it is fast again. Times in microseconds.
//
// A sample cannot show more than the path was given: bytes in flight over a round trip. Where
// the round trip is not set by the path's own capacity (loopback, a receiver's progress thread
// shared by all paths, a window below the bandwidth-delay product), a path the scheduler keeps
// short measures the share it was given, and the share follows the measure: samples alone never
// earn it more. probe() is for that case (issue 24).
class RateEstimator {
 public:
  // A sample needs this many bytes: tiny messages measure latency, not rate.
  static constexpr std::uint64_t kMinSampleBytes = 64 * 1024;
  // No sample drives a path's rate below this, so a path is never written off by one.
  static constexpr double kMinRateBytesPerSec = 1e5;

  explicit RateEstimator(double initialBytesPerSec = 1e9, std::int64_t minIntervalUs = 5000)
      : rate_(initialBytesPerSec), minIntervalUs_(minIntervalUs) {}
  // A chunk goes onto the path at `nowUs`; `idle` says nothing was in flight before it.
  // The caller keeps the stamp with the chunk and hands it back with its acknowledgement.
  RateStamp onSent(std::int64_t nowUs, bool idle);
  // The chunk `stamp` was given for, `bytes` long, was acknowledged at `nowUs`.
  void onAcked(std::uint64_t bytes, const RateStamp& stamp, std::int64_t nowUs);
  // Starts over from `bytesPerSec` (e.g. routing says a path recovered: give it a fair
  // chance and let new samples correct it).
  void reset(double bytesPerSec) {
    rate_ = bytesPerSec > kMinRateBytesPerSec ? bytesPerSec : kMinRateBytesPerSec;
    probeCeiling_ = 0;
  }
  // Starts over from `fromBytesPerSec` and probes upward, as slow start does, for a path whose
  // estimate was made while routing kept it short. A sample that shows the path delivering at
  // least kProbeKeepUp of the rate its chunk was sent at lets the rate go to kProbeGain times
  // that rate (so it doubles once a round trip while the path keeps up), up to
  // `ceilingBytesPerSec` (e.g. the best path's). kProbeShortRounds round trips in a row in
  // which no sample keeps up end the probe at the best they measured. While probing, samples
  // are not smoothed in; once the ceiling is reached they are again, except those of chunks
  // sent before, which only measure the probe's smaller shares. No probe when `from` is
  // already at the ceiling.
  void probe(double fromBytesPerSec, double ceilingBytesPerSec);
  bool probing() const { return probeCeiling_ > 0; }
  static constexpr double kProbeGain = 2;
  static constexpr double kProbeKeepUp = 0.5;
  static constexpr int kProbeShortRounds = 2;
  double bytesPerSec() const { return rate_; }
  bool measured() const { return samples_ > 0; }
  // Bytes acknowledged on the path so far.
  std::uint64_t deliveredBytes() const { return delivered_; }

 private:
  double rate_;
  std::int64_t minIntervalUs_;
  std::uint64_t delivered_ = 0;
  std::int64_t deliveredUs_ = 0;
  std::int64_t firstSentUs_ = 0;
  std::uint64_t samples_ = 0;
  // Probing (probe()): the ceiling (0: not probing); the current round trip: where it began
  // (delivered bytes) and what it measured; the short rounds in a row and the best they
  // measured; and, once a probe reached its ceiling, the delivered bytes before which a
  // chunk's sample is not smoothed in.
  void onProbeAck(const RateStamp& stamp, std::int64_t intervalUs, std::uint64_t inFlight);
  double probeCeiling_ = 0;
  std::uint64_t roundStart_ = 0;
  bool roundMeasured_ = false;
  bool roundKeptUp_ = false;
  double roundBest_ = 0;
  int shortRounds_ = 0;
  double shortBest_ = 0;
  std::uint64_t settledFrom_ = 0;
};

}  // namespace meridian::transport
