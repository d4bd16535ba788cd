// Multipath TCP channels between two devices in one process, over loopback: sizes,
// FIFO matching per tag across paths, unexpected messages, failover and clean errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/metrics.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/tcp_device.h"
#include "tests/transport/test_pattern.h"

namespace meridian::transport::tcp {
namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

struct Pair {
  std::unique_ptr<TcpDevice> a, b;
  ChannelPtr ab, ba;  // a's channel to b, b's channel to a
  std::uint64_t session = 0x5e55;
};

// Two devices with `paths` loopback paths each (127.0.0.1, 127.0.0.2, ...).
// `beforeOpen` (when given) runs on the devices before the channels open.
Pair connect(int paths, int streams, std::size_t chunkBytes = 0, int stallMs = 0, bool adaptive = true,
             const std::function<void(Pair& p)>& beforeOpen = {}) {
  Pair p;
  DeviceOptions o;
  o.adaptive = adaptive;
  o.localAddresses.clear();
  for (int i = 0; i < paths; ++i) o.localAddresses.push_back("127.0.0." + std::to_string(i + 1));
  o.tcp.streamsPerPath = streams;
  o.chunkBytes = chunkBytes;
  o.pathStallMs = stallMs;
  o.secret = "test-secret";
  o.name = "a";
  auto a = TcpDevice::create(o);
  EXPECT_TRUE(a.isOk()) << a.status().toString();
  o.name = "b";
  auto b = TcpDevice::create(o);
  EXPECT_TRUE(b.isOk()) << b.status().toString();
  p.a = std::move(a.value());
  p.b = std::move(b.value());
  auto deadline = Clock::now() + kTimeout;
  ChannelSpec specA{p.session, 0, 1, true, p.b->endpoint()};
  ChannelSpec specB{p.session, 1, 0, false, p.a->endpoint()};
  if (beforeOpen) beforeOpen(p);
  Result<ChannelPtr> ba = internalError("not run");
  std::thread acceptor([&] { ba = p.b->openChannel(specB, deadline); });
  auto ab = p.a->openChannel(specA, deadline);
  acceptor.join();
  EXPECT_TRUE(ab.isOk()) << ab.status().toString();
  EXPECT_TRUE(ba.isOk()) << ba.status().toString();
  p.ab = ab.value();
  p.ba = ba.value();
  return p;
}

void sendRecv(Pair& p, std::size_t bytes, std::uint64_t tag) {
  auto data = pattern(bytes, static_cast<std::uint32_t>(bytes));
  std::vector<std::uint8_t> out(bytes + 16, 0xee);
  auto r = p.ba->irecv(out.data(), out.size(), tag);
  auto s = p.ab->isend(data.data(), data.size(), tag);
  ASSERT_TRUE(r.isOk() && s.isOk());
  auto deadline = Clock::now() + kTimeout;
  ASSERT_TRUE((*s)->wait(deadline).isOk()) << (*s)->status().toString();
  ASSERT_TRUE((*r)->wait(deadline).isOk()) << (*r)->status().toString();
  EXPECT_EQ((*r)->bytes(), bytes);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin()));
  EXPECT_EQ(out[bytes], 0xee) << "wrote past the message";
}

class TcpChannelSizes : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(TcpChannelSizes, DeliversEverySizeIntact) {
  auto [paths, streams] = GetParam();
  Pair p = connect(paths, streams, 64 * 1024);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{65536},
                        std::size_t{(1 << 20) + 3}, std::size_t{9 << 20}}) {
    SCOPED_TRACE(n);
    sendRecv(p, n, 7);
  }
  if (paths > 1) {
    auto stats = p.ab->pathStats();
    for (const auto& s : stats) EXPECT_GT(s.chunksSent, 0u) << "every path should carry chunks";
  }
}

INSTANTIATE_TEST_SUITE_P(PathsAndStreams, TcpChannelSizes,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 2), std::make_tuple(2, 1),
                                           std::make_tuple(3, 2)));

