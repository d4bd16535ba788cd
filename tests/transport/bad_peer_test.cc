// Hostile or broken peers: wrong secret, garbage, wrong versions, truncated and
// oversized frames. Each is refused with a clear error; the process and every other
// connection go on.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <cstring>
#include <random>
#include <thread>

#include "core/wire.h"
#include "transport/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {
namespace {

constexpr char kSecret[] = "bad-peer-secret";

std::unique_ptr<TcpDevice> device(const char* name) {
  DeviceOptions o;
  o.secret = kSecret;
  // The decoders behind the records are what these peers attack: they speak plain frames
  // (records without tags), as a peer would after opening its records. What records do with
  // changed bytes is tested in aead_test, handshake_test and the proxy tests.
  o.wireSecurity = WireSecurity::kOff;
  o.tcp.streamsPerPath = 1;
  o.name = name;
  return TcpDevice::create(o).value();
}

// A raw, authenticated stream posing as rank 1 of `session`, and the victim's channel.
struct RawPeer {
  UniqueFd fd;
  ChannelPtr victimChannel;
};

RawPeer rawPeer(TcpDevice& victim, std::uint64_t session) {
  RawPeer rp;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  Result<ChannelPtr> ch = internalError("not run");
  std::thread t([&] { ch = victim.openChannel({session, 0, 1, false, encodeEndpoint({"127.0.0.1:9"}).value()}, deadline); });
  auto hp = parseHostPort(victim.listenAddresses()[0]).value();
  auto fd = connectTo(hp, "", deadline);
  EXPECT_TRUE(fd.isOk());
  ConnectInfo info;
  info.sessionId = session;
  info.rank = 1;
  EXPECT_TRUE(clientHandshake(fd->get(), kSecret, WireSecurity::kOff, info, deadline).isOk());
  t.join();
  EXPECT_TRUE(ch.isOk()) << ch.status().toString();
  rp.fd = std::move(fd.value());
  rp.victimChannel = ch.value();
  return rp;
}

// A healthy channel between two devices, to show that other connections go on.
void expectHealthyPeersStillWork(TcpDevice& victim, std::uint64_t session) {
  auto other = device("ok");
  auto deadline = Clock::now() + std::chrono::seconds(20);
  Result<ChannelPtr> vc = internalError("not run");
  std::thread t([&] { vc = victim.openChannel({session, 0, 2, false, other->endpoint()}, deadline); });
  auto oc = other->openChannel({session, 2, 0, true, victim.endpoint()}, deadline);
  t.join();
  ASSERT_TRUE(oc.isOk() && vc.isOk());
  std::vector<int> in(1000), out(1000);
  for (int i = 0; i < 1000; ++i) in[i] = i * 3;
  auto r = (*vc)->irecv(out.data(), out.size() * sizeof(int), 4).value();
  auto s = (*oc)->isend(in.data(), in.size() * sizeof(int), 4).value();
  ASSERT_TRUE(s->wait(deadline).isOk());
  ASSERT_TRUE(r->wait(deadline).isOk());
  EXPECT_EQ(in, out);
}

void sendBytes(int fd, const void* p, std::size_t n) {
  ASSERT_TRUE(sendAll(fd, p, n, Clock::now() + std::chrono::seconds(5)).isOk());
}

Status waitForFailure(const ChannelPtr& ch) {
  std::vector<std::uint8_t> buf(4096);
  auto r = ch->irecv(buf.data(), buf.size(), 0);
  if (!r.isOk()) return r.status();
  return (*r)->wait(Clock::now() + std::chrono::seconds(20));
}

TEST(BadPeerTest, WrongSecretIsRefusedAndTheServerGoesOn) {
  auto victim = device("v");
  auto hp = parseHostPort(victim->listenAddresses()[0]).value();
  auto fd = connectTo(hp, "", Clock::now() + std::chrono::seconds(5)).value();
  ConnectInfo info;
  info.sessionId = 1;
  info.rank = 1;
  Status st = clientHandshake(fd.get(), "not-the-secret", WireSecurity::kOff, info, Clock::now() + std::chrono::seconds(5))
                  .status();
  EXPECT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("secret"), std::string::npos) << st.toString();
  expectHealthyPeersStillWork(*victim, 77);
}

TEST(BadPeerTest, GarbageBeforeTheHandshakeIsDropped) {
  auto victim = device("v");
  auto hp = parseHostPort(victim->listenAddresses()[0]).value();
  auto fd = connectTo(hp, "", Clock::now() + std::chrono::seconds(5)).value();
  std::vector<std::uint8_t> junk(4096);
  std::mt19937 rng(1);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  sendBytes(fd.get(), junk.data(), junk.size());
  std::uint8_t c;
  EXPECT_LE(::recv(fd.get(), &c, 1, 0), 0) << "the server should close a garbage connection";
  expectHealthyPeersStillWork(*victim, 78);
}

TEST(BadPeerTest, OtherProtocolVersionIsToldWhy) {
  auto victim = device("v");
  auto hp = parseHostPort(victim->listenAddresses()[0]).value();
  auto fd = connectTo(hp, "", Clock::now() + std::chrono::seconds(5)).value();
  auto hello = encodeHello(freshNonce(), WireSecurity::kOff);
  wire::store<std::uint16_t>(&hello[4], kProtocolVersion + 1);
  Transcript t(hello.begin(), hello.end());
  sendBytes(fd.get(), hello.data(), hello.size());
  std::array<std::uint8_t, kChallengeBytes> reply{};
  ASSERT_TRUE(recvAll(fd.get(), reply.data(), reply.size(), Clock::now() + std::chrono::seconds(5)).isOk());
  auto r = verifyChallenge(kSecret, t, WireSecurity::kOff, reply);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("version"), std::string::npos) << r.status().toString();
  expectHealthyPeersStillWork(*victim, 79);
}

