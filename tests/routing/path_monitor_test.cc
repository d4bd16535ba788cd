// PathMonitor: weights from congestion states, two monitors over loopback that see each
// other's paths and hand out neutral weights while nothing is congested, and a data channel's
// rate collapse moving traffic once. The monitors are driven by hand on a ManualClock: each
// round is one probe interval of the test's own time, so no result depends on how fast the
// machine runs the monitor's thread.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>

#include "routing/path_monitor.h"
#include "tests/common/manual_clock.h"
#include "tests/routing/hand_driven.h"

namespace meridian::routing {
namespace {

using meridian::testing::ManualClock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

using S = CongestionState;

TEST(PathWeightsTest, CongestedPathsKeepASmallShareUnlessAllAre) {
  EXPECT_EQ(weightsFor({S::kClear, S::kClear}), (std::vector<double>{1, 1}));
  EXPECT_EQ(weightsFor({S::kClear, S::kCongested}), (std::vector<double>{1, kCongestedPathWeight}));
  EXPECT_EQ(weightsFor({S::kCongested, S::kCongested}), (std::vector<double>{kCongestedPathWeight, kCongestedPathWeight}))
      << "nowhere better to go: equal";
  EXPECT_EQ(weightsFor({S::kCongested}), (std::vector<double>{kCongestedPathWeight}));
  EXPECT_TRUE(weightsFor({}).empty());
}

// Beside a fabric path (which probes do not reach), a congested TCP path is not held down
// against it unless another judged path is clear; a down one is, since the fabric path is up.
TEST(PathWeightsTest, PathsProbesDoNotReachLeaveTheChoiceToMeasuredRates) {
  EXPECT_EQ(weightsFor({S::kCongested}, {}, true), (std::vector<double>{1}));
  EXPECT_EQ(weightsFor({S::kCongested, S::kCongested}, {}, true), (std::vector<double>{1, 1}));
  EXPECT_EQ(weightsFor({S::kClear, S::kCongested}, {}, true), (std::vector<double>{1, kCongestedPathWeight}))
      << "a clear judged path is still better than a congested one";
  EXPECT_EQ(weightsFor({S::kClear}, {true}, true), (std::vector<double>{kDownPathWeight}))
      << "the unjudged path is up: the down one carries nothing";
  EXPECT_EQ(weightsFor({S::kCongested}, {}, false), (std::vector<double>{kCongestedPathWeight}));
}

TEST(PathWeightsTest, DownPathsCarryNothingWhileAnotherPathIsUp) {
  EXPECT_EQ(weightsFor({S::kClear, S::kClear}, {true, false}), (std::vector<double>{kDownPathWeight, 1}));
  EXPECT_EQ(weightsFor({S::kClear, S::kCongested}, {false, true}), (std::vector<double>{1, kDownPathWeight}));
  EXPECT_EQ(weightsFor({S::kClear, S::kCongested}, {true, false}),
            (std::vector<double>{kDownPathWeight, kCongestedPathWeight}))
      << "a down path is not the clear one the congested path would be compared with";
  EXPECT_EQ(weightsFor({S::kCongested, S::kClear}, {true, true}),
            (std::vector<double>{kCongestedPathWeight, kCongestedPathWeight}))
      << "every path down: nowhere better, equal";
  EXPECT_EQ(weightsFor({S::kClear, S::kClear, S::kClear}, {true}), (std::vector<double>{kDownPathWeight, 1, 1}))
      << "a short `down` leaves the rest up";
}

constexpr milliseconds kInterval{10};
constexpr microseconds kRtt{300};  // every echo's round trip in the test's time

ProberOptions options(int rank, const std::shared_ptr<ManualClock>& clock) {
  ProberOptions o;
  o.localAddresses = {"127.0.0.1", "127.0.0.2"};
  o.interval = kInterval;
  o.secret = "s";
  o.sessionId = 3;
  o.selfRank = rank;
  o.name = "monitor-test";
  o.clock = clock;
  o.startThread = false;
  return o;
}

// One probe interval: `a` probes both paths, `b` (when there) answers, the echoes arrive kRtt
// later, and `a` judges its paths at the end of the interval.
void driveRound(PathMonitor& a, PathMonitor* b, ManualClock& clock) {
  a.prober().probeRound();
  if (b != nullptr) {
    ASSERT_TRUE(drain(b->prober(), 2)) << "b never got both requests";
    clock.advance(kRtt);
    ASSERT_TRUE(drain(a.prober(), 2)) << "a never got both echoes";
    clock.advance(kInterval - kRtt);
  } else {
    clock.advance(kInterval);
  }
  a.tick();
}

TEST(PathMonitorTest, SeesEveryPathAndAppliesNeutralWeightsWhenClear) {
  std::mutex mu;
  std::vector<std::pair<int, std::vector<double>>> applied;
  auto record = [&](int peer, const std::vector<double>& w) {
    std::lock_guard<std::mutex> lock(mu);
    applied.emplace_back(peer, w);
  };
  auto clock = std::make_shared<ManualClock>();
  auto a = PathMonitor::create(options(0, clock), true, record);
  auto b = PathMonitor::create(options(1, clock), false, nullptr);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  std::vector<PathView> paths = a.value()->paths();
  ASSERT_EQ(paths.size(), 2u);
  for (const auto& p : paths) {
    EXPECT_EQ(p.peer, 1);
    EXPECT_TRUE(p.figures.valid);
    EXPECT_EQ(p.state, S::kClear);
    EXPECT_DOUBLE_EQ(p.weight, 1.0);
  }
  EXPECT_TRUE(a.value()->events().empty());
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(applied.empty()) << "the first round hands out weights";
  EXPECT_EQ(applied.front(), (std::pair<int, std::vector<double>>{1, {1, 1}}));
  EXPECT_EQ(applied.size(), 1u) << "unchanged weights are not handed out again";
  EXPECT_TRUE(a.value()->adaptive());
  EXPECT_FALSE(b.value()->adaptive());
}

TEST(PathMonitorTest, ALostPeerMakesItsPathsCongestedWithEqualWeights) {
  auto clock = std::make_shared<ManualClock>();
  auto a = PathMonitor::create(options(0, clock), true, [](int, const std::vector<double>&) {});
  auto b = PathMonitor::create(options(1, clock), true, nullptr);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  for (int i = 0; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  b.value().reset();  // every probe from now on is lost
  // Up to 6 s of rounds: the probes time out after 2 s (the default), then the loss shows.
  std::vector<PathView> paths;
  for (int i = 0; i < 600; ++i) {
    ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), nullptr, *clock));
    paths = a.value()->paths();
    if (paths.size() == 2 && paths[0].state == S::kCongested && paths[1].state == S::kCongested) break;
  }
  ASSERT_EQ(paths.size(), 2u);
  for (const auto& p : paths) {
    EXPECT_EQ(p.state, S::kCongested) << "path " << p.path;
    EXPECT_NE(p.reason.find("loss"), std::string::npos) << p.reason;
    EXPECT_DOUBLE_EQ(p.weight, kCongestedPathWeight) << "both congested: equal, nothing to move to";
  }
  auto events = a.value()->events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back().state, S::kCongested);
}

