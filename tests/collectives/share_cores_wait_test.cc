// ShareCoresWait: when a waiter that shares its core yields and when it sleeps.
#include <gtest/gtest.h>

#include "collectives/host_arena.h"

namespace meridian::collectives {
namespace {

constexpr std::uint64_t kOnTime = 2'000;      // a peer that yielded back: 2 us
constexpr std::uint64_t kSlice = 3'000'000;  // a compute thread's time slice: 3 ms

// Of `waits` waits, how many sleep first.
int sleepsOf(ShareCoresWait& w, int waits) {
  int sleeps = 0;
  for (int i = 0; i < waits; ++i) sleeps += w.sleepFirst() ? 1 : 0;
  return sleeps;
}

TEST(ShareCoresWaitTest, YieldsWhilePeersYieldBackAndARareLateFlagDoesNotChangeThat) {
  ShareCoresWait w;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_FALSE(w.sleepFirst()) << "wait " << i;
    w.saw(i % 100 == 0 ? kSlice : kOnTime);  // 1% late: a preempted peer now and then
  }
  EXPECT_LT(w.lateShare(), ShareCoresWait::kShareToSleep);
}

TEST(ShareCoresWaitTest, SleepsWhenYieldsKeepHandingTheCoreAwayAndStillProbesEvery64thWait) {
  ShareCoresWait w;
  int yielded = 0;
  for (int i = 0; i < 200 && !w.sleepFirst(); ++i, ++yielded) w.saw(i % 5 == 0 ? kSlice : kOnTime);  // 20% late
  EXPECT_LT(yielded, 200) << "never switched to sleeping, late share " << w.lateShare();
  EXPECT_GT(w.lateShare(), ShareCoresWait::kShareToSleep);
  // Sleeping now (nothing to report while asleep): one wait in 64 yields to look again.
  const int sleeps = sleepsOf(w, 640);
  EXPECT_EQ(sleeps, 640 - 10);
}

TEST(ShareCoresWaitTest, ProbesThatSeeFlagsOnTimeBringYieldingBack) {
  ShareCoresWait w;
  for (int i = 0; i < 100; ++i) w.saw(kSlice);
  ASSERT_TRUE(w.sleepFirst());
  int waits = 0;
  while (waits < 100000) {
    ++waits;
    if (!w.sleepFirst()) {
      w.saw(kOnTime);  // the probe's yield came back at once
      if (w.lateShare() <= ShareCoresWait::kShareToSleep) break;
    }
  }
  EXPECT_LE(w.lateShare(), ShareCoresWait::kShareToSleep);
  // About 96 on-time probes bring the share from 1 under 5%, one every 64 waits.
  EXPECT_LT(waits, 64 * 120);
  EXPECT_FALSE(w.sleepFirst());
}

}  // namespace
}  // namespace meridian::collectives
