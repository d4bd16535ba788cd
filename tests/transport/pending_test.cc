// Connections before authentication: PendingConnections' caps, eviction and deadlines, and a
// TCP device's data listener under a flood of idle connections; a handshake the server never
// answers is a timeout on the client's side.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <thread>

#include "tests/common/flood.h"
#include "tests/common/poll.h"
#include "tests/common/resources.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/pending.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {
namespace {

using meridian::testing::closedByPeer;
using meridian::testing::pollUntil;
using std::chrono::milliseconds;

constexpr char kSecret[] = "pending-test-secret";
constexpr std::size_t kFlood = 2000;
constexpr std::size_t kMaxPendingPerSource = 32;  // device_impl.h

TEST(PendingConnectionsTest, ASourceAtItsCapGivesUpItsOwnOldest) {
  PendingConnections p(PendingLimits{8, 2, milliseconds(1000)});
  const TimePoint t0 = Clock::now();
  EXPECT_EQ(p.admit(10, 1, t0).evictedFd, -1);
  EXPECT_EQ(p.admit(11, 2, t0).evictedFd, -1);
  EXPECT_EQ(p.admit(12, 1, t0).evictedFd, -1);
  const auto third = p.admit(13, 1, t0);
  EXPECT_EQ(third.evictedFd, 10) << "source 1's oldest, not source 2's";
  EXPECT_EQ(third.why, PendingConnections::Eviction::kSourceFull);
  EXPECT_EQ(p.fromSource(1), 2u);
  EXPECT_EQ(p.fromSource(2), 1u);
  EXPECT_EQ(p.size(), 3u);
}

TEST(PendingConnectionsTest, AFullListenerGivesUpTheOldestOfAll) {
  PendingConnections p(PendingLimits{3, 3, milliseconds(1000)});
  const TimePoint t0 = Clock::now();
  for (int fd = 0; fd < 3; ++fd) EXPECT_EQ(p.admit(fd, static_cast<std::uint32_t>(fd), t0).evictedFd, -1);
  const auto next = p.admit(7, 9, t0);
  EXPECT_EQ(next.evictedFd, 0);
  EXPECT_EQ(next.why, PendingConnections::Eviction::kListenerFull);
  EXPECT_EQ(p.size(), 3u);
  p.remove(1);
  p.remove(1);  // twice is harmless
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.admit(8, 9, t0).evictedFd, -1);
}

TEST(PendingConnectionsTest, DeadlinesExpireOldestFirst) {
  PendingConnections p(PendingLimits{8, 8, milliseconds(100)});
  const TimePoint t0 = Clock::now();
  p.admit(1, 1, t0);
  p.admit(2, 1, t0 + milliseconds(50));
  EXPECT_EQ(p.nextDeadline(), t0 + milliseconds(100));
  EXPECT_TRUE(p.expire(t0 + milliseconds(99)).empty());
  EXPECT_EQ(p.expire(t0 + milliseconds(100)), std::vector<int>{1});
  EXPECT_EQ(p.expire(t0 + milliseconds(1000)), std::vector<int>{2});
  EXPECT_EQ(p.nextDeadline(), TimePoint::max());
  EXPECT_EQ(p.fromSource(1), 0u);
}

std::unique_ptr<TcpDevice> device(const char* name) {
  DeviceOptions o;
  o.secret = kSecret;
  o.tcp.streamsPerPath = 2;
  o.name = name;
  auto d = TcpDevice::create(o);
  EXPECT_TRUE(d) << d.status().toString();
  return d ? std::move(d).value() : nullptr;
}

