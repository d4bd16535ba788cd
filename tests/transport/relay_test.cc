// Relay paths: a channel's relay slot connected through a third device, which splices the
// streams through (transport/tcp/splice.h). Three (or four) devices in one process over
// loopback, and the splice itself on socket pairs.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>

#include "core/metrics.h"
#include "transport/tcp/splice.h"
#include "transport/tcp/tcp_device.h"
#include "tests/transport/test_pattern.h"

namespace meridian::transport::tcp {
namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
constexpr std::uint64_t kSession = 0x7e1a;

// Devices 0..n-1 ("ra", "rb", ...), two loopback paths each, every one with a relay slot;
// channels[i][j] is i's channel to j for the pairs in `links`.
struct Mesh {
  std::vector<std::unique_ptr<TcpDevice>> dev;
  std::vector<std::vector<ChannelPtr>> ch;
};

Mesh makeMesh(int n, const std::vector<std::pair<int, int>>& links) {
  Mesh m;
  for (int i = 0; i < n; ++i) {
    DeviceOptions o;
    o.localAddresses = {"127.0.0.1", "127.0.0.2"};
    o.tcp.streamsPerPath = 2;
    o.chunkBytes = 256 * 1024;
    o.secret = "relay-secret";
    o.name = std::string("r") + static_cast<char>('a' + i);
    o.relaySlot = true;
    auto d = TcpDevice::create(o);
    EXPECT_TRUE(d.isOk()) << d.status().toString();
    m.dev.push_back(std::move(d.value()));
  }
  m.ch.assign(static_cast<std::size_t>(n), std::vector<ChannelPtr>(static_cast<std::size_t>(n)));
  const auto deadline = Clock::now() + kTimeout;
  for (auto [i, j] : links) {
    Result<ChannelPtr> back = internalError("not run");
    std::thread acceptor([&, i = i, j = j] {
      back = m.dev[static_cast<std::size_t>(j)]->openChannel({kSession, j, i, false, m.dev[static_cast<std::size_t>(i)]->endpoint()},
                                                            deadline);
    });
    auto fwd = m.dev[static_cast<std::size_t>(i)]->openChannel({kSession, i, j, true, m.dev[static_cast<std::size_t>(j)]->endpoint()},
                                                              deadline);
    acceptor.join();
    EXPECT_TRUE(fwd.isOk()) << fwd.status().toString();
    EXPECT_TRUE(back.isOk()) << back.status().toString();
    m.ch[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = fwd.value();
    m.ch[static_cast<std::size_t>(j)][static_cast<std::size_t>(i)] = back.value();
  }
  return m;
}

RelaySpec relay(const Mesh& m, int self, int peer, int via, int plane = 0) {
  return RelaySpec{kSession, self, peer, via, m.dev[static_cast<std::size_t>(via)]->endpoint(), plane};
}

// `bytes` each way between x and y at once; every byte checked.
void exchange(const ChannelPtr& xy, const ChannelPtr& yx, std::size_t bytes, std::uint64_t tag) {
  auto a = pattern(bytes, 1), b = pattern(bytes, 2);
  std::vector<std::uint8_t> atY(bytes), atX(bytes);
  auto r1 = yx->irecv(atY.data(), bytes, tag);
  auto r2 = xy->irecv(atX.data(), bytes, tag);
  auto s1 = xy->isend(a.data(), bytes, tag);
  auto s2 = yx->isend(b.data(), bytes, tag);
  ASSERT_TRUE(r1.isOk() && r2.isOk() && s1.isOk() && s2.isOk());
  const auto deadline = Clock::now() + kTimeout;
  for (auto* r : {&s1, &s2, &r1, &r2}) ASSERT_TRUE((**r)->wait(deadline).isOk()) << (**r)->status().toString();
  EXPECT_TRUE(atY == a);
  EXPECT_TRUE(atX == b);
}

const PathStats& relaySlot(const std::vector<PathStats>& s) { return s.back(); }

bool waitFor(const std::function<bool()>& cond) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

double relayedBytes(const std::string& device) {
  return static_cast<double>(MetricsRegistry::global()
                                 .counter("meridian_transport_relayed_bytes_total", "", {{"device", device}})
                                 .value());
}

TEST(RelayTest, TheSlotIsDownUntilOpenedAndCarriesTrafficThroughTheThirdRank) {
  Mesh m = makeMesh(3, {{0, 1}, {0, 2}, {1, 2}});
  const auto& ab = m.ch[0][1];
  const auto& ba = m.ch[1][0];
  ASSERT_EQ(ab->pathStats().size(), 3u);
  EXPECT_TRUE(relaySlot(ab->pathStats()).relay);
  EXPECT_FALSE(relaySlot(ab->pathStats()).alive) << "a relay slot starts down";
  exchange(ab, ba, 4 << 20, 1);  // direct paths only
  EXPECT_EQ(relaySlot(ab->pathStats()).bytesSent, 0u);

  const double before = relayedBytes("rc");
  ASSERT_TRUE(m.dev[0]->openRelay(relay(m, 0, 1, 2), Clock::now() + kTimeout).isOk());
  EXPECT_TRUE(relaySlot(ab->pathStats()).alive);
  EXPECT_EQ(relaySlot(ab->pathStats()).relayVia, 2);
  ASSERT_TRUE(waitFor([&] { return relaySlot(ba->pathStats()).alive; })) << "the far end never saw the relay";
  EXPECT_EQ(relaySlot(ba->pathStats()).relayVia, 2);
  EXPECT_EQ(m.dev[0]->openRelay(relay(m, 0, 1, 2), Clock::now() + kTimeout).code(), StatusCode::kAgain)
      << "a second relay while one is up";

  // Cut both direct paths: everything now goes through rank 2, both ways, intact.
  ASSERT_TRUE(m.dev[0]->cutPath(kSession, 1, 0).isOk());
  ASSERT_TRUE(m.dev[0]->cutPath(kSession, 1, 1).isOk());
  exchange(ab, ba, 32 << 20, 2);
  EXPECT_GE(relaySlot(ab->pathStats()).bytesSent, 32u << 20);
  EXPECT_GE(relaySlot(ba->pathStats()).bytesSent, 32u << 20);
  EXPECT_GE(relayedBytes("rc") - before, 64.0 * (1 << 20)) << "rank 2 forwarded both directions";
  EXPECT_TRUE(ab->health().isOk());
}

TEST(RelayTest, ClosingTheRelayMovesTrafficBackAndTheSlotCanBeUsedAgain) {
  Mesh m = makeMesh(3, {{0, 1}, {0, 2}, {1, 2}});
  const auto& ab = m.ch[0][1];
  const auto& ba = m.ch[1][0];
  // Rank 1 (the higher one) opens it this time, on plane 1.
  ASSERT_TRUE(m.dev[1]->openRelay(relay(m, 1, 0, 2, 1), Clock::now() + kTimeout).isOk());
  ASSERT_TRUE(waitFor([&] { return relaySlot(ab->pathStats()).alive; }));
  exchange(ab, ba, 8 << 20, 1);
  ASSERT_TRUE(m.dev[1]->closeRelay(kSession, 0).isOk());
  EXPECT_FALSE(relaySlot(ba->pathStats()).alive);
  ASSERT_TRUE(waitFor([&] { return !relaySlot(ab->pathStats()).alive; })) << "the far end kept a closed relay";
  EXPECT_EQ(m.dev[1]->closeRelay(kSession, 0).code(), StatusCode::kInvalidArgument) << "nothing left to close";
  const auto sent = relaySlot(ab->pathStats()).bytesSent;
  exchange(ab, ba, 8 << 20, 2);
  EXPECT_EQ(relaySlot(ab->pathStats()).bytesSent, sent) << "a closed relay carried data";
  EXPECT_TRUE(ab->health().isOk() && ba->health().isOk()) << "closing a relay on purpose is not an error";
  // Open again, from the other side.
  ASSERT_TRUE(m.dev[0]->openRelay(relay(m, 0, 1, 2), Clock::now() + kTimeout).isOk());
  ASSERT_TRUE(waitFor([&] { return relaySlot(ba->pathStats()).alive; }));
  exchange(ab, ba, 8 << 20, 3);
}

TEST(RelayTest, TheRelayRankGoingAwayLosesNothing) {
  Mesh m = makeMesh(3, {{0, 1}, {0, 2}, {1, 2}});
  const auto& ab = m.ch[0][1];
  const auto& ba = m.ch[1][0];
  ASSERT_TRUE(m.dev[0]->openRelay(relay(m, 0, 1, 2), Clock::now() + kTimeout).isOk());
  ASSERT_TRUE(waitFor([&] { return relaySlot(ba->pathStats()).alive; }));
  const double preferRelay[] = {0.01, 0.01, 1.0};
  ab->setPathWeights(preferRelay);
  ba->setPathWeights(preferRelay);
  const std::size_t bytes = 64 << 20;
  auto a = pattern(bytes, 7);
  std::vector<std::uint8_t> atB(bytes);
  auto r = ba->irecv(atB.data(), bytes, 9);
  auto s = ab->isend(a.data(), bytes, 9);
  ASSERT_TRUE(r.isOk() && s.isOk());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  m.dev[2].reset();  // rank 2 goes away with its relay mid-transfer
  const auto deadline = Clock::now() + kTimeout;
  ASSERT_TRUE((*s)->wait(deadline).isOk()) << (*s)->status().toString();
  ASSERT_TRUE((*r)->wait(deadline).isOk()) << (*r)->status().toString();
  EXPECT_TRUE(atB == a);
  EXPECT_TRUE(waitFor([&] { return !relaySlot(ab->pathStats()).alive && !relaySlot(ba->pathStats()).alive; }));
  exchange(ab, ba, 4 << 20, 10);
}

TEST(RelayTest, ARankRelaysOnlyBetweenMembersOfItsSessions) {
  // Rank 3 knows rank 0 but has no channel to rank 1: it refuses to relay there.
  Mesh m = makeMesh(4, {{0, 1}, {0, 3}});
  EXPECT_EQ(m.dev[0]->openRelay(relay(m, 0, 1, 3), Clock::now() + kTimeout).code(), StatusCode::kPeerError);
  EXPECT_FALSE(relaySlot(m.ch[0][1]->pathStats()).alive);
  EXPECT_TRUE(m.ch[0][1]->health().isOk());
  EXPECT_TRUE(m.ch[0][3]->health().isOk());
  exchange(m.ch[0][1], m.ch[1][0], 1 << 20, 1);
  // Bad requests are refused locally.
  EXPECT_EQ(m.dev[0]->openRelay(relay(m, 0, 1, 1), Clock::now() + kTimeout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.dev[0]->openRelay(relay(m, 0, 2, 3), Clock::now() + kTimeout).code(), StatusCode::kInvalidArgument)
      << "no channel to rank 2";
  auto bad = relay(m, 0, 1, 3);
  bad.plane = 5;
  EXPECT_EQ(m.dev[0]->openRelay(bad, Clock::now() + kTimeout).code(), StatusCode::kInvalidArgument);
}

TEST(RelayTest, WithoutARelaySlotOpenRelayIsAnInvalidArgument) {
  DeviceOptions o;
  o.secret = "relay-secret";
  auto a = TcpDevice::create(o);
  auto b = TcpDevice::create(o);
  ASSERT_TRUE(a.isOk() && b.isOk());
  const auto deadline = Clock::now() + kTimeout;
  std::thread acceptor([&] { (void)(*b)->openChannel({kSession, 1, 0, false, (*a)->endpoint()}, deadline); });
  auto ab = (*a)->openChannel({kSession, 0, 1, true, (*b)->endpoint()}, deadline);
  acceptor.join();
  ASSERT_TRUE(ab.isOk());
  EXPECT_EQ((*ab)->pathStats().size(), 1u) << "no relay slot without DeviceOptions::relaySlot";
  RelaySpec spec{kSession, 0, 1, 2, (*b)->endpoint(), 0};
  EXPECT_EQ((*a)->openRelay(spec, deadline).code(), StatusCode::kInvalidArgument);
}

// ---- the splice on its own

struct SocketPair {
  int near = -1, far = -1;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    near = fds[0];
    far = fds[1];
  }
};

TEST(SpliceTest, ForwardsBothWaysInOrderAndPassesTheEndOfStreamOn) {
  SocketPair x, y;  // x.far is "rank A", y.far is "rank B"; the splice holds x.near and y.near
  Splice sp{UniqueFd(x.near), UniqueFd(y.near), 4096};
  auto data = pattern(1 << 20, 3);
  std::vector<std::uint8_t> got;
  std::size_t sent = 0;
  std::uint8_t buf[65536];
  bool closed = false;
  for (int rounds = 0; rounds < 100000 && got.size() < data.size(); ++rounds) {
    if (sent < data.size()) {
      ssize_t n = ::send(x.far, data.data() + sent, std::min<std::size_t>(data.size() - sent, 32768), MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
    } else if (!closed) {
      ::shutdown(x.far, SHUT_WR);
      closed = true;
    }
    ASSERT_EQ(sp.pump(), Splice::State::kRunning);
    ssize_t n = ::recv(y.far, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) got.insert(got.end(), buf, buf + n);
  }
  ASSERT_TRUE(got == data) << "got " << got.size() << " of " << data.size() << " bytes";
  // B answers and ends too: the splice finishes once both ends are through.
  const char reply[] = "ok";
  ASSERT_EQ(::send(y.far, reply, 2, 0), 2);
  if (!closed) ::shutdown(x.far, SHUT_WR);
  ::shutdown(y.far, SHUT_WR);
  Splice::State st = Splice::State::kRunning;
  for (int i = 0; i < 1000 && st == Splice::State::kRunning; ++i) st = sp.pump();
  EXPECT_EQ(st, Splice::State::kDone);
  EXPECT_EQ(::recv(x.far, buf, sizeof(buf), MSG_DONTWAIT), 2);
  EXPECT_EQ(::recv(x.far, buf, sizeof(buf), MSG_DONTWAIT), 0) << "A must see B's end of stream";
  EXPECT_EQ(::recv(y.far, buf, sizeof(buf), MSG_DONTWAIT), 0) << "B must see A's end of stream";
  EXPECT_EQ(sp.bytesForwarded(), data.size() + 2);
  ::close(x.far);
  ::close(y.far);
}

TEST(SpliceTest, ABrokenEndFailsTheSplice) {
  SocketPair x, y;
  Splice sp{UniqueFd(x.near), UniqueFd(y.near), 4096};
  ASSERT_EQ(sp.pump(), Splice::State::kRunning);
  ::close(y.far);  // B vanishes; A's bytes have nowhere to go
  const char msg[] = "hello";
  ASSERT_EQ(::send(x.far, msg, sizeof(msg), 0), static_cast<ssize_t>(sizeof(msg)));
  Splice::State st = Splice::State::kRunning;
  for (int i = 0; i < 100 && st == Splice::State::kRunning; ++i) st = sp.pump();
  EXPECT_EQ(st, Splice::State::kFailed);
  EXPECT_FALSE(sp.error().empty());
  ::close(x.far);
}

}  // namespace
}  // namespace meridian::transport::tcp