TEST(TcpChannelTest, MatchesFifoPerTagAcrossPaths) {
  Pair p = connect(2, 2, 4096);
  constexpr int kMessages = 200;
  std::vector<std::vector<std::uint8_t>> sent, got;
  std::vector<RequestPtr> reqs;
  // Receives for two tags are posted in an order unrelated to the sends.
  got.resize(kMessages);
  for (int i = 0; i < kMessages; ++i) got[i].assign(20000, 0);
  for (int i = 0; i < kMessages; i += 2) reqs.push_back(p.ba->irecv(got[i].data(), got[i].size(), 1).value());
  for (int i = 0; i < kMessages; ++i) {
    sent.push_back(pattern(1 + (i * 7919) % 20000, static_cast<std::uint32_t>(i)));
    reqs.push_back(p.ab->isend(sent.back().data(), sent.back().size(), i % 2).value());
  }
  for (int i = 1; i < kMessages; i += 2) reqs.push_back(p.ba->irecv(got[i].data(), got[i].size(), 0).value());
  auto deadline = Clock::now() + kTimeout;
  for (auto& r : reqs) ASSERT_TRUE(r->wait(deadline).isOk()) << r->status().toString();
  for (int i = 0; i < kMessages; ++i) {
    // Tag 0 messages are the odd i's only by construction of the receive buffers:
    // message i (tag i%2) must land in the i-th receive of its tag.
    int src = i % 2 == 0 ? i + 1 : i - 1;  // got[even] received tag 1 = odd sends
    ASSERT_EQ(0, std::memcmp(got[i].data(), sent[src].data(), sent[src].size())) << "message " << i;
  }
}

TEST(TcpChannelTest, BuffersMessagesThatArriveBeforeTheirReceive) {
  Pair p = connect(2, 1, 8192);
  Counter& unexpected = MetricsRegistry::global().counter(
      "meridian_transport_unexpected_bytes_total", "", {{"device", "b"}, {"peer", "0"}});
  const std::uint64_t before = unexpected.value();
  auto data = pattern(100000, 3);
  auto s = p.ab->isend(data.data(), data.size(), 9).value();
  ASSERT_TRUE(s->wait(Clock::now() + kTimeout).isOk());  // acknowledged while nobody receives
  EXPECT_EQ(unexpected.value() - before, data.size()) << "buffered bytes are counted";
  std::vector<std::uint8_t> out(data.size());
  auto r = p.ba->irecv(out.data(), out.size(), 9).value();
  ASSERT_TRUE(r->wait(Clock::now() + kTimeout).isOk());
  EXPECT_EQ(out, data);
}

// Bytes each path of `ch` has sent since `before`.
std::vector<double> sentShares(const ChannelPtr& ch, const std::vector<PathStats>& before) {
  auto after = ch->pathStats();
  std::vector<double> sent;
  double total = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    sent.push_back(static_cast<double>(after[i].bytesSent - before[i].bytesSent));
    total += sent.back();
  }
  for (auto& x : sent) x /= total > 0 ? total : 1;
  return sent;
}