// The attack run's flood, on a data port: 2,000 idle connections, then two devices open a
// channel and carry a message.
TEST(DataListenerLimitsTest, AFloodOfIdleConnectionsLeavesRoomForAChannel) {
  if (!meridian::testing::raiseOpenFileLimit(kFlood + 1024)) {
    GTEST_SKIP() << "cannot raise RLIMIT_NOFILE to " << kFlood + 1024 << " (the hard limit is lower)";
  }
  meridian::testing::LogLineCounter logLines;
  auto victim = device("victim");
  auto peer = device("peer");
  ASSERT_TRUE(victim && peer);
  const std::uint64_t rssBefore = meridian::testing::residentBytes();
  const HostPort port = parseHostPort(victim->listenAddresses()[0]).value();
  const std::vector<UniqueFd> flood = meridian::testing::floodIdleConnections(port, "127.0.0.1", kFlood, kMaxPendingPerSource);
  ASSERT_EQ(flood.size(), kFlood) << "the listener fell behind: " << closedByPeer(flood) << " closed";
  EXPECT_GE(closedByPeer(flood), kFlood - kMaxPendingPerSource);
  // The peer's streams come from the flood's own address: each evicts an idle one and
  // finishes its handshake in a round trip.
  const TimePoint deadline = Clock::now() + milliseconds(20000);
  Result<ChannelPtr> accepted = internalError("not run");
  std::thread t([&] { accepted = victim->openChannel({7, 0, 1, false, peer->endpoint()}, deadline); });
  auto opened = peer->openChannel({7, 1, 0, true, victim->endpoint()}, deadline);
  t.join();
  ASSERT_TRUE(opened) << opened.status().toString();
  ASSERT_TRUE(accepted) << accepted.status().toString();
  std::vector<int> sent(4096), got(4096);
  for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<int>(i * 7 + 1);
  auto r = (*accepted)->irecv(got.data(), got.size() * sizeof(int), 3).value();
  auto s = (*opened)->isend(sent.data(), sent.size() * sizeof(int), 3).value();
  ASSERT_TRUE(s->wait(deadline));
  ASSERT_TRUE(r->wait(deadline));
  EXPECT_EQ(sent, got);
  const std::uint64_t rssAfter = meridian::testing::residentBytes();
  EXPECT_LT(rssAfter, rssBefore + (64u << 20)) << "RSS " << rssBefore << " -> " << rssAfter;
  EXPECT_LT(logLines.lines(), 60u);
  std::printf("[ figures  ] data port flood of %zu: RSS %.1f -> %.1f MiB, %llu log lines\n", kFlood,
              static_cast<double>(rssBefore) / (1 << 20), static_cast<double>(rssAfter) / (1 << 20),
              static_cast<unsigned long long>(logLines.lines()));
}

// Whatever a listener accepts answers without Nagle's delay (the store pipelines requests
// and read a second answer ~40 ms late when its socket had it).
TEST(ListenOnTest, AcceptedSocketsHaveNoDelaySet) {
  auto listener = listenOn("127.0.0.1", 0, /*nonBlocking=*/false);
  ASSERT_TRUE(listener) << listener.status().toString();
  auto remote = splitHostPort(localAddress(listener->get()));
  ASSERT_TRUE(remote) << remote.status().toString();
  auto client = connectTo(remote.value(), "", Clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(client) << client.status().toString();
  UniqueFd accepted(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(accepted.valid()) << errno;
  int on = 0;
  socklen_t len = sizeof(on);
  ASSERT_EQ(::getsockopt(accepted.get(), IPPROTO_TCP, TCP_NODELAY, &on, &len), 0);
  EXPECT_EQ(on, 1);
}

TEST(DataListenerLimitsTest, APeerThatNeverAnswersTheHandshakeIsATimeout) {
  auto listener = listenOn("127.0.0.1", 0, /*nonBlocking=*/true);  // never accepts, never answers
  ASSERT_TRUE(listener) << listener.status().toString();
  auto d = device("client");
  ASSERT_TRUE(d);
  auto endpoint = encodeEndpoint({localAddress(listener->get())});
  ASSERT_TRUE(endpoint);
  auto ch = d->openChannel({9, 0, 1, true, endpoint.value()}, Clock::now() + milliseconds(300));
  ASSERT_FALSE(ch);
  EXPECT_EQ(ch.status().code(), StatusCode::kTimeout) << ch.status().toString();
  EXPECT_NE(ch.status().message().find("timed out waiting for the handshake"), std::string::npos)
      << ch.status().message();
  EXPECT_EQ(ch.status().message().find("secret"), std::string::npos) << ch.status().message();
}

}  // namespace
}  // namespace meridian::transport::tcp