TEST(BadPeerTest, TruncatedFrameClosesOnlyThatConnection) {
  auto victim = device("v");
  RawPeer rp = rawPeer(*victim, 80);
  FrameHeader h;
  h.totalBytes = 100;
  h.length = 100;
  auto bytes = encodeFrameHeader(h);
  sendBytes(rp.fd.get(), bytes.data(), bytes.size());
  sendBytes(rp.fd.get(), "only-some-of-the-payload", 24);
  rp.fd.reset();
  Status st = waitForFailure(rp.victimChannel);
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.toString();
  expectHealthyPeersStillWork(*victim, 81);
}

TEST(BadPeerTest, OversizedLengthIsRefusedBeforeAllocating) {
  auto victim = device("v");
  RawPeer rp = rawPeer(*victim, 82);
  FrameHeader h;
  h.totalBytes = 1ull << 39;
  auto bytes = encodeFrameHeader(h);
  wire::store<std::uint32_t>(&bytes[48], 0xFFFFFFF0u);  // a 4 GiB chunk
  sendBytes(rp.fd.get(), bytes.data(), bytes.size());
  Status st = waitForFailure(rp.victimChannel);
  EXPECT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("exceeds the bound"), std::string::npos) << st.toString();
  expectHealthyPeersStillWork(*victim, 83);
}

TEST(BadPeerTest, WrongFrameVersionClosesTheConnection) {
  auto victim = device("v");
  RawPeer rp = rawPeer(*victim, 84);
  auto bytes = encodeFrameHeader(FrameHeader{});
  bytes[2] = 77;
  sendBytes(rp.fd.get(), bytes.data(), bytes.size());
  Status st = waitForFailure(rp.victimChannel);
  EXPECT_NE(st.message().find("version 77"), std::string::npos) << st.toString();
  expectHealthyPeersStillWork(*victim, 85);
}

TEST(BadPeerTest, GarbageFramesCloseTheConnection) {
  auto victim = device("v");
  RawPeer rp = rawPeer(*victim, 86);
  std::vector<std::uint8_t> junk(1 << 16);
  std::mt19937 rng(2);
  for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
  (void)sendAll(rp.fd.get(), junk.data(), junk.size(), Clock::now() + std::chrono::seconds(5));
  Status st = waitForFailure(rp.victimChannel);
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  expectHealthyPeersStillWork(*victim, 87);
}

TEST(BadPeerTest, AckForAChunkNeverSentIsRefused) {
  auto victim = device("v");
  RawPeer rp = rawPeer(*victim, 88);
  std::vector<std::uint8_t> data(1 << 20, 1);  // large enough not to complete eagerly
  auto s = rp.victimChannel->isend(data.data(), data.size(), 0).value();
  FrameHeader ack;
  ack.type = FrameType::kAck;
  ack.seq = 0;
  ack.totalBytes = 1000;
  ack.offset = 999;
  ack.length = 1;
  auto bytes = encodeFrameHeader(ack);
  sendBytes(rp.fd.get(), bytes.data(), bytes.size());
  Status st = s->wait(Clock::now() + std::chrono::seconds(20));
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
}

}  // namespace
}  // namespace meridian::transport::tcp

namespace meridian::transport::tcp {
namespace {

// A client that holds the job secret connects claiming to be a rank whose channel is already
// complete (same session, path and stream): it is refused, whatever it then sends breaks
// nothing, and the real channel carries on both ways.
TEST(BadPeerTest, AnExtraConnectionClaimingALiveRankIsRefusedAndTheChannelGoesOn) {
  auto victim = device("v");
  auto real = device("r");
  const std::uint64_t session = 91;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  Result<ChannelPtr> vc = internalError("not run");
  std::thread t([&] { vc = victim->openChannel({session, 0, 1, false, real->endpoint()}, deadline); });
  auto rc = real->openChannel({session, 1, 0, true, victim->endpoint()}, deadline);
  t.join();
  ASSERT_TRUE(rc.isOk() && vc.isOk());

  auto hp = parseHostPort(victim->listenAddresses()[0]).value();
  auto fd = connectTo(hp, "", deadline);
  ASSERT_TRUE(fd.isOk());
  ConnectInfo info;
  info.sessionId = session;
  info.rank = 1;  // the real peer's rank, path 0, stream 0 of 1: all taken
  info.pathCount = 1;
  ASSERT_TRUE(clientHandshake(fd->get(), kSecret, WireSecurity::kOff, info, deadline).isOk());
  std::vector<std::uint8_t> junk(4096, 0xa5);
  (void)sendAll(fd->get(), junk.data(), junk.size(), deadline);  // a bad frame, if it were attached
  std::uint8_t c = 0;
  EXPECT_LE(::recv(fd->get(), &c, 1, 0), 0) << "the victim must close the extra connection";

  for (int dir = 0; dir < 2; ++dir) {
    ChannelPtr& from = dir == 0 ? rc.value() : vc.value();
    ChannelPtr& to = dir == 0 ? vc.value() : rc.value();
    std::vector<int> in(5000), out(5000);
    for (int i = 0; i < 5000; ++i) in[i] = i * 7 + dir;
    auto r = to->irecv(out.data(), out.size() * sizeof(int), 9).value();
    auto s = from->isend(in.data(), in.size() * sizeof(int), 9).value();
    ASSERT_TRUE(s->wait(deadline).isOk()) << s->status().toString();
    ASSERT_TRUE(r->wait(deadline).isOk()) << r->status().toString();
    EXPECT_EQ(in, out) << "direction " << dir;
  }
}

}  // namespace
}  // namespace meridian::transport::tcp