// A plane cut between two ranks that exchange no data: the probes alone take the path out
// (weight 0) once three in a row went unanswered, and put it back once three are echoed.
TEST(PathMonitorTest, APathWhoseProbesGoUnansweredIsDownUntilItEchoesAgain) {
  std::mutex mu;
  std::vector<double> last;
  auto record = [&](int, const std::vector<double>& w) {
    std::lock_guard<std::mutex> lock(mu);
    last = w;
  };
  auto lastWeights = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return last;
  };
  auto clock = std::make_shared<ManualClock>();
  auto a = PathMonitor::create(options(0, clock), true, record);
  auto b = PathMonitor::create(options(1, clock), false, nullptr);
  // Path 1 leads to a socket that is never read: nothing there answers.
  auto silent = Prober::create(options(2, clock));
  ASSERT_TRUE(a.isOk() && b.isOk() && silent.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, {b.value()->endpoints()[0], silent.value()->endpoints()[1]}).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  // One interval in which only path 0 is answered.
  auto halfRound = [&] {
    a.value()->prober().probeRound();
    ASSERT_TRUE(drain(b.value()->prober(), 1)) << "b never got path 0's request";
    clock->advance(kRtt);
    ASSERT_TRUE(drain(a.value()->prober(), 1)) << "a never got path 0's echo";
    clock->advance(kInterval - kRtt);
    a.value()->tick();
  };
  const std::int64_t start = clock->nowUs();
  std::vector<PathView> paths;
  for (int i = 0; i < 600; ++i) {
    ASSERT_NO_FATAL_FAILURE(halfRound());
    paths = a.value()->paths();
    ASSERT_EQ(paths.size(), 2u);
    if (paths[1].down) break;
  }
  ASSERT_TRUE(paths[1].down) << "6 s of unanswered probes";
  EXPECT_GE(clock->nowUs() - start, 2'000'000) << "a probe is lost only after the echo timeout (2 s)";
  EXPECT_GE(paths[1].figures.lostInARow, kDownAfterLostProbes);
  EXPECT_FALSE(paths[0].down);
  EXPECT_DOUBLE_EQ(paths[1].weight, kDownPathWeight);
  EXPECT_EQ(lastWeights(), (std::vector<double>{1, kDownPathWeight})) << "path 0 is clear: it takes everything";

  // The cut heals: path 1 leads to b again and is answered.
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  for (std::uint64_t i = 1; i < kUpAfterEchoes; ++i) {
    ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
    EXPECT_TRUE(a.value()->paths()[1].down) << "up only after " << kUpAfterEchoes << " echoes in a row, not " << i;
  }
  ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  paths = a.value()->paths();
  EXPECT_FALSE(paths[1].down);
  EXPECT_GT(paths[1].weight, 0.0);
  EXPECT_GT(lastWeights().at(1), 0.0);
}

