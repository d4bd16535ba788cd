// Path figures from recorded probe sequences: RFC 6298 smoothing, the sliding min-RTT window,
// jitter, loss counting (late, duplicate and unknown echoes) and the memory bounds.
#include <gtest/gtest.h>

#include <cstdint>

#include "routing/estimators.h"

namespace meridian::routing {
namespace {

constexpr std::int64_t kMs = 1000;
constexpr std::int64_t kSec = 1'000'000;

// Sends `seq` at `sentUs` and echoes it `rttUs` later.
void probe(PathEstimator& e, std::uint64_t seq, std::int64_t sentUs, std::int64_t rttUs) {
  e.onProbeSent(seq, sentUs);
  ASSERT_TRUE(e.onEcho(seq, sentUs + rttUs));
}

TEST(PathEstimatorTest, NoEchoYetMeansInvalidFigures) {
  PathEstimator e;
  e.onProbeSent(1, 0);
  PathFigures f = e.figures(10 * kMs);
  EXPECT_FALSE(f.valid);
  EXPECT_EQ(f.sent, 1u);
  EXPECT_EQ(f.received, 0u);
  EXPECT_EQ(f.loss, 0.0);  // outstanding, not yet lost
}

TEST(PathEstimatorTest, SmoothsRttAsRfc6298AndJitterAsRfc3550) {
  PathEstimator e;
  probe(e, 1, 0, 100 * kMs);
  PathFigures f = e.figures(1 * kSec);
  ASSERT_TRUE(f.valid);
  EXPECT_DOUBLE_EQ(f.srttUs, 100000);   // first sample: srtt = R
  EXPECT_DOUBLE_EQ(f.rttvarUs, 50000);  // rttvar = R / 2
  EXPECT_DOUBLE_EQ(f.jitterUs, 0);

  probe(e, 2, 1 * kSec, 200 * kMs);
  f = e.figures(2 * kSec);
  EXPECT_DOUBLE_EQ(f.rttvarUs, 62500);  // 3/4 * 50000 + 1/4 * |100000 - 200000|, from the old srtt
  EXPECT_DOUBLE_EQ(f.srttUs, 112500);   // 7/8 * 100000 + 1/8 * 200000
  EXPECT_DOUBLE_EQ(f.jitterUs, 6250);   // |200000 - 100000| / 16

  probe(e, 3, 2 * kSec, 80 * kMs);
  f = e.figures(3 * kSec);
  EXPECT_DOUBLE_EQ(f.rttvarUs, 55000);      // 3/4 * 62500 + 1/4 * |112500 - 80000|
  EXPECT_DOUBLE_EQ(f.srttUs, 108437.5);     // 7/8 * 112500 + 1/8 * 80000
  EXPECT_DOUBLE_EQ(f.jitterUs, 13359.375);  // 6250 + (120000 - 6250) / 16
  EXPECT_DOUBLE_EQ(f.lastRttUs, 80000);
  EXPECT_DOUBLE_EQ(f.minRttUs, 80000);
  EXPECT_DOUBLE_EQ(f.queueingUs(), 28437.5);
  EXPECT_EQ(f.sent, 3u);
  EXPECT_EQ(f.received, 3u);
}

TEST(PathEstimatorTest, QueueingIsNeverNegative) {
  PathFigures f;
  f.srttUs = 50;
  f.minRttUs = 80;
  EXPECT_EQ(f.queueingUs(), 0.0);
}

TEST(PathEstimatorTest, MinRttSlidesOutOfTheWindow) {
  PathEstimator e(1 * kSec);
  probe(e, 1, 0, 10 * kMs);  // echoed at 10 ms
  for (std::uint64_t i = 2; i <= 8; ++i) probe(e, i, static_cast<std::int64_t>(i) * 100 * kMs, 30 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(900 * kMs).minRttUs, 10000);
  // Just inside, then just outside the window, with no new echo: figures() ages it itself.
  EXPECT_DOUBLE_EQ(e.figures(1010 * kMs).minRttUs, 10000);
  EXPECT_DOUBLE_EQ(e.figures(1010 * kMs + 1).minRttUs, 30000);
  // A smaller RTT counts at once.
  probe(e, 9, 1100 * kMs, 20 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(1200 * kMs).minRttUs, 20000);
  // It ages out in turn, leaving the larger echo that came after it (the 30 ms ones came
  // before the 20 ms one, so they can never be the minimum again and are gone).
  probe(e, 10, 1500 * kMs, 40 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(2000 * kMs).minRttUs, 20000);
  EXPECT_DOUBLE_EQ(e.figures(2120 * kMs + 1).minRttUs, 40000);
}

TEST(PathEstimatorTest, MinRttFallsBackToTheLatestEchoWhenTheWindowIsEmpty) {
  PathEstimator e(1 * kSec);
  probe(e, 1, 0, 10 * kMs);
  probe(e, 2, 100 * kMs, 50 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(500 * kMs).minRttUs, 10000);
  // Both echoes are older than the window: the latest one stands in, not the stale minimum.
  EXPECT_DOUBLE_EQ(e.figures(10 * kSec).minRttUs, 50000);
}

TEST(PathEstimatorTest, CountsTimedOutProbesAsLost) {
  PathEstimator e(10 * kSec, 10);
  for (std::uint64_t i = 0; i < 10; ++i) e.onProbeSent(i, static_cast<std::int64_t>(i) * kMs);
  for (std::uint64_t i : {0, 1, 2, 4, 5, 7, 9}) EXPECT_TRUE(e.onEcho(i, 100 * kMs));
  // Probe 3 went out at 3 ms: not lost at exactly the timeout, lost just after.
  e.expire(503 * kMs, 500 * kMs);
  EXPECT_EQ(e.figures(503 * kMs).loss, 0.0);
  EXPECT_EQ(e.figures(503 * kMs).echoedInARow, 7u);
  e.expire(508 * kMs + 1, 500 * kMs);
  EXPECT_EQ(e.tracked(), 0u);
  PathFigures f = e.figures(600 * kMs);
  EXPECT_DOUBLE_EQ(f.loss, 0.3);
  EXPECT_EQ(f.sent, 10u);
  EXPECT_EQ(f.received, 7u);
  EXPECT_EQ(f.lostInARow, 3u) << "probes 3, 6 and 8 timed out after the last echo";
  EXPECT_EQ(f.echoedInARow, 0u);
  e.onProbeSent(10, 600 * kMs);
  ASSERT_TRUE(e.onEcho(10, 610 * kMs));
  EXPECT_EQ(e.figures(610 * kMs).lostInARow, 0u) << "one echo ends the run of losses";
  EXPECT_EQ(e.figures(610 * kMs).echoedInARow, 1u);
}

TEST(PathEstimatorTest, IgnoresLateDuplicateAndUnknownEchoes) {
  PathEstimator e(10 * kSec, 10);
  for (std::uint64_t i = 0; i < 10; ++i) e.onProbeSent(i, 0);
  for (std::uint64_t i = 0; i < 7; ++i) EXPECT_TRUE(e.onEcho(i, 20 * kMs));
  EXPECT_FALSE(e.onEcho(3, 25 * kMs)) << "duplicate";
  EXPECT_FALSE(e.onEcho(42, 25 * kMs)) << "never sent";
  e.expire(1 * kSec, 500 * kMs);  // 7, 8, 9 lost
  EXPECT_FALSE(e.onEcho(8, 1100 * kMs)) << "late: already counted lost";
  PathFigures f = e.figures(2 * kSec);
  EXPECT_EQ(f.received, 7u);
  EXPECT_DOUBLE_EQ(f.loss, 0.3);
  // The late echo did not feed the RTT either: 1.1 s would have moved srtt off 20 ms.
  EXPECT_DOUBLE_EQ(f.srttUs, 20000);
  EXPECT_DOUBLE_EQ(f.lastRttUs, 20000);
}

TEST(PathEstimatorTest, LossCoversOnlyTheLastWindowOfProbes) {
  PathEstimator e(10 * kSec, 10);
  for (std::uint64_t i = 0; i < 10; ++i) e.onProbeSent(i, 0);
  for (std::uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(e.onEcho(i, 10 * kMs));
  e.expire(1 * kSec, 500 * kMs);
  ASSERT_DOUBLE_EQ(e.figures(1 * kSec).loss, 0.3);
  // Five clean probes push five echoes out of the window; the three losses remain.
  for (std::uint64_t i = 10; i < 15; ++i) probe(e, i, 2 * kSec, 10 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(3 * kSec).loss, 0.3);
  // Five more push the losses out.
  for (std::uint64_t i = 15; i < 20; ++i) probe(e, i, 3 * kSec, 10 * kMs);
  EXPECT_DOUBLE_EQ(e.figures(4 * kSec).loss, 0.0);
  EXPECT_EQ(e.figures(4 * kSec).sent, 20u);
}

TEST(PathEstimatorTest, EchoesOutOfOrderAreMatchedAndReleased) {
  PathEstimator e;
  for (std::uint64_t i = 1; i <= 3; ++i) e.onProbeSent(i * 10, 0);
  EXPECT_TRUE(e.onEcho(30, 5 * kMs));
  EXPECT_EQ(e.tracked(), 3u);  // 30 is answered but waits behind the older 10 and 20
  EXPECT_TRUE(e.onEcho(20, 6 * kMs));
  EXPECT_FALSE(e.onEcho(25, 6 * kMs));
  EXPECT_TRUE(e.onEcho(10, 7 * kMs));
  EXPECT_EQ(e.tracked(), 0u);
  EXPECT_EQ(e.figures(8 * kMs).received, 3u);
  EXPECT_DOUBLE_EQ(e.figures(8 * kMs).minRttUs, 5000);
}

TEST(PathEstimatorTest, IgnoresANonIncreasingSeq) {
  PathEstimator e;
  e.onProbeSent(5, 0);
  e.onProbeSent(5, 1 * kMs);
  e.onProbeSent(4, 2 * kMs);
  EXPECT_EQ(e.figures(3 * kMs).sent, 1u);
  // Seq 5 still maps to its first send.
  ASSERT_TRUE(e.onEcho(5, 10 * kMs));
  EXPECT_DOUBLE_EQ(e.figures(10 * kMs).lastRttUs, 10000);
}

TEST(PathEstimatorTest, CapsOutstandingProbesDroppingTheOldestAsLost) {
  PathEstimator e(10 * kSec, 1000);
  const std::uint64_t extra = 76;
  for (std::uint64_t i = 0; i < PathEstimator::kMaxOutstanding + extra; ++i) {
    e.onProbeSent(i, static_cast<std::int64_t>(i));
  }
  EXPECT_EQ(e.tracked(), PathEstimator::kMaxOutstanding);
  PathFigures f = e.figures(1 * kSec);
  EXPECT_EQ(f.sent, PathEstimator::kMaxOutstanding + extra);
  EXPECT_DOUBLE_EQ(f.loss, 1.0);
  EXPECT_FALSE(e.onEcho(extra - 1, 1 * kSec)) << "dropped as lost";
  EXPECT_TRUE(e.onEcho(extra, 1 * kSec)) << "oldest still tracked";
  EXPECT_DOUBLE_EQ(e.figures(1 * kSec).loss, static_cast<double>(extra) / static_cast<double>(extra + 1));
  // It stays bounded however long nobody answers.
  for (std::uint64_t i = 0; i < 5000; ++i) e.onProbeSent(10'000 + i, 2 * kSec);
  EXPECT_EQ(e.tracked(), PathEstimator::kMaxOutstanding);
}

TEST(PathEstimatorTest, SteadilyRisingRttsKeepTheMinimumWithinTheCap) {
  // Every echo is larger than the last, so none leaves the monotonic deque by domination; the
  // cap then drops the oldest minimum rather than growing without bound.
  PathEstimator e(3600 * kSec);
  const auto n = static_cast<std::int64_t>(PathEstimator::kMaxMinRttSamples) + 10;
  for (std::int64_t i = 0; i < n; ++i) probe(e, static_cast<std::uint64_t>(i), i * kMs, 1000 + i);
  // The 10 oldest (smallest) were dropped: the minimum is the 11th sample's.
  EXPECT_DOUBLE_EQ(e.figures(n * kMs).minRttUs, 1010);
}

}  // namespace
}  // namespace meridian::routing
