// PathJudge on recorded readings: a path whose streams resend a share of their segments is
// judged congested after the detector's run of samples and loses its weight, and recovers after
// the longer exit run; a queue in the kernel's RTT alone (a transfer's own) moves nothing; idle
// readings are not judged; a dying stream's totals do not read as negative deltas.
#include "routing/path_judge.h"

#include <gtest/gtest.h>

#include <vector>

#include "routing/path_monitor.h"

namespace meridian::routing {
namespace {

transport::PathStats path(double rttUs, double /*minRttUs: the kernel's, not judged*/, std::uint64_t segments,
                          std::uint64_t resent) {
  transport::PathStats p;
  p.alive = true;
  p.localAddress = "198.18.1.2";
  p.telemetry.rttUs = rttUs;
  p.telemetry.unitsSent = segments;
  p.telemetry.unitsResent = resent;
  return p;
}

// Feeds `n` readings a second apart in which path 0 has `rtt0` (and resends `resent0` of
// every 1000 segments) while path 1 stays at its 80 ms floor; returns the last update's result.
struct Feed {
  PathJudge judge;
  std::int64_t nowUs = 0;
  std::uint64_t seg0 = 0, seg1 = 0, re0 = 0;
  std::optional<std::vector<double>> run(int n, double rtt0, std::uint64_t resent0 = 0, bool busy0 = true) {
    std::optional<std::vector<double>> last;
    for (int i = 0; i < n; ++i) {
      nowUs += 1'000'000;
      if (busy0) seg0 += 1000;
      re0 += busy0 ? resent0 : 0;
      seg1 += 1000;
      auto w = judge.update(nowUs, {path(rtt0, 80'000, seg0, re0), path(80'500, 80'000, seg1, 0)});
      if (w) last = w;
    }
    return last;
  }
};

TEST(PathJudgeTest, ResentSegmentsMoveTrafficOffUntilThePathRecovers) {
  Feed f;
  EXPECT_FALSE(f.run(5, 81'000).has_value()) << "clear paths keep the neutral weights";
  auto w = f.run(2, 81'000, 50);  // 5% of the segments resent: over the 2% mark
  EXPECT_FALSE(w.has_value()) << "two samples are below the detector's entry run";
  w = f.run(1, 81'000, 50);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, (std::vector<double>{kCongestedPathWeight, 1.0}));
  EXPECT_EQ(f.judge.verdicts()[0].state, CongestionState::kCongested);
  EXPECT_NE(f.judge.verdicts()[0].reason.find("loss 5.0%"), std::string::npos) << f.judge.verdicts()[0].reason;
  EXPECT_EQ(f.judge.changed(), (std::vector<std::size_t>{0}));
  EXPECT_FALSE(f.run(5, 81'000, 50).has_value()) << "no change, nothing to apply";
  // Recovery needs the exit run (10 clean samples).
  EXPECT_FALSE(f.run(9, 81'000).has_value());
  w = f.run(1, 81'000);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, (std::vector<double>{1.0, 1.0}));
}

TEST(PathJudgeTest, AQueueAloneIsTheTransfersOwnAndMovesNothing) {
  // A bulk transfer that saturates its path fills the bottleneck queue itself: 60 ms over an
  // 80 ms floor, no resends. Judging that as congestion pushed traffic onto a flooded plane.
  Feed f;
  EXPECT_FALSE(f.run(20, 140'000).has_value());
  EXPECT_EQ(f.judge.verdicts()[0].state, CongestionState::kClear);
  EXPECT_EQ(f.judge.verdicts()[0].samples, 19) << "the first reading is the baseline";
  // The probed paths' detector (default settings) would have entered on it.
  CongestionDetector probed;
  PathFigures fig;
  fig.valid = true;
  fig.srttUs = 140'000;
  fig.minRttUs = 80'000;
  bool entered = false;
  for (int i = 0; i < 3; ++i) entered = probed.update(CongestionSample{i * 1'000'000, fig, 0}) || entered;
  EXPECT_TRUE(entered);
}

TEST(PathJudgeTest, IdleReadingsAreNotJudged) {
  Feed f;
  f.run(1, 81'000);
  // A stale RTT from before the path went idle says nothing about now.
  EXPECT_FALSE(f.run(10, 140'000, 0, /*busy0=*/false).has_value());
  EXPECT_EQ(f.judge.verdicts()[0].state, CongestionState::kClear);
  EXPECT_EQ(f.judge.verdicts()[0].samples, 0);
  EXPECT_EQ(f.judge.verdicts()[1].samples, 10);
}

TEST(PathJudgeTest, ABusyPathWhoseDeliveryRateCollapsesLosesItsWeight) {
  // Two paths sending all a second's readings can carry; path 0's rate falls from 50 to
  // 10 MB/s (a plane throttled without loss or queue the kernel's figures would show).
  PathJudge judge;
  std::int64_t t = 0;
  std::uint64_t seg = 0, sent0 = 0, sent1 = 0;
  std::optional<std::vector<double>> w;
  auto reading = [&](double rate0, std::uint64_t bytes0) {
    seg += 1000;
    sent0 += bytes0;
    sent1 += 50'000'000;
    auto p0 = path(81'000, 80'000, seg, 0);
    p0.rateBytesPerSec = rate0;
    p0.bytesSent = sent0;
    auto p1 = path(81'000, 80'000, seg, 0);
    p1.rateBytesPerSec = 50e6;
    p1.bytesSent = sent1;
    return judge.update(t += 1'000'000, {p0, p1});
  };
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(reading(50e6, 50'000'000).has_value());
  // Sending little at a low rate is the application's doing, not the path's: not judged.
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(reading(10e6, 1'000'000).has_value());
  EXPECT_EQ(judge.verdicts()[0].state, CongestionState::kClear);
  EXPECT_FALSE(reading(10e6, 10'000'000).has_value());
  EXPECT_FALSE(reading(10e6, 10'000'000).has_value());
  w = reading(10e6, 10'000'000);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, (std::vector<double>{kCongestedPathWeight, 1.0}));
  // The peak has decayed a little over the readings that were not judged (30 s half-life).
  EXPECT_EQ(judge.verdicts()[0].reason.rfind("delivery rate 10 MB/s, 24% of its 42 MB/s peak", 0), 0u)
      << judge.verdicts()[0].reason;
}

TEST(PathJudgeTest, TotalsThatFallStartANewBaseline) {
  PathJudge judge;
  std::int64_t t = 0;
  judge.update(t += 1'000'000, {path(81'000, 80'000, 50'000, 900)});
  // One of the path's streams died: its segments and retransmits leave the sums. Without a
  // new baseline the unsigned deltas would wrap into a huge "loss".
  EXPECT_FALSE(judge.update(t += 1'000'000, {path(81'000, 80'000, 20'000, 100)}).has_value());
  for (int i = 0; i < 5; ++i) judge.update(t += 1'000'000, {path(81'000, 80'000, 20'000 + 1000 * (i + 1), 100)});
  EXPECT_EQ(judge.verdicts()[0].state, CongestionState::kClear);
  EXPECT_EQ(judge.verdicts()[0].samples, 5);
}

TEST(PathJudgeTest, EveryPathCongestedKeepsThemAllEqualAndDeadPathsAreSkipped) {
  PathJudge judge;
  std::int64_t t = 0;
  std::uint64_t seg = 0;
  std::vector<std::vector<double>> handedOut;
  for (int i = 0; i < 6; ++i) {
    seg += 1000;
    auto dead = path(81'000, 80'000, seg, 0);
    dead.alive = false;
    auto w = judge.update(t += 1'000'000, {path(81'000, 80'000, seg, seg / 10), path(81'000, 80'000, seg, seg / 8), dead});
    if (w) handedOut.push_back(*w);
  }
  // Both live paths went congested in the same reading: one change, to equal weights (nothing
  // clear to move the traffic to).
  ASSERT_EQ(handedOut.size(), 1u);
  EXPECT_DOUBLE_EQ(handedOut[0][0], kCongestedPathWeight);
  EXPECT_DOUBLE_EQ(handedOut[0][1], kCongestedPathWeight);
  EXPECT_EQ(judge.verdicts()[0].state, CongestionState::kCongested);
  EXPECT_EQ(judge.verdicts()[1].state, CongestionState::kCongested);
  EXPECT_EQ(judge.verdicts()[2].samples, 0);
}

}  // namespace
}  // namespace meridian::routing