TEST(TcpChannelTest, RoutingWeightsShiftChunksBetweenPaths) {
  Pair p = connect(2, 1, 256 * 1024);
  sendRecv(p, 8 << 20, 1);  // warm up: both paths have measured rates
  // A strong preference: loopback rate estimates swing widely on a loaded machine, and the
  // scheduler weighs rate x weight.
  const double weights[] = {1.0, 0.002};
  p.ab->setPathWeights(weights);
  auto stats = p.ab->pathStats();
  EXPECT_DOUBLE_EQ(stats[1].weight, 0.002);
  sendRecv(p, 32 << 20, 2);
  auto shares = sentShares(p.ab, stats);
  EXPECT_LT(shares[1], 0.2) << "the down-weighted path still took " << shares[1];
  // Back to neutral: path 1 carries its share again. A raised path restarts from an eighth of
  // the best path's rate and probes up to the best (RateEstimator::probe), so within a few
  // messages it carries about half; before issue 24 it stayed near the eighth (9-15%), or
  // below, for up to a dozen messages. Loopback shares on a loaded 2-core host swing from one
  // message to the next, so the test sends up to 12 messages (for 60 s at most) and wants two
  // in a row of a third or more.
  const double neutral[] = {1.0, 1.0};
  p.ab->setPathWeights(neutral);
  std::string seen;
  int inARow = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (std::uint64_t tag = 3; tag < 15 && inARow < 2 && Clock::now() < deadline; ++tag) {
    stats = p.ab->pathStats();
    sendRecv(p, 32 << 20, tag);
    shares = sentShares(p.ab, stats);
    seen += fmt::format(" {:.3f}", shares[1]);
    inARow = shares[1] >= 1.0 / 3 ? inARow + 1 : 0;
  }
  EXPECT_EQ(inARow, 2) << "after the weights went back to neutral, path 1's share of each message:" << seen;
}

// The kernel's own figures for each path (TCP_INFO), read about once a second.
TEST(TcpChannelTest, PathStatsCarryTheKernelsTcpFigures) {
  Pair p = connect(2, 2, 256 * 1024);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<PathStats> stats;
  for (std::uint64_t tag = 1; std::chrono::steady_clock::now() < deadline; ++tag) {
    sendRecv(p, 4 << 20, tag);
    stats = p.ab->pathStats();
    if (std::all_of(stats.begin(), stats.end(), [](const PathStats& s) { return s.telemetry.rttUs > 0; })) break;
  }
  ASSERT_EQ(stats.size(), 2u);
  for (const auto& s : stats) {
    EXPECT_GT(s.telemetry.rttUs, 0) << s.localAddress;
    EXPECT_LT(s.telemetry.rttUs, 1e6) << "loopback RTT under a second";
    EXPECT_GT(s.telemetry.deliveryBytesPerSec, 0) << s.localAddress;
  }
}

TEST(TcpChannelTest, StaticStripingIgnoresWeightsAndSplitsEvenly) {
  Pair p = connect(2, 1, 256 * 1024, 0, /*adaptive=*/false);
  const double weights[] = {1.0, 0.05};
  p.ab->setPathWeights(weights);
  auto stats = p.ab->pathStats();
  sendRecv(p, 32 << 20, 1);
  auto shares = sentShares(p.ab, stats);
  EXPECT_GT(shares[1], 0.35);
  EXPECT_LT(shares[1], 0.65);
}

TEST(TcpChannelTest, ReceiveSmallerThanMessageIsAnInvalidArgument) {
  Pair p = connect(1, 1);
  auto data = pattern(1000, 4);
  std::vector<std::uint8_t> small(10);
  auto r = p.ba->irecv(small.data(), small.size(), 1).value();
  auto s = p.ab->isend(data.data(), data.size(), 1).value();
  EXPECT_TRUE(s->wait(Clock::now() + kTimeout).isOk());
  EXPECT_EQ(r->wait(Clock::now() + kTimeout).code(), StatusCode::kInvalidArgument);
  // The channel goes on.
  sendRecv(p, 5000, 1);
}

TEST(TcpChannelTest, BothDirectionsAtOnce) {
  Pair p = connect(2, 2, 64 * 1024);
  auto x = pattern(8 << 20, 5), y = pattern(8 << 20, 6);
  std::vector<std::uint8_t> gx(x.size()), gy(y.size());
  auto r1 = p.ba->irecv(gx.data(), gx.size(), 0).value();
  auto r2 = p.ab->irecv(gy.data(), gy.size(), 0).value();
  auto s1 = p.ab->isend(x.data(), x.size(), 0).value();
  auto s2 = p.ba->isend(y.data(), y.size(), 0).value();
  auto deadline = Clock::now() + kTimeout;
  for (auto* r : {&r1, &r2, &s1, &s2}) ASSERT_TRUE((*r)->wait(deadline).isOk());
  EXPECT_EQ(gx, x);
  EXPECT_EQ(gy, y);
}

