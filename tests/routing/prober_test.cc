// Two probers over loopback: each measures the other on every path; strangers (another
// secret or session) are refused and measure nothing. The first tests run the probers' own
// threads on the steady clock; the others drive the probers by hand on a ManualClock, so
// "time passed" is a statement of the test, not a sleep.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "core/metrics.h"
#include "routing/prober.h"
#include "tests/common/manual_clock.h"
#include "tests/common/poll.h"
#include "tests/routing/hand_driven.h"

namespace meridian::routing {
namespace {

using meridian::testing::ManualClock;
using meridian::testing::pollUntil;
using std::chrono::milliseconds;

constexpr milliseconds kInterval{10};
constexpr milliseconds kEchoTimeout{200};

// A prober with its own thread, or driven by hand on `clock` when one is given.
std::unique_ptr<Prober> makeProber(int rank, std::vector<std::string> addresses, const std::string& secret = "s",
                                   std::uint64_t session = 7, std::shared_ptr<ManualClock> clock = nullptr) {
  ProberOptions o;
  o.localAddresses = std::move(addresses);
  o.interval = kInterval;
  o.echoTimeout = kEchoTimeout;
  o.secret = secret;
  o.sessionId = session;
  o.selfRank = rank;
  o.name = "test";
  o.clock = clock;
  o.startThread = clock == nullptr;
  auto p = Prober::create(o);
  EXPECT_TRUE(p.isOk()) << p.status().message();
  return std::move(p).value();
}

// Waits until `p` has echoes from every row, up to 5 s.
std::vector<ProbeRow> waitForEchoes(Prober& p, std::size_t rows, int minEchoes) {
  std::vector<ProbeRow> snap;
  pollUntil(
      [&] {
        snap = p.snapshot();
        bool ok = snap.size() == rows;
        for (const auto& r : snap) ok = ok && r.figures.received >= static_cast<std::uint64_t>(minEchoes);
        return ok;
      },
      milliseconds(5000));
  return snap;
}

TEST(ProberTest, MeasuresEveryPathToThePeer) {
  auto a = makeProber(0, {"127.0.0.1", "127.0.0.2"});
  auto b = makeProber(1, {"127.0.0.1", "127.0.0.2"});
  ASSERT_EQ(a->endpoints().size(), 2u);
  ASSERT_TRUE(a->setPeer(1, b->endpoints()).isOk());
  ASSERT_TRUE(b->setPeer(0, a->endpoints()).isOk());
  auto rows = waitForEchoes(*a, 2, 10);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.peer, 1);
    EXPECT_TRUE(r.figures.valid);
    EXPECT_GE(r.figures.received, 10u);
    EXPECT_GT(r.figures.srttUs, 0);
    EXPECT_LT(r.figures.minRttUs, 50'000) << "loopback";
    EXPECT_EQ(r.localAddress, r.path == 0 ? "127.0.0.1" : "127.0.0.2");
    EXPECT_EQ(r.remoteAddress, b->endpoints()[static_cast<std::size_t>(r.path)]);
  }
  EXPECT_GT(b->counters().echoed, 10u);
  EXPECT_EQ(a->counters().rejected, 0u);
  // The figures are in the metrics registry for monitoring.
  Gauge& rtt = MetricsRegistry::global().gauge("meridian_routing_path_rtt_seconds", "",
                                               {{"peer", "1"}, {"path", "0"}, {"prober", "test"}});
  EXPECT_GT(rtt.value(), 0);
}

TEST(ProberTest, PathsPairByIndexAndExtraPathsAreLeftOut) {
  auto a = makeProber(0, {"127.0.0.1", "127.0.0.2", "127.0.0.3"});
  auto b = makeProber(1, {"127.0.0.1"});
  ASSERT_TRUE(a->setPeer(1, b->endpoints()).isOk());
  ASSERT_TRUE(b->setPeer(0, a->endpoints()).isOk());
  auto rows = waitForEchoes(*a, 1, 3);
  ASSERT_EQ(rows.size(), 1u) << "only path 0 exists on both sides";
  EXPECT_TRUE(rows[0].figures.valid);
}

TEST(ProberTest, StrangersAreRefusedAndMeasureNothing) {
  auto clock = std::make_shared<ManualClock>();
  auto a = makeProber(0, {"127.0.0.1"}, "secret-a", 7, clock);
  auto intruder = makeProber(1, {"127.0.0.1"}, "secret-b", 7, clock);
  auto otherSession = makeProber(2, {"127.0.0.1"}, "secret-a", 8, clock);
  ASSERT_TRUE(a->setPeer(1, intruder->endpoints()).isOk());
  ASSERT_TRUE(intruder->setPeer(0, a->endpoints()).isOk());
  ASSERT_TRUE(a->setPeer(2, otherSession->endpoints()).isOk());
  ASSERT_TRUE(otherSession->setPeer(0, a->endpoints()).isOk());
  // Six rounds: each request reaches its target, which reads it and must not answer; an echo
  // sent anyway would reach `a` by its next read.
  for (int round = 0; round < 6; ++round) {
    a->probeRound();
    intruder->probeRound();
    otherSession->probeRound();
    ASSERT_TRUE(drain(*intruder, 1)) << "round " << round;
    ASSERT_TRUE(drain(*otherSession, 1)) << "round " << round;
    ASSERT_TRUE(drain(*a, 2)) << "round " << round;
    clock->advance(kInterval);
  }
  a->drainSockets();
  for (const auto& r : a->snapshot()) {
    EXPECT_FALSE(r.figures.valid) << "rank " << r.peer << " answered without the job's secret and session";
    EXPECT_GT(r.figures.sent, 5u);
  }
  EXPECT_GT(a->counters().rejected, 0u);
  EXPECT_EQ(a->counters().echoed, 0u);
  EXPECT_GT(intruder->counters().rejected, 0u);
}

TEST(ProberTest, LossIsCountedWhenThePeerGoesAway) {
  auto clock = std::make_shared<ManualClock>();
  auto a = makeProber(0, {"127.0.0.1"}, "s", 7, clock);
  auto b = makeProber(1, {"127.0.0.1"}, "s", 7, clock);
  ASSERT_TRUE(a->setPeer(1, b->endpoints()).isOk());
  ASSERT_TRUE(b->setPeer(0, a->endpoints()).isOk());
  // Five answered rounds, each echo 300 us after its request.
  for (int round = 0; round < 5; ++round) {
    a->probeRound();
    ASSERT_TRUE(drain(*b, 1)) << "b answers";
    clock->advance(std::chrono::microseconds(300));
    ASSERT_TRUE(drain(*a, 1)) << "the echo";
    clock->advance(kInterval - std::chrono::microseconds(300));
  }
  auto before = a->snapshot();
  ASSERT_EQ(before.size(), 1u);
  ASSERT_TRUE(before[0].figures.valid);
  EXPECT_DOUBLE_EQ(before[0].figures.minRttUs, 300);
  b.reset();
  // 800 ms of rounds without an answer: every probe older than the echo timeout (200 ms)
  // counts as lost.
  for (milliseconds t{0}; t < milliseconds(800); t += kInterval) {
    a->probeRound();
    clock->advance(kInterval);
  }
  a->drainSockets();
  auto rows = a->snapshot();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_GT(rows[0].figures.loss, 0.2);
}

TEST(ProberTest, BadArgumentsAreRefused) {
  ProberOptions o;
  o.localAddresses = {};
  EXPECT_FALSE(Prober::create(o).isOk());
  o.localAddresses = {"not-an-ip"};
  EXPECT_FALSE(Prober::create(o).isOk());
  auto a = makeProber(0, {"127.0.0.1"});
  EXPECT_FALSE(a->setPeer(0, {"127.0.0.1:1"}).isOk()) << "itself";
  EXPECT_FALSE(a->setPeer(1, {}).isOk());
  EXPECT_FALSE(a->setPeer(1, {"127.0.0.1"}).isOk()) << "no port";
  EXPECT_FALSE(a->setPeer(1, {"300.0.0.1:5"}).isOk());
}

}  // namespace
}  // namespace meridian::routing
