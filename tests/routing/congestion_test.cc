// The congestion detector: hysteresis (entry and exit marks, runs of samples), the queueing,
// loss and rate-collapse triggers, the decaying rate peak and the reason texts.
#include <gtest/gtest.h>

#include "tests/common/noise.h"

#include <cstdint>
#include <vector>

#include "routing/congestion.h"

namespace meridian::routing {
namespace {

constexpr std::int64_t kMs = 1000;
constexpr std::int64_t kSec = 1'000'000;

PathFigures figs(double minRttMs, double queueingMs, double loss = 0) {
  PathFigures f;
  f.valid = true;
  f.minRttUs = minRttMs * 1000;
  f.srttUs = (minRttMs + queueingMs) * 1000;
  f.lastRttUs = f.srttUs;
  f.loss = loss;
  return f;
}

CongestionSample at(std::int64_t nowUs, PathFigures f, double rate = 0) { return CongestionSample{nowUs, f, rate}; }

using Noise = meridian::testing::Noise;

// Feeds queueing delays (ms) on a 30 ms path, one sample each 100 ms; returns the number of state changes.
int transitions(CongestionDetector& d, const std::vector<double>& queueingMs) {
  int changes = 0;
  std::int64_t t = 0;
  for (double q : queueingMs) {
    t += 100 * kMs;
    if (d.update(at(t, figs(30, q)))) ++changes;
  }
  return changes;
}

TEST(CongestionDetectorTest, StartsClearSinceTheFirstSample) {
  CongestionDetector d;
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_FALSE(d.update(at(5 * kSec, figs(30, 1))));
  EXPECT_EQ(d.sinceUs(), 5 * kSec);
  EXPECT_EQ(d.reason(), "");
}

TEST(CongestionDetectorTest, EnteringNeedsEnterSamplesInARow) {
  CongestionDetector d;  // 30 ms path: entry mark max(5 ms, 15 ms) = 15 ms
  EXPECT_FALSE(d.update(at(1 * kSec, figs(30, 23.4))));
  EXPECT_FALSE(d.update(at(2 * kSec, figs(30, 23.4))));
  EXPECT_FALSE(d.update(at(3 * kSec, figs(30, 10))));  // breaks the run
  EXPECT_FALSE(d.update(at(4 * kSec, figs(30, 23.4))));
  EXPECT_FALSE(d.update(at(5 * kSec, figs(30, 23.4))));
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_TRUE(d.update(at(6 * kSec, figs(30, 23.4))));
  EXPECT_EQ(d.state(), CongestionState::kCongested);
  EXPECT_EQ(d.sinceUs(), 6 * kSec);
  EXPECT_EQ(d.reason(), "queueing 23.4 ms over min RTT 30.0 ms");
  EXPECT_FALSE(d.update(at(7 * kSec, figs(30, 23.4))));  // no change, no report
}

TEST(CongestionDetectorTest, LeavingNeedsExitSamplesUnderTheExitMark) {
  CongestionDetector d;
  for (int i = 1; i <= 3; ++i) d.update(at(i * kSec, figs(30, 20)));
  ASSERT_EQ(d.state(), CongestionState::kCongested);
  // 10 ms is under the entry mark (15) but over the exit mark (max(2, 6) = 6): still congested.
  for (int i = 4; i < 40; ++i) EXPECT_FALSE(d.update(at(i * kSec, figs(30, 10))));
  EXPECT_EQ(d.state(), CongestionState::kCongested);
  EXPECT_EQ(d.sinceUs(), 3 * kSec);
  // Nine clear samples, one in between, nine more: the run restarts.
  std::int64_t t = 40 * kSec;
  for (int i = 0; i < 9; ++i) EXPECT_FALSE(d.update(at(t += kSec, figs(30, 0.5))));
  EXPECT_FALSE(d.update(at(t += kSec, figs(30, 10))));
  for (int i = 0; i < 9; ++i) EXPECT_FALSE(d.update(at(t += kSec, figs(30, 0.5))));
  EXPECT_EQ(d.state(), CongestionState::kCongested);
  EXPECT_TRUE(d.update(at(t += kSec, figs(30, 0.5))));
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_EQ(d.sinceUs(), t);
  EXPECT_EQ(d.reason(), "clear: queueing 0.5 ms, loss 0.0%");
}

TEST(CongestionDetectorTest, NoiseAroundTheEntryMarkDoesNotFlap) {
  // Queueing 15 ms +- 4 ms on a 30 ms path: straddles the 15 ms entry mark all the time.
  Noise noise(12345);
  std::vector<double> q;
  for (int i = 0; i < 2000; ++i) q.push_back(11 + 8 * noise.next());

  CongestionDetector d;
  EXPECT_EQ(transitions(d, q), 1);  // enters once, and never gets under the 6 ms exit mark
  EXPECT_EQ(d.state(), CongestionState::kCongested);

  // The same sequence does flap without hysteresis, so the count above means something.
  CongestionConfig bare;
  bare.exitQueueingUs = bare.enterQueueingUs;
  bare.exitQueueingFraction = bare.enterQueueingFraction;
  bare.enterSamples = bare.exitSamples = 1;
  CongestionDetector flappy(bare);
  EXPECT_GT(transitions(flappy, q), 100);
}

TEST(CongestionDetectorTest, AlternatingSamplesNeverChangeTheState) {
  std::vector<double> q;
  for (int i = 0; i < 200; ++i) q.push_back(i % 2 == 0 ? 30 : 0.5);
  CongestionDetector clear;
  EXPECT_EQ(transitions(clear, q), 0);

  CongestionDetector congested;
  ASSERT_EQ(transitions(congested, {30, 30, 30}), 1);
  std::vector<double> tail(q.begin(), q.end());
  tail.insert(tail.begin(), 0.5);  // 0.5, 30, 0.5, 30, ...: runs of one clear sample
  EXPECT_EQ(transitions(congested, tail), 0);
  EXPECT_EQ(congested.state(), CongestionState::kCongested);
}

TEST(CongestionDetectorTest, TheQueueingMarkScalesWithTheMinRtt) {
  // 200 ms path: 50 ms of queue is under half the path (100 ms), so not congestion...
  CongestionDetector longPath;
  for (int i = 1; i <= 10; ++i) longPath.update(at(i * kSec, figs(200, 50)));
  EXPECT_EQ(longPath.state(), CongestionState::kClear);
  for (int i = 11; i <= 13; ++i) longPath.update(at(i * kSec, figs(200, 110)));
  EXPECT_EQ(longPath.state(), CongestionState::kCongested);
  // ...while a 1 ms path is judged by the 5 ms absolute mark.
  CongestionDetector shortPath;
  for (int i = 1; i <= 10; ++i) shortPath.update(at(i * kSec, figs(1, 4)));
  EXPECT_EQ(shortPath.state(), CongestionState::kClear);
  for (int i = 11; i <= 13; ++i) shortPath.update(at(i * kSec, figs(1, 6)));
  EXPECT_EQ(shortPath.state(), CongestionState::kCongested);
  EXPECT_EQ(shortPath.reason(), "queueing 6.0 ms over min RTT 1.0 ms");
}

TEST(CongestionDetectorTest, LossEntersAndMustFallUnderTheExitMarkToLeave) {
  CongestionDetector d;
  std::int64_t t = 0;
  d.update(at(t += kSec, figs(30, 1, 0.04)));
  d.update(at(t += kSec, figs(30, 1, 0.04)));
  EXPECT_TRUE(d.update(at(t += kSec, figs(30, 1, 0.04))));
  EXPECT_EQ(d.reason(), "loss 4.0%");
  // 1% is under the 2% entry mark but over the 0.5% exit mark.
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(d.update(at(t += kSec, figs(30, 1, 0.01))));
  EXPECT_EQ(d.state(), CongestionState::kCongested);
  for (int i = 0; i < 9; ++i) EXPECT_FALSE(d.update(at(t += kSec, figs(30, 1, 0.004))));
  EXPECT_TRUE(d.update(at(t += kSec, figs(30, 1, 0.004))));
  EXPECT_EQ(d.reason(), "clear: queueing 1.0 ms, loss 0.4%");
}

TEST(CongestionDetectorTest, ReasonListsEveryTrigger) {
  CongestionDetector d;
  for (int i = 1; i <= 3; ++i) d.update(at(i * kSec, figs(30, 23.4, 0.04)));
  ASSERT_EQ(d.state(), CongestionState::kCongested);
  EXPECT_EQ(d.reason(), "queueing 23.4 ms over min RTT 30.0 ms; loss 4.0%");
}

TEST(CongestionDetectorTest, FiguresWithoutEchoAreJudgedOnLossOnly) {
  PathFigures none;  // valid = false; its RTT fields mean nothing
  none.srttUs = 500000;
  CongestionDetector d;
  for (int i = 1; i <= 10; ++i) EXPECT_FALSE(d.update(at(i * kSec, none)));
  none.loss = 1.0;
  for (int i = 11; i <= 13; ++i) d.update(at(i * kSec, none));
  EXPECT_EQ(d.state(), CongestionState::kCongested);
  EXPECT_EQ(d.reason(), "loss 100.0%");
}

TEST(CongestionDetectorTest, RateCollapseEntersAndTheDecayingPeakLetsItGo) {
  CongestionDetector d;
  PathFigures calm = figs(30, 0.5);
  for (std::int64_t t = 0; t <= 200 * kMs; t += 100 * kMs) d.update(at(t, calm, 60e6));
  EXPECT_DOUBLE_EQ(d.peakBytesPerSec(), 60e6);
  EXPECT_FALSE(d.update(at(300 * kMs, calm, 12e6)));
  EXPECT_FALSE(d.update(at(400 * kMs, calm, 12e6)));
  EXPECT_TRUE(d.update(at(500 * kMs, calm, 12e6)));
  EXPECT_EQ(d.reason(), "delivery rate 12 MB/s, 20% of its 60 MB/s peak");

  // The rate stays at 12 MB/s. The peak (30 s half-life) falls under 24 MB/s, where 12 is no
  // longer a collapse, at 0.2 s + 30 * log2(2.5) = 39.9 s; ten clear samples later it is clear.
  std::int64_t clearedAt = -1;
  for (std::int64_t t = 1 * kSec; t <= 60 * kSec; t += kSec) {
    if (d.update(at(t, calm, 12e6))) clearedAt = t;
    if (t == 39 * kSec) {
      EXPECT_EQ(d.state(), CongestionState::kCongested);
    }
  }
  EXPECT_EQ(clearedAt, 49 * kSec);
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_EQ(d.reason(), "clear: queueing 0.5 ms, loss 0.0%, delivery rate 12 MB/s");
}

TEST(CongestionDetectorTest, APathThatClearsStartsItsPeakOverFromTheRateItClearedWith) {
  // Queueing put the path in; the queue went, but the path came back at a third of its old
  // rate. That rate is its new normal: judging it against the old peak would send the path
  // straight back (and a path held at a small weight while congested is fed no rate at all).
  CongestionDetector d;
  std::int64_t t = 0;
  for (int i = 0; i < 3; ++i) d.update(at(t += 100 * kMs, figs(30, 0.5), 60e6));
  for (int i = 0; i < 3; ++i) d.update(at(t += 100 * kMs, figs(30, 40)));
  ASSERT_EQ(d.state(), CongestionState::kCongested);
  // Held back while congested, the path gives no rate; its probes clear it.
  for (int i = 0; i < 9; ++i) EXPECT_FALSE(d.update(at(t += 100 * kMs, figs(30, 0.5))));
  EXPECT_TRUE(d.update(at(t += 100 * kMs, figs(30, 0.5))));
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_EQ(d.peakBytesPerSec(), 0) << "the old peak is gone";
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(d.update(at(t += 100 * kMs, figs(30, 0.5), 20e6))) << i;
  EXPECT_DOUBLE_EQ(d.peakBytesPerSec(), 20e6);
  // A collapse from the new normal is one again.
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(d.update(at(t += 100 * kMs, figs(30, 0.5), 6e6)));
  EXPECT_TRUE(d.update(at(t += 100 * kMs, figs(30, 0.5), 6e6)));
  EXPECT_EQ(d.reason(), "delivery rate 6.0 MB/s, 30% of its 20 MB/s peak");
}

transport::PathStats busyPath(double rate, std::uint64_t bytesSent, double weight = 1.0) {
  transport::PathStats p;
  p.alive = true;
  p.rateBytesPerSec = rate;
  p.bytesSent = bytesSent;
  p.weight = weight;
  return p;
}

TEST(BusyDeliveryRateTest, OnlyAPathSentAtLeastHalfItsRateIsJudged) {
  // 10 MB/s over 100 ms carries 1 MB: sending half of that or more is busy.
  EXPECT_DOUBLE_EQ(busyDeliveryRate(busyPath(10e6, 5'000'000 + 600'000), 5'000'000, 100 * kMs), 10e6);
  EXPECT_DOUBLE_EQ(busyDeliveryRate(busyPath(10e6, 5'000'000 + 500'000), 5'000'000, 100 * kMs), 10e6);
  EXPECT_EQ(busyDeliveryRate(busyPath(10e6, 5'000'000 + 400'000), 5'000'000, 100 * kMs), 0)
      << "idle or application-limited for most of the interval";
  EXPECT_EQ(busyDeliveryRate(busyPath(10e6, 9'000'000, 0.1), 5'000'000, 100 * kMs), 0)
      << "routing holds it back: the rate is the sender's";
  EXPECT_EQ(busyDeliveryRate(busyPath(0, 9'000'000), 5'000'000, 100 * kMs), 0) << "not measured yet";
  auto dead = busyPath(10e6, 9'000'000);
  dead.alive = false;
  EXPECT_EQ(busyDeliveryRate(dead, 5'000'000, 100 * kMs), 0);
  EXPECT_EQ(busyDeliveryRate(busyPath(10e6, 4'000'000), 5'000'000, 100 * kMs), 0) << "a count that went down";
  EXPECT_EQ(busyDeliveryRate(busyPath(10e6, 9'000'000), 5'000'000, 0), 0) << "no interval";
  EXPECT_DOUBLE_EQ(busyDeliveryRate(busyPath(10e6, 9'000'000, 2.0), 5'000'000, 100 * kMs), 10e6)
      << "a raised path is sent all it can carry";
}

TEST(CongestionDetectorTest, ALongGonePeakIsForgotten) {
  CongestionDetector d;
  d.update(at(0, figs(30, 0.5), 60e6));
  // Four half-lives later the old peak is 3.75 MB/s: 12 MB/s is the new peak, not a collapse.
  for (int i = 0; i < 5; ++i) d.update(at(120 * kSec + i * kSec, figs(30, 0.5), 12e6));
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_DOUBLE_EQ(d.peakBytesPerSec(), 12e6);
}

TEST(CongestionDetectorTest, UnknownRateIsNotJudged) {
  CongestionDetector d;
  d.update(at(0, figs(30, 0.5), 60e6));
  for (int i = 1; i <= 10; ++i) EXPECT_FALSE(d.update(at(i * 100 * kMs, figs(30, 0.5), 0)));
  EXPECT_EQ(d.state(), CongestionState::kClear);
  EXPECT_DOUBLE_EQ(d.peakBytesPerSec(), 60e6);  // not decayed or lowered by unknown samples
}

}  // namespace
}  // namespace meridian::routing