TEST(PathMonitorTest, AChannelRateCollapseMovesTrafficOnceAndTheRateItRecoversWithIsTheNewNormal) {
  // The probes on loopback stay clear throughout; a stand-in for the data channel reports path
  // 0 busy at 60 MB/s, then at 12 MB/s. Like a real channel it shows the weight last applied.
  std::mutex mu;
  std::vector<double> weights{1, 1};
  bool collapsed = false;
  std::uint64_t sent = 0;
  auto apply = [&](int, const std::vector<double>& w) {
    std::lock_guard<std::mutex> lock(mu);
    weights = w;
  };
  auto read = [&](int) {
    std::lock_guard<std::mutex> lock(mu);
    sent += 1'000'000'000;  // always more than either rate carries in a round: busy
    std::vector<transport::PathStats> out(2);
    for (std::size_t i = 0; i < 2; ++i) {
      out[i].alive = true;
      out[i].bytesSent = sent;
      out[i].weight = weights[i];
      out[i].rateBytesPerSec = i == 0 && collapsed ? 12e6 : 60e6;
    }
    return out;
  };
  auto clock = std::make_shared<ManualClock>();
  auto a = PathMonitor::create(options(0, clock), true, apply, read);
  auto b = PathMonitor::create(options(1, clock), false, nullptr);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  for (int i = 0; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  ASSERT_TRUE(a.value()->events().empty()) << a.value()->events().front().reason;
  {
    std::lock_guard<std::mutex> lock(mu);
    collapsed = true;
  }
  std::vector<PathEvent> events;
  for (int i = 0; i < 500 && events.size() < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
    events = a.value()->events();
    if (events.size() == 1) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(weights, (std::vector<double>{kCongestedPathWeight, 1})) << "moved off while congested";
    }
  }
  ASSERT_EQ(events.size(), 2u) << "congested, then clear once it is held back and its probes stay clean";
  EXPECT_EQ(events[0].path, 0);
  EXPECT_EQ(events[0].state, S::kCongested);
  EXPECT_NE(events[0].reason.find("delivery rate 12 MB/s"), std::string::npos) << events[0].reason;
  EXPECT_EQ(events[1].state, S::kClear);
  // Back at full weight, still at 12 MB/s: the new normal, no flapping (30 more rounds).
  for (int i = 0; i < 30; ++i) ASSERT_NO_FATAL_FAILURE(driveRound(*a.value(), b.value().get(), *clock));
  EXPECT_EQ(a.value()->events().size(), 2u) << a.value()->events().back().reason;
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(weights, (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace meridian::routing
