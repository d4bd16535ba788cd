// The link model on its own: delay, serialisation at the rate, drop-tail queue, loss,
// cut, jitter without reordering, live changes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lab/link_model.h"

namespace meridian::lab {
namespace {

constexpr std::int64_t kMs = 1'000'000;

LinkParams params(double delayUs, double rateBps, std::uint64_t queueBytes = 0) {
  LinkParams p;
  p.delayUs = delayUs;
  p.rateBitsPerSec = rateBps;
  p.queueBytes = queueBytes;
  return p;
}

TEST(LinkModelTest, UnlimitedRateAddsOnlyTheDelay) {
  LinkModel m(params(20'000, 0), 1);
  auto t = m.admit(5 * kMs, 1500);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(*t, 25 * kMs);
  EXPECT_EQ(m.counters().packets, 1u);
  EXPECT_EQ(m.counters().bytes, 1500u);
}

TEST(LinkModelTest, PacketsLeaveAtTheRateThenTravelTheDelay) {
  // 8 Mbit/s: a 1000-byte packet takes exactly 1 ms to send.
  LinkModel m(params(10'000, 8e6), 1);
  auto a = m.admit(0, 1000), b = m.admit(0, 1000), c = m.admit(0, 1000);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 1 * kMs + 10 * kMs);
  EXPECT_EQ(*b, 2 * kMs + 10 * kMs);
  EXPECT_EQ(*c, 3 * kMs + 10 * kMs);
  EXPECT_EQ(m.backlogBytes(0), 3000u);
  EXPECT_EQ(m.backlogBytes(2 * kMs), 1000u);
  EXPECT_EQ(m.backlogBytes(4 * kMs), 0u);
  // After the link went idle, the next packet starts at once.
  auto d = m.admit(10 * kMs, 1000);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 11 * kMs + 10 * kMs);
}

TEST(LinkModelTest, DropTailWhenTheQueueIsFull) {
  LinkModel m(params(0, 8e6, 2500), 1);  // room for two 1000-byte packets waiting
  EXPECT_TRUE(m.admit(0, 1000));
  EXPECT_TRUE(m.admit(0, 1000));
  EXPECT_FALSE(m.admit(0, 1000)) << "a third packet overflows the 2500-byte queue";
  EXPECT_EQ(m.counters().queueDrops, 1u);
  EXPECT_EQ(m.counters().packets, 2u);
  EXPECT_EQ(m.counters().maxBacklogBytes, 2000u);
  // Once one has left, there is room again.
  EXPECT_TRUE(m.admit(1 * kMs, 1000));
}

TEST(LinkModelTest, AnIdleLinkTakesAPacketLargerThanItsQueue) {
  LinkModel m(params(0, 8e6, 100), 1);
  EXPECT_TRUE(m.admit(0, 9000));
  EXPECT_FALSE(m.admit(0, 50));
}

TEST(LinkModelTest, ThroughputUnderOverloadIsTheRate) {
  // Offer twice the rate for one second: what gets through is the rate (within a packet).
  const double rate = 80e6;
  LinkModel m(params(5'000, rate, 64 * 1024), 1);
  std::uint64_t deliveredBytes = 0;
  std::int64_t last = 0;
  for (std::int64_t t = 0; t < 1000 * kMs; t += 50'000) {  // 1500 B every 50 us = 240 Mbit/s
    if (auto d = m.admit(t, 1500)) {
      deliveredBytes += 1500;
      last = *d;
    }
  }
  const double seconds = static_cast<double>(last - 5 * kMs) * 1e-9;
  EXPECT_NEAR(static_cast<double>(deliveredBytes) * 8 / seconds, rate, rate * 0.01);
  EXPECT_GT(m.counters().queueDrops, 0u);
  EXPECT_LE(m.counters().maxBacklogBytes, 64u * 1024);
}

TEST(LinkModelTest, LossDropsTheConfiguredShare) {
  LinkParams p = params(1'000, 0);
  p.loss = 0.2;
  LinkModel m(p, 42);
  int delivered = 0;
  for (int i = 0; i < 20000; ++i) delivered += m.admit(i, 100).has_value() ? 1 : 0;
  // Binomial(20000, 0.8): sd ~57, so +-300 is over 5 sd.
  EXPECT_NEAR(delivered, 16000, 300);
  EXPECT_EQ(m.counters().lossDrops, static_cast<std::uint64_t>(20000 - delivered));
}

TEST(LinkModelTest, ACutLinkDropsEverythingUntilRestored) {
  LinkParams p = params(1'000, 1e9);
  p.cut = true;
  LinkModel m(p, 1);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(m.admit(i * kMs, 100));
  EXPECT_EQ(m.counters().lossDrops, 100u);
  p.cut = false;
  m.configure(p, 100 * kMs);
  EXPECT_TRUE(m.admit(200 * kMs, 100));
}

TEST(LinkModelTest, JitterSpreadsDelayButKeepsOrder) {
  LinkParams p = params(10'000, 0);
  p.jitterUs = 1'000;
  LinkModel m(p, 7);
  std::vector<double> extra;
  std::int64_t previous = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::int64_t now = static_cast<std::int64_t>(i) * 20 * kMs;  // far apart: order never binds
    auto d = m.admit(now, 100);
    ASSERT_TRUE(d);
    ASSERT_GE(*d, previous);
    previous = *d;
    extra.push_back(static_cast<double>(*d - now) / 1e3 - 10'000);
  }
  double mean = 0, var = 0;
  for (double e : extra) mean += e;
  mean /= static_cast<double>(extra.size());
  for (double e : extra) var += (e - mean) * (e - mean);
  const double sd = std::sqrt(var / static_cast<double>(extra.size()));
  EXPECT_NEAR(mean, 0, 60);
  EXPECT_NEAR(sd, 1'000, 80);
  // Back to back, jitter may not reorder: delivery times never go down.
  previous = 0;
  for (int i = 0; i < 2000; ++i) {
    auto d = m.admit(200'000 * kMs + i * 1000, 100);
    ASSERT_TRUE(d);
    ASSERT_GE(*d, previous);
    previous = *d;
  }
}

TEST(LinkModelTest, LiveChangesApplyToNewPackets) {
  LinkModel m(params(10'000, 0), 1);
  EXPECT_EQ(*m.admit(0, 100), 10 * kMs);
  m.configure(params(50'000, 0), 50 * kMs);
  EXPECT_EQ(*m.admit(100 * kMs, 100), 150 * kMs);
  // Shortening the delay never lets a packet overtake one already in flight.
  m.configure(params(1'000, 0), 100 * kMs);
  auto early = m.admit(100 * kMs + 1, 100);
  ASSERT_TRUE(early);
  EXPECT_EQ(*early, 150 * kMs);
}

TEST(LinkModelTest, ARateChangeDrainsTheQueuedBytesAtTheNewRate) {
  LinkModel m(params(0, 8e6, 1'000'000), 1);  // 1000-byte packets take 1 ms
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(m.admit(0, 1000));
  EXPECT_EQ(m.backlogBytes(0), 100'000u);
  m.configure(params(0, 800e6, 1'000'000), 0);  // 100x faster: the same bytes, drained in 1 ms
  EXPECT_EQ(m.backlogBytes(0), 100'000u);
  EXPECT_EQ(m.backlogBytes(500'000), 50'000u);
  auto next = m.admit(0, 1000);
  ASSERT_TRUE(next) << "a faster link does not suddenly look full";
  // It leaves the limiter after the queued bytes (1.01 ms) but is delivered after the last
  // packet accepted at the old rate: packets never overtake each other.
  EXPECT_EQ(*next, 100 * kMs);
  EXPECT_EQ(m.backlogBytes(0), 101'000u);
  // Slower again: the queue limit holds in bytes.
  m.configure(params(0, 8e6, 150'000), 0);
  std::uint64_t accepted = 0;
  while (m.admit(0, 1000)) ++accepted;
  EXPECT_LE(m.backlogBytes(0), 150'000u);
  EXPECT_EQ(accepted, 150'000u / 1000 - 101);
}

TEST(LinkModelTest, TimeScaleShrinksDelayAndJitterOnly) {
  LinkParams w = params(170'000, 4e8, 1 << 20);
  w.jitterUs = 2'000;
  w.loss = 0.01;
  LinkParams s = scaled(w, 0.1);
  EXPECT_DOUBLE_EQ(s.delayUs, 17'000);
  EXPECT_DOUBLE_EQ(s.jitterUs, 200);
  EXPECT_DOUBLE_EQ(s.rateBitsPerSec, 4e8);
  EXPECT_EQ(s.queueBytes, 1u << 20);
  EXPECT_DOUBLE_EQ(s.loss, 0.01);
}

}  // namespace
}  // namespace meridian::lab
