// The store's limits before authentication (floods of idle connections, handshake deadlines)
// and after it (value sizes, the budget, idle connections), and timeouts said as timeouts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <thread>

#include "bootstrap/store.h"
#include "core/wire.h"
#include "tests/common/flood.h"
#include "tests/common/poll.h"
#include "tests/common/resources.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace {

namespace tcp = transport::tcp;
using meridian::testing::closedByPeer;
using meridian::testing::pollUntil;
using std::chrono::milliseconds;

constexpr const char* kSecret = "meridian-test-secret";
constexpr std::size_t kFlood = 2000;

std::vector<std::uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }
TimePoint in(milliseconds ms) { return Clock::now() + ms; }

std::unique_ptr<StoreServer> startServer(const StoreLimits& limits) {
  auto server = StoreServer::start("127.0.0.1", 0, kSecret, limits);
  EXPECT_TRUE(server) << server.status().toString();
  return server ? std::move(server).value() : nullptr;
}

std::string addressOf(const StoreServer& server) { return fmt::format("127.0.0.1:{}", server.port()); }

// A SET and a GET of it; the error when either fails or the value comes back changed.
Status setAndGet(Store& store, const std::string& key) {
  MERIDIAN_RETURN_IF_ERROR(store.set(key, bytes("alive")));
  auto got = store.get(key, in(milliseconds(10000)));
  if (!got) return got.status();
  if (std::string(got->begin(), got->end()) != "alive") return internalError("'{}' came back changed", key);
  return Status::ok();
}

void expectServes(Store& store, const std::string& key) {
  const Status served = setAndGet(store, key);
  EXPECT_TRUE(served) << served.toString();
}

// An authenticated raw connection, to send what TcpStore never would.
struct RawClient {
  UniqueFd fd;
  std::unique_ptr<tcp::SealedSocket> conn;
};

RawClient rawClient(std::uint16_t port) {
  RawClient c;
  auto fd = tcp::connectTo(tcp::HostPort{"127.0.0.1", port}, "", in(milliseconds(10000)));
  EXPECT_TRUE(fd) << fd.status().toString();
  if (!fd) return c;
  tcp::ConnectInfo info;
  info.kind = tcp::ConnectionKind::kStore;
  auto keys = tcp::clientHandshake(fd->get(), kSecret, WireSecurity::kEncrypt, info, in(milliseconds(10000)));
  EXPECT_TRUE(keys) << keys.status().toString();
  if (!keys) return c;
  c.conn = std::make_unique<tcp::SealedSocket>(fd->get(), keys.value());
  c.fd = std::move(fd).value();
  return c;
}

// A SET header and its key, announcing `valueBytes` that never follow.
std::vector<std::uint8_t> announceSet(const std::string& key, std::uint32_t valueBytes) {
  std::vector<std::uint8_t> f(kStoreRequestHeaderBytes + 4 + key.size());
  wire::store<std::uint32_t>(f.data(), kStoreMagic);
  wire::store<std::uint16_t>(f.data() + 4, kStoreProtocolVersion);
  f[6] = static_cast<std::uint8_t>(StoreOp::kSet);
  wire::store<std::uint32_t>(f.data() + 8, 1);
  wire::store<std::uint32_t>(f.data() + 12, valueBytes);
  wire::store<std::uint32_t>(f.data() + kStoreRequestHeaderBytes, static_cast<std::uint32_t>(key.size()));
  std::memcpy(f.data() + kStoreRequestHeaderBytes + 4, key.data(), key.size());
  return f;
}

// ---- Before authentication ----------------------------------------------------------