TEST(TcpChannelFailoverTest, MessageSurvivesAPathCutMidway) {
  // Cut path 0 while a 64 MiB message is in flight; it must arrive intact over path 1,
  // and path 0 must have carried part of it before the cut.
  constexpr std::size_t kBytes = 64u << 20;
  auto data = pattern(kBytes, 11);
  for (int attempt = 0; attempt < 5; ++attempt) {
    Pair p = connect(2, 1, 256 * 1024);
    std::vector<std::uint8_t> out(kBytes);
    auto r = p.ba->irecv(out.data(), out.size(), 0).value();
    auto s = p.ab->isend(data.data(), data.size(), 0).value();
    // Wait until path 0 has carried something, then cut it.
    while (p.ab->pathStats()[0].bytesSent == 0 && !s->done()) std::this_thread::yield();
    std::uint64_t carriedBeforeCut = p.ab->pathStats()[0].bytesSent;
    bool midway = !s->done();
    ASSERT_TRUE(p.a->cutPath(p.session, 1, 0).isOk());
    auto deadline = Clock::now() + kTimeout;
    ASSERT_TRUE(s->wait(deadline).isOk()) << s->status().toString();
    ASSERT_TRUE(r->wait(deadline).isOk()) << r->status().toString();
    ASSERT_EQ(r->bytes(), kBytes);
    ASSERT_TRUE(out == data) << "the message arrived corrupted";
    if (!midway) continue;  // the message beat the cut; try again
    auto stats = p.ab->pathStats();
    EXPECT_GT(carriedBeforeCut, 0u);
    EXPECT_FALSE(stats[0].alive);
    EXPECT_TRUE(stats[1].alive);
    EXPECT_GT(stats[1].bytesSent, kBytes / 4);
    // The channel keeps working on the surviving path.
    sendRecv(p, 3 << 20, 5);
    return;
  }
  FAIL() << "the message always finished before the cut; the test could not cut it midway";
}

