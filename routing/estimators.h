// Per-path figures from probe echoes: smoothed RTT and its variation, windowed minimum RTT,
// jitter and loss. The estimator is pure: the caller feeds it sends, echoes and the time, so
// the same recorded sequence always gives the same figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace meridian::routing {

struct PathFigures {
  bool valid = false;  // at least one echo: the RTT figures mean something
  double srttUs = 0;     // smoothed RTT, RFC 6298 (gain 1/8)
  double rttvarUs = 0;   // RTT variation, RFC 6298 (gain 1/4)
  double minRttUs = 0;   // smallest RTT echoed within the min-RTT window
  double lastRttUs = 0;  // the latest echo's RTT
  double jitterUs = 0;   // RFC 3550 style: smoothed |rtt_i - rtt_{i-1}| over consecutive echoes (gain 1/16)
  double loss = 0;       // lost / resolved over the last lossWindow resolved probes, 0..1
  std::uint64_t sent = 0, received = 0;  // totals since construction (received: echoes accepted)
  // The latest resolutions in a row that were losses, or echoes (one of the two is 0): a path
  // that echoes nothing any more is down, not congested (PathMonitor).
  std::uint64_t lostInARow = 0, echoedInARow = 0;

  // Delay spent in queues: srtt above the propagation floor (minRtt), never negative.
  double queueingUs() const;
};

// One path to one peer. Probe sequence numbers must increase; times are microseconds of one
// monotonic clock.
//
// RTT: RFC 6298 smoothing (the first echo sets srtt = R, rttvar = R/2).
// Min RTT: the minimum over echoes of the last minRttWindowUs, kept in a monotonic deque
//   (O(1) amortised). When no echo falls inside the window the latest echo stands in for it,
//   so the figure follows a path whose propagation delay changed rather than freezing.
// Jitter: RFC 3550's interarrival-jitter filter applied to consecutive RTTs,
//   J += (|rtt_i - rtt_{i-1}| - J) / 16. rttvar is reported beside it, so jitter measures
//   something rttvar does not: the echo-to-echo wobble, which a slow srtt drift does not inflate.
// Loss: each probe resolves once, as echoed or as lost (timed out in expire() or dropped from
//   the outstanding set when it is full); loss is the lost fraction of the last lossWindow
//   resolutions. Probes still outstanding do not count either way.
// Late echoes (the probe was already counted lost), duplicates and unknown seqs are ignored:
//   a probe is counted once, and its lateness was already reported as loss.
class PathEstimator {
 public:
  // The most probes kept outstanding; sending one more drops the oldest as lost. At the usual
  // probe rates (tens a second) 1024 covers far longer than any sane timeout.
  static constexpr std::size_t kMaxOutstanding = 1024;
  // The most echoes kept for the min-RTT window. The monotonic deque only grows while RTTs keep
  // rising; past this many the oldest minimum goes, which shortens the window rather than
  // letting memory grow with the probe rate.
  static constexpr std::size_t kMaxMinRttSamples = 4096;

  explicit PathEstimator(std::int64_t minRttWindowUs = 10'000'000, std::size_t lossWindow = 100);

  // Probe `seq` left at `nowUs`. A seq not above the previous one is ignored: it is a caller
  // bug (or a wrap), and accepting it would make echoes ambiguous.
  void onProbeSent(std::uint64_t seq, std::int64_t nowUs);
  // An echo for `seq` arrived; echoes of unknown, duplicate or too-old seqs are ignored (return false).
  bool onEcho(std::uint64_t seq, std::int64_t nowUs);
  // Marks probes older than timeoutUs (nowUs - sent > timeoutUs) without echo as lost.
  void expire(std::int64_t nowUs, std::int64_t timeoutUs);

  PathFigures figures(std::int64_t nowUs) const;

  // Probes tracked for echo matching (outstanding ones, plus answered ones behind an older
  // outstanding one); at most kMaxOutstanding.
  std::size_t tracked() const { return outstanding_.size(); }

 private:
  struct Probe {
    std::uint64_t seq;
    std::int64_t sentUs;
    bool echoed;  // answered but kept so the deque stays in send order; popped once at the front
  };
  struct RttSample {
    std::int64_t atUs;
    double rttUs;
  };

  void recordOutcome(bool lost);
  void popResolvedFront();

  std::int64_t minRttWindowUs_;
  std::deque<Probe> outstanding_;  // send order, so seqs increase: binary search on echo
  bool anySent_ = false;
  std::uint64_t lastSeq_ = 0;

  std::deque<RttSample> minRtt_;  // times increase and RTTs increase front to back

  std::vector<std::uint8_t> outcomes_;  // ring of the last lossWindow resolutions, 1 = lost
  std::size_t outcomeNext_ = 0;
  std::size_t outcomeCount_ = 0;
  std::size_t lostInWindow_ = 0;
  std::uint64_t lostInARow_ = 0, echoedInARow_ = 0;

  bool haveRtt_ = false;
  double srttUs_ = 0, rttvarUs_ = 0, lastRttUs_ = 0, jitterUs_ = 0;
  std::uint64_t sent_ = 0, received_ = 0;
};

}  // namespace meridian::routing
