// Two probers over loopback: each measures the other on every path; strangers (another
// secret or session) are refused and measure nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/metrics.h"
#include "routing/prober.h"

namespace meridian::routing {
namespace {

std::unique_ptr<Prober> makeProber(int rank, std::vector<std::string> addresses, const std::string& secret = "s",
                                   std::uint64_t session = 7) {
  ProberOptions o;
  o.localAddresses = std::move(addresses);
  o.interval = std::chrono::milliseconds(10);
  o.echoTimeout = std::chrono::milliseconds(200);
  o.secret = secret;
  o.sessionId = session;
  o.selfRank = rank;
  o.name = "test";
  auto p = Prober::create(o);
  EXPECT_TRUE(p.isOk()) << p.status().message();
  return std::move(p).value();
}

// Waits until `p` has echoes from every row, up to 5 s.
std::vector<ProbeRow> waitForEchoes(Prober& p, std::size_t rows, int minEchoes) {
  for (int i = 0; i < 500; ++i) {
    auto snap = p.snapshot();
    bool ok = snap.size() == rows;
    for (const auto& r : snap) ok = ok && r.figures.received >= static_cast<std::uint64_t>(minEchoes);
    if (ok) return snap;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p.snapshot();
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
  auto a = makeProber(0, {"127.0.0.1"}, "secret-a");
  auto intruder = makeProber(1, {"127.0.0.1"}, "secret-b");
  auto otherSession = makeProber(2, {"127.0.0.1"}, "secret-a", 8);
  ASSERT_TRUE(a->setPeer(1, intruder->endpoints()).isOk());
  ASSERT_TRUE(intruder->setPeer(0, a->endpoints()).isOk());
  ASSERT_TRUE(a->setPeer(2, otherSession->endpoints()).isOk());
  ASSERT_TRUE(otherSession->setPeer(0, a->endpoints()).isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (const auto& r : a->snapshot()) {
    EXPECT_FALSE(r.figures.valid) << "rank " << r.peer << " answered without the job's secret and session";
    EXPECT_GT(r.figures.sent, 5u);
  }
  EXPECT_GT(a->counters().rejected, 0u);
  EXPECT_EQ(a->counters().echoed, 0u);
  EXPECT_GT(intruder->counters().rejected, 0u);
}

TEST(ProberTest, LossIsCountedWhenThePeerGoesAway) {
  auto a = makeProber(0, {"127.0.0.1"});
  auto b = makeProber(1, {"127.0.0.1"});
  ASSERT_TRUE(a->setPeer(1, b->endpoints()).isOk());
  ASSERT_TRUE(b->setPeer(0, a->endpoints()).isOk());
  ASSERT_TRUE(waitForEchoes(*a, 1, 5)[0].figures.valid);
  b.reset();
  // Probes sent from now on time out (200 ms) and count as lost.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
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