TEST(TcpChannelFailoverTest, LosingEveryPathFailsPendingRequestsWithAPeerError) {
  Pair p = connect(2, 1);
  std::vector<std::uint8_t> out(100);
  auto r = p.ba->irecv(out.data(), out.size(), 0).value();
  ASSERT_TRUE(p.a->cutPath(p.session, 1, 0).isOk());
  ASSERT_TRUE(p.a->cutPath(p.session, 1, 1).isOk());
  Status st = r->wait(Clock::now() + kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_EQ(p.ba->health().code(), StatusCode::kPeerError);
  auto again = p.ab->isend(out.data(), out.size(), 0);
  EXPECT_FALSE(again.isOk());
}

TEST(TcpChannelTest, WrongSecretCannotOpenAChannel) {
  DeviceOptions o;
  o.secret = "right";
  auto server = TcpDevice::create(o).value();
  o.secret = "wrong";
  auto client = TcpDevice::create(o).value();
  auto ch = client->openChannel({1, 0, 1, true, server->endpoint()}, Clock::now() + std::chrono::seconds(10));
  ASSERT_FALSE(ch.isOk());
  EXPECT_EQ(ch.status().code(), StatusCode::kPeerError);
  EXPECT_NE(ch.status().message().find("secret"), std::string::npos) << ch.status().toString();
}

// Callers without stable ranks (NCCL's connections) name peers by host: a connector with a
// random id and the listener that accepts it both label their series with the other's IP.
TEST(TcpChannelTest, MetricsCanNameThePeerByHost) {
  DeviceOptions o;
  o.secret = "test-secret";
  o.labelPeersByHost = true;
  o.localAddresses = {"127.0.0.3"};
  o.name = "by-host-tx";
  auto a = TcpDevice::create(o).value();
  o.localAddresses = {"127.0.0.4"};
  o.name = "by-host-rx";
  auto b = TcpDevice::create(o).value();
  const std::uint64_t session = 0xb057;
  auto tx = a->openChannel({session, 912345, 0, true, b->endpoint()}, Clock::now() + kTimeout);
  ASSERT_TRUE(tx.isOk()) << tx.status().toString();
  Result<std::pair<int, ChannelPtr>> rx = againStatus("none yet");
  for (auto until = Clock::now() + kTimeout; !rx && rx.status().code() == StatusCode::kAgain && Clock::now() < until;) {
    rx = b->acceptChannel(session);
    if (!rx) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(rx.isOk()) << rx.status().toString();
  EXPECT_EQ(rx->first, 912345);
  auto data = pattern(300000, 5);
  std::vector<std::uint8_t> out(data.size());
  auto r = rx->second->irecv(out.data(), out.size(), 1).value();
  auto s = (*tx)->isend(data.data(), data.size(), 1).value();
  ASSERT_TRUE(s->wait(Clock::now() + kTimeout).isOk());
  ASSERT_TRUE(r->wait(Clock::now() + kTimeout).isOk());
  EXPECT_EQ(out, data);
  auto& reg = MetricsRegistry::global();
  const MetricLabels sent{{"device", "by-host-tx"}, {"peer", "127.0.0.4"}, {"path", "0"}};
  const MetricLabels received{{"device", "by-host-rx"}, {"peer", "127.0.0.3"}, {"path", "0"}};
  EXPECT_EQ(reg.counter("meridian_transport_path_sent_bytes_total", "", sent).value(), data.size());
  EXPECT_EQ(reg.counter("meridian_transport_path_received_bytes_total", "", received).value(), data.size());
  const MetricLabels byRank{{"device", "by-host-tx"}, {"peer", "0"}, {"path", "0"}};
  EXPECT_EQ(reg.counter("meridian_transport_path_sent_bytes_total", "", byRank).value(), 0u) << "no series by rank";
}

TEST(TcpChannelTest, AcceptTimesOutWhenThePeerNeverComes) {
  DeviceOptions o;
  o.secret = "x";
  auto d = TcpDevice::create(o).value();
  auto ch = d->openChannel({1, 1, 0, false, encodeEndpoint({"127.0.0.1:1"}).value()},
                           Clock::now() + std::chrono::milliseconds(200));
  EXPECT_EQ(ch.status().code(), StatusCode::kTimeout);
}

TEST(TcpChannelTest, RefusesBadArguments) {
  DeviceOptions o;
  o.secret = "x";
  o.localAddresses = {"not-an-ip-address.invalid"};
  EXPECT_FALSE(TcpDevice::create(o).isOk());
  o.localAddresses = {"127.0.0.1"};
  o.tcp.streamsPerPath = 99;
  EXPECT_EQ(TcpDevice::create(o).status().code(), StatusCode::kInvalidArgument);
  o.tcp.streamsPerPath = 1;
  auto d = TcpDevice::create(o).value();
  EXPECT_EQ(d->openChannel({1, 0, 0, true, d->endpoint()}, Clock::now()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d->openChannel({1, 0, 1, true, {}}, Clock::now()).status().code(), StatusCode::kInvalidArgument);
}

// One path, two streams; `aReadsB` / `bReadsA`: that side reads the other's memory (here the
// same process, through its own pid); `*SendsByAddress`: that side's large messages go by address.
Pair connectDirect(bool aReadsB, bool bReadsA, bool aSendsByAddress, bool bSendsByAddress) {
  return connect(1, 2, 0, 0, true, [&](Pair& p) {
    p.a->planDirectRead(p.session, 1, DirectReadPlan{aReadsB ? ::getpid() : 0, aSendsByAddress});
    p.b->planDirectRead(p.session, 0, DirectReadPlan{bReadsA ? ::getpid() : 0, bSendsByAddress});
  });
}

Counter& directReadBytes(const std::string& device) {
  return MetricsRegistry::global().counter("meridian_transport_direct_read_bytes_total", "", {{"device", device}});
}

TEST(DirectReadChannelTest, LargeMessagesTravelByAddressSmallOnesInline) {
  Pair p = connectDirect(true, true, true, true);
  Counter& readByB = directReadBytes("b");
  Counter& readByA = directReadBytes("a");
  const std::uint64_t before = readByB.value();
  const std::uint64_t beforeA = readByA.value();
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1000}, std::size_t{64 * 1024 + 1}, std::size_t{3u << 20}, std::size_t{(5u << 20) + 7}}) {
    auto data = pattern(bytes, static_cast<std::uint32_t>(bytes));
    std::vector<std::uint8_t> out(bytes + 16, 0xee);
    auto r = p.ba->irecv(out.data(), out.size(), 7);
    auto s = p.ab->isend(data.data(), data.size(), 7);
    ASSERT_TRUE(r.isOk() && s.isOk());
    auto deadline = Clock::now() + kTimeout;
    ASSERT_TRUE((*s)->wait(deadline).isOk()) << (*s)->status().toString();
    ASSERT_TRUE((*r)->wait(deadline).isOk()) << (*r)->status().toString();
    EXPECT_EQ((*r)->bytes(), bytes);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin())) << bytes << " bytes";
    EXPECT_EQ(out[bytes], 0xee) << "wrote past the message";
  }
  // Everything above the eager bound was read from the sender's memory, nothing else.
  EXPECT_EQ(readByB.value() - before, (64u * 1024 + 1) + (3u << 20) + (5u << 20) + 7);
  EXPECT_EQ(readByA.value(), beforeA);
  // The path still counts what it carried, as routing and the metrics expect.
  EXPECT_GE(p.ab->pathStats().at(0).bytesSent, (8u << 20));
}