// The attack run: 1,100 idle connections kept rank 1 out and its error blamed the secret.
TEST(StoreLimitsTest, AFloodOfIdleConnectionsLeavesRoomForARealClient) {
  if (!meridian::testing::raiseOpenFileLimit(kFlood + 1024)) {
    GTEST_SKIP() << "cannot raise RLIMIT_NOFILE to " << kFlood + 1024 << " (the hard limit is lower)";
  }
  meridian::testing::LogLineCounter logLines;
  auto server = startServer(StoreLimits{});
  ASSERT_TRUE(server);
  const std::uint64_t rssBefore = meridian::testing::residentBytes();
  const std::size_t perSource = server->limits().pending.perSource;
  std::vector<UniqueFd> flood;
  std::thread flooder([&] {
    flood = meridian::testing::floodIdleConnections({"127.0.0.1", server->port()}, "127.0.0.2", kFlood, perSource);
  });
  // While the flood goes on, a rank from another address joins and works.
  auto store = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  const Status during = store ? setAndGet(*store.value(), "during") : store.status();
  flooder.join();
  EXPECT_TRUE(during) << during.toString();
  // The server closed all but the newest few of the flood at once...
  ASSERT_EQ(flood.size(), kFlood) << "the server fell behind: " << closedByPeer(flood) << " closed";
  EXPECT_GE(closedByPeer(flood), kFlood - perSource);
  EXPECT_LE(server->pendingCount(), perSource);
  // ...and a client from the flood's own address still gets in once it is accepted.
  auto again = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(again) << again.status().toString();
  expectServes(*again.value(), "after");
  const std::uint64_t rssAfter = meridian::testing::residentBytes();
  EXPECT_LT(rssAfter, rssBefore + (64u << 20)) << "RSS " << rssBefore << " -> " << rssAfter;
  // A line per refusal would be ~2,000 lines; a few a second per reason get through.
  EXPECT_LT(logLines.lines(), 60u);
  EXPECT_GE(server->refusalLinesSuppressed() + server->refusalLinesPrinted(), kFlood - 2 * perSource);
  std::printf("[ figures  ] flood of %zu: RSS %.1f -> %.1f MiB, %llu log lines, %llu suppressed, %zu pending\n", kFlood,
              static_cast<double>(rssBefore) / (1 << 20), static_cast<double>(rssAfter) / (1 << 20),
              static_cast<unsigned long long>(logLines.lines()),
              static_cast<unsigned long long>(server->refusalLinesSuppressed()), server->pendingCount());
}

TEST(StoreLimitsTest, AHandshakeThatNeverFinishesIsClosedAtItsDeadline) {
  StoreLimits limits;
  limits.pending.handshakeTimeout = milliseconds(200);
  auto server = startServer(limits);
  ASSERT_TRUE(server);
  auto fd = tcp::connectTo(tcp::HostPort{"127.0.0.1", server->port()}, "", in(milliseconds(10000)));
  ASSERT_TRUE(fd) << fd.status().toString();
  const TimePoint start = Clock::now();
  std::uint8_t byte = 0;
  Status closed = tcp::recvAll(fd->get(), &byte, 1, in(milliseconds(10000)));
  EXPECT_EQ(closed.code(), StatusCode::kPeerError) << closed.toString();
  EXPECT_GE(Clock::now() - start, milliseconds(150));
  EXPECT_TRUE(pollUntil([&] { return server->pendingCount() == 0; }, milliseconds(5000)));
}

TEST(StoreLimitsTest, AServerThatNeverAnswersTheHandshakeIsATimeoutNotASecretProblem) {
  auto listener = tcp::listenOn("127.0.0.1", 0, /*nonBlocking=*/true);  // never accepts, never answers
  ASSERT_TRUE(listener) << listener.status().toString();
  const std::string address = tcp::localAddress(listener->get());
  auto store = TcpStore::connect(address, kSecret, in(milliseconds(300)));
  ASSERT_FALSE(store);
  EXPECT_EQ(store.status().code(), StatusCode::kTimeout) << store.status().toString();
  EXPECT_NE(store.status().message().find("timed out waiting for the handshake"), std::string::npos)
      << store.status().message();
  EXPECT_EQ(store.status().message().find("secret"), std::string::npos) << store.status().message();
}

// ---- After authentication -----------------------------------------------------------

TEST(StoreLimitsTest, AnnouncedButUnsentValuesCostNothingAndTheBudgetHolds) {
  auto server = startServer(StoreLimits{});  // 64 MiB values, a 256 MiB budget
  ASSERT_TRUE(server);
  const std::uint64_t rssBefore = meridian::testing::residentBytes();
  std::vector<RawClient> announcers;
  for (int i = 0; i < 8; ++i) {
    announcers.push_back(rawClient(server->port()));
    ASSERT_TRUE(announcers.back().conn);
    ASSERT_TRUE(announcers.back().conn->send(announceSet(fmt::format("big/{}", i), 64u << 20), in(milliseconds(10000))));
  }
  auto store = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(store) << store.status().toString();
  // The eight are read (and wait for their bytes); everyone else carries on meanwhile.
  expectServes(*store.value(), "small");
  ASSERT_TRUE(pollUntil([&] { return server->clientCount() == 9; }, milliseconds(10000)));
  const std::uint64_t rssAfter = meridian::testing::residentBytes();
  EXPECT_LT(rssAfter, rssBefore + (64u << 20)) << "RSS " << rssBefore << " -> " << rssAfter;
  std::printf("[ figures  ] 8 x 64 MiB announced: RSS %.1f -> %.1f MiB\n", static_cast<double>(rssBefore) / (1 << 20),
              static_cast<double>(rssAfter) / (1 << 20));
}

