// PathMonitor: weights from congestion states, and two monitors over loopback that see
// each other's paths and hand out neutral weights while nothing is congested.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "routing/path_monitor.h"

namespace meridian::routing {
namespace {

using S = CongestionState;

TEST(PathWeightsTest, CongestedPathsKeepASmallShareUnlessAllAre) {
  EXPECT_EQ(weightsFor({S::kClear, S::kClear}), (std::vector<double>{1, 1}));
  EXPECT_EQ(weightsFor({S::kClear, S::kCongested}), (std::vector<double>{1, kCongestedPathWeight}));
  EXPECT_EQ(weightsFor({S::kCongested, S::kCongested}), (std::vector<double>{kCongestedPathWeight, kCongestedPathWeight}))
      << "nowhere better to go: equal";
  EXPECT_EQ(weightsFor({S::kCongested}), (std::vector<double>{kCongestedPathWeight}));
  EXPECT_TRUE(weightsFor({}).empty());
}

ProberOptions options(int rank) {
  ProberOptions o;
  o.localAddresses = {"127.0.0.1", "127.0.0.2"};
  o.interval = std::chrono::milliseconds(10);
  o.secret = "s";
  o.sessionId = 3;
  o.selfRank = rank;
  o.name = "monitor-test";
  return o;
}

TEST(PathMonitorTest, SeesEveryPathAndAppliesNeutralWeightsWhenClear) {
  std::mutex mu;
  std::vector<std::pair<int, std::vector<double>>> applied;
  auto record = [&](int peer, const std::vector<double>& w) {
    std::lock_guard<std::mutex> lock(mu);
    applied.emplace_back(peer, w);
  };
  auto a = PathMonitor::create(options(0), true, record);
  auto b = PathMonitor::create(options(1), false, nullptr);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  std::vector<PathView> paths;
  for (int i = 0; i < 300; ++i) {
    paths = a.value()->paths();
    if (paths.size() == 2 && paths[0].figures.valid && paths[1].figures.valid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(paths.size(), 2u);
  for (const auto& p : paths) {
    EXPECT_EQ(p.peer, 1);
    EXPECT_TRUE(p.figures.valid);
    EXPECT_EQ(p.state, S::kClear);
    EXPECT_DOUBLE_EQ(p.weight, 1.0);
  }
  EXPECT_TRUE(a.value()->events().empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(applied.empty()) << "the first round hands out weights";
  EXPECT_EQ(applied.front(), (std::pair<int, std::vector<double>>{1, {1, 1}}));
  EXPECT_EQ(applied.size(), 1u) << "unchanged weights are not handed out again";
  EXPECT_TRUE(a.value()->adaptive());
  EXPECT_FALSE(b.value()->adaptive());
}

TEST(PathMonitorTest, ALostPeerMakesItsPathsCongestedWithEqualWeights) {
  std::atomic<int> calls{0};
  auto a = PathMonitor::create(options(0), true, [&](int, const std::vector<double>&) { ++calls; });
  auto b = PathMonitor::create(options(1), true, nullptr);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a.value()->setPeer(1, b.value()->endpoints()).isOk());
  ASSERT_TRUE(b.value()->setPeer(0, a.value()->endpoints()).isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  b.value().reset();  // every probe from now on is lost
  std::vector<PathView> paths;
  for (int i = 0; i < 600; ++i) {
    paths = a.value()->paths();
    if (paths.size() == 2 && paths[0].state == S::kCongested && paths[1].state == S::kCongested) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

}  // namespace
}  // namespace meridian::routing
