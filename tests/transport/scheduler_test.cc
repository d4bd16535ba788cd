// The multipath scheduler (earliest expected finish) and the delivery-rate estimator.
#include <gtest/gtest.h>

#include <vector>

#include "transport/multipath/scheduler.h"

namespace meridian::transport {
namespace {

PathLoad path(double rate, std::uint64_t queued = 0, std::uint64_t window = 1 << 30) {
  return PathLoad{true, queued, window, rate, 0.0, 1.0};
}

// Runs the scheduler over `chunks` chunks, as the channel does, and counts per path.
std::vector<int> distribute(std::vector<PathLoad> loads, int chunks, std::uint64_t chunkBytes) {
  std::vector<int> count(loads.size());
  for (int i = 0; i < chunks; ++i) {
    auto c = pickPath(loads, chunkBytes);
    EXPECT_TRUE(c.has_value());
    count[c->path]++;
    loads[c->path].queuedBytes += chunkBytes;
  }
  return count;
}

TEST(SchedulerTest, EqualPathsShareChunksEvenly) {
  auto n = distribute({path(1e9), path(1e9)}, 100, 1 << 19);
  EXPECT_EQ(n[0], 50);
  EXPECT_EQ(n[1], 50);
}

TEST(SchedulerTest, FasterPathTakesChunksInProportionToItsRate) {
  auto n = distribute({path(3e9), path(1e9)}, 400, 1 << 19);
  EXPECT_NEAR(n[0], 300, 2);
  EXPECT_NEAR(n[1], 100, 2);
}

TEST(SchedulerTest, QueuedBytesDelayAPath) {
  auto c = pickPath(std::vector<PathLoad>{path(1e9, 10 << 20), path(1e9, 0)}, 1 << 19);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->path, 1u);
}

TEST(SchedulerTest, SkipsUnusablePathsAndReportsNoneWhenAllAreDown) {
  std::vector<PathLoad> loads{path(5e9), path(1e9)};
  loads[0].usable = false;
  auto c = pickPath(loads, 4096);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->path, 1u);
  loads[1].usable = false;
  EXPECT_FALSE(pickPath(loads, 4096).has_value());
}

TEST(SchedulerTest, WaitsForAFullBestPathInsteadOfUsingAMuchSlowerOne) {
  // Path 0 is full but ten times faster: a chunk there still finishes first.
  std::vector<PathLoad> loads{path(10e9, 4 << 20, 4 << 20), path(1e8, 0)};
  auto c = pickPath(loads, 1 << 19);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->path, 0u);
  EXPECT_FALSE(c->hasRoom);
}

TEST(SchedulerTest, LatencyAndWeightShiftTheChoice) {
  std::vector<PathLoad> loads{path(1e9), path(1e9)};
  loads[0].latencySec = 0.01;
  EXPECT_EQ(pickPath(loads, 4096)->path, 1u);
  loads[0].latencySec = 0;
  loads[1].weight = 2.0;
  EXPECT_EQ(pickPath(loads, 4096)->path, 1u);
}

TEST(RateEstimatorTest, MeasuresAckedBytesOverBusyIntervals) {
  RateEstimator r(1e9, 1000);
  EXPECT_FALSE(r.measured());
  r.onBusy(0);
  r.onAcked(1'000'000, 500, true);  // too short for a sample
  EXPECT_FALSE(r.measured());
  r.onAcked(1'000'000, 2000, true);  // 2 MB in 2 ms = 1 GB/s
  EXPECT_TRUE(r.measured());
  EXPECT_NEAR(r.bytesPerSec(), 1e9, 1e6);
  r.onAcked(100'000, 4000, false);  // 100 kB in 2 ms = 50 MB/s, smoothed
  EXPECT_NEAR(r.bytesPerSec(), 0.75e9 + 0.25 * 5e7, 1e6);
}

TEST(RateEstimatorTest, IgnoresIdleTime) {
  RateEstimator r(1e9, 1000);
  r.onBusy(0);
  r.onAcked(2'000'000, 2000, false);
  double before = r.bytesPerSec();
  // A long idle gap, then a new busy interval at the same speed.
  r.onBusy(1'000'000);
  r.onAcked(2'000'000, 1'002'000, false);
  EXPECT_NEAR(r.bytesPerSec(), before, 1e6);
}

}  // namespace
}  // namespace meridian::transport

namespace meridian::transport {
namespace {

TEST(PickPathEvenlyTest, GivesEveryLivePathTheSameShareWhateverItsRate) {
  std::vector<PathLoad> paths(3);
  for (auto& p : paths) {
    p.usable = true;
    p.windowBytes = 1000;
  }
  paths[0].rateBytesPerSec = 1e9;
  paths[1].rateBytesPerSec = 1e3;  // a crawling path still gets its share
  paths[2].usable = false;
  std::vector<std::uint64_t> assigned{0, 0, 0};
  std::vector<int> count(3, 0);
  for (int i = 0; i < 100; ++i) {
    auto c = pickPathEvenly(paths, assigned, 100);
    ASSERT_TRUE(c.has_value());
    ASSERT_TRUE(c->hasRoom);
    assigned[c->path] += 100;
    ++count[c->path];
  }
  EXPECT_EQ(count[0], 50);
  EXPECT_EQ(count[1], 50);
  EXPECT_EQ(count[2], 0) << "a dead path gets nothing";
  // The chosen path's full window makes the chunk wait rather than go elsewhere.
  paths[1].queuedBytes = 950;
  assigned = {500, 100, 0};
  auto c = pickPathEvenly(paths, assigned, 100);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->path, 1u);
  EXPECT_FALSE(c->hasRoom);
  paths[0].usable = paths[1].usable = false;
  EXPECT_FALSE(pickPathEvenly(paths, assigned, 100).has_value());
}

}  // namespace
}  // namespace meridian::transport