TEST(DirectReadChannelTest, AMessageSentBeforeItsReceiveIsReadIntoABufferAndDelivered) {
  Pair p = connectDirect(true, true, true, true);
  auto data = pattern(2u << 20, 3);
  auto s = p.ab->isend(data.data(), data.size(), 9);
  ASSERT_TRUE(s.isOk());
  auto deadline = Clock::now() + kTimeout;
  ASSERT_TRUE((*s)->wait(deadline).isOk()) << "an unexpected message is read (and acknowledged) at once";
  std::fill(data.begin(), data.end(), 0);  // the sender owns its buffer again
  std::vector<std::uint8_t> out(2u << 20);
  auto r = p.ba->irecv(out.data(), out.size(), 9);
  ASSERT_TRUE(r.isOk());
  ASSERT_TRUE((*r)->wait(deadline).isOk());
  EXPECT_EQ(out, pattern(2u << 20, 3));
}

TEST(DirectReadChannelTest, AnAddressSentToAChannelThatDoesNotReadFailsCleanly) {
  // a sends by address, but b never agreed to read a's memory.
  Pair p = connectDirect(false, false, true, false);
  auto data = pattern(1u << 20, 5);
  std::vector<std::uint8_t> out(1u << 20);
  auto r = p.ba->irecv(out.data(), out.size(), 1);
  auto s = p.ab->isend(data.data(), data.size(), 1);
  ASSERT_TRUE(r.isOk() && s.isOk());
  auto deadline = Clock::now() + kTimeout;
  Status rs = (*r)->wait(deadline);
  EXPECT_FALSE(rs.isOk());
  EXPECT_NE(rs.code(), StatusCode::kTimeout);
  EXPECT_FALSE((*s)->wait(deadline).isOk());
  EXPECT_FALSE(p.ba->health().isOk());
}

}  // namespace
}  // namespace meridian::transport::tcp