TEST(StoreLimitsTest, ValuesOverTheLimitAndSetsOverTheBudgetAreRefusedClearly) {
  StoreLimits limits;
  limits.maxValueBytes = 1 << 20;
  limits.maxBytes = 4 << 20;
  auto server = startServer(limits);
  ASSERT_TRUE(server);
  auto store = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(store) << store.status().toString();
  TcpStore& s = *store.value();
  const std::vector<std::uint8_t> tooBig((1 << 20) + 1, 7);
  Status refused = s.set("too-big", tooBig);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.toString();
  EXPECT_NE(refused.message().find("MERIDIAN_STORE_MAX_VALUE_BYTES"), std::string::npos) << refused.message();
  expectServes(s, "after-too-big");  // the connection stays usable
  const std::vector<std::uint8_t> mib(1 << 20, 9);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.set(fmt::format("v/{}", i), mib));
  Status over = s.set("v/3", mib);
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument) << over.toString();
  EXPECT_NE(over.message().find("MERIDIAN_STORE_MAX_BYTES"), std::string::npos) << over.message();
  EXPECT_LE(server->bytesHeld(), limits.maxBytes);
  ASSERT_TRUE(s.del("v/0").value());
  EXPECT_TRUE(s.set("v/3", mib)) << "room again once a value is gone";
  expectServes(s, "end");
}

TEST(StoreLimitsTest, AnIdleClientIsClosedAndReconnectsButABlockedGetIsNotIdle) {
  StoreLimits limits;
  limits.idleTimeout = milliseconds(300);
  auto server = startServer(limits);
  ASSERT_TRUE(server);
  auto waiter = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(waiter) << waiter.status().toString();
  Result<std::vector<std::uint8_t>> got = internalError("not run");
  std::thread getter([&] { got = waiter.value()->get("later", in(milliseconds(30000))); });
  ASSERT_TRUE(pollUntil([&] { return server->waiterCount() == 1; }, milliseconds(10000)));
  auto idle = TcpStore::connect(addressOf(*server), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(idle) << idle.status().toString();
  ASSERT_TRUE(idle.value()->set("x", bytes("1")));
  ASSERT_TRUE(pollUntil([&] { return server->clientCount() == 2; }, milliseconds(10000)));
  // The idle one goes (after the waiter has been parked longer than the idle timeout)...
  ASSERT_TRUE(pollUntil([&] { return server->clientCount() == 1; }, milliseconds(10000)));
  EXPECT_EQ(server->waiterCount(), 1u) << "a client blocked in GET is not idle";
  // ...and its next call opens a new connection on its own.
  ASSERT_TRUE(idle.value()->set("later", bytes("now")));
  EXPECT_EQ(idle.value()->reconnects(), 1u);
  getter.join();
  ASSERT_TRUE(got) << got.status().toString();
  EXPECT_EQ(std::string(got->begin(), got->end()), "now");
}

TEST(StoreLimitsTest, ARawIdleClientIsToldWhyBeforeItIsClosed) {
  StoreLimits limits;
  limits.idleTimeout = milliseconds(100);
  auto server = startServer(limits);
  ASSERT_TRUE(server);
  RawClient raw = rawClient(server->port());
  ASSERT_TRUE(raw.conn);
  auto note = readStoreResponse([&](std::span<std::uint8_t> dst) { return raw.conn->read(dst, in(milliseconds(10000))); },
                                StoreOp::kIdleClose);
  ASSERT_TRUE(note) << note.status().toString();
  EXPECT_EQ(note->op, StoreOp::kIdleClose);
  EXPECT_EQ(note->status.code(), StatusCode::kTimeout);
  std::uint8_t byte = 0;
  EXPECT_EQ(tcp::recvAll(raw.fd.get(), &byte, 1, in(milliseconds(10000))).code(), StatusCode::kPeerError);
}

}  // namespace
}  // namespace meridian::bootstrap
