// The job-secret handshake: both sides must prove the secret; versions are checked.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "core/fd.h"
#include "core/wire.h"
#include "transport/tcp/handshake.h"

namespace meridian::transport::tcp {
namespace {

ConnectInfo info() {
  ConnectInfo ci;
  ci.sessionId = 0xabcdef;
  ci.rank = 3;
  ci.pathIndex = 1;
  ci.streamIndex = 1;
  ci.streamCount = 2;
  return ci;
}

TEST(HandshakeTest, MatchingSecretsAuthenticateBothWays) {
  Nonce nc = freshNonce(), ns = freshNonce();
  auto hello = encodeHello(nc);
  auto gotNc = decodeHello(hello);
  ASSERT_TRUE(gotNc.isOk());
  auto ch = encodeChallenge("s3cret", gotNc.value(), ns, HandshakeResult::kOk);
  auto gotNs = verifyChallenge("s3cret", nc, ch);
  ASSERT_TRUE(gotNs.isOk()) << gotNs.status().toString();
  auto auth = encodeAuth("s3cret", nc, gotNs.value(), info());
  auto ci = verifyAuth("s3cret", nc, ns, auth);
  ASSERT_TRUE(ci.isOk()) << ci.status().toString();
  EXPECT_EQ(ci->sessionId, 0xabcdefu);
  EXPECT_EQ(ci->rank, 3);
  EXPECT_EQ(ci->pathIndex, 1);
  EXPECT_EQ(ci->streamCount, 2);
}

TEST(HandshakeTest, ARelayRequestCarriesItsTargetAndMustNameAnotherRank) {
  Nonce nc = freshNonce(), ns = freshNonce();
  ConnectInfo r = info();
  r.kind = ConnectionKind::kRelay;
  r.relayTarget = 5;
  auto ci = verifyAuth("k", nc, ns, encodeAuth("k", nc, ns, r));
  ASSERT_TRUE(ci.isOk()) << ci.status().toString();
  EXPECT_EQ(ci->kind, ConnectionKind::kRelay);
  EXPECT_EQ(ci->relayTarget, 5);
  for (int bad : {-1, 3}) {  // nobody, or the client itself
    r.relayTarget = bad;
    auto refused = verifyAuth("k", nc, ns, encodeAuth("k", nc, ns, r));
    EXPECT_EQ(refused.status().code(), StatusCode::kPeerError) << bad;
  }
}

TEST(HandshakeTest, ClientRefusesServerWithoutTheSecret) {
  Nonce nc = freshNonce(), ns = freshNonce();
  auto ch = encodeChallenge("wrong", nc, ns, HandshakeResult::kOk);
  auto r = verifyChallenge("right", nc, ch);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("job secret"), std::string::npos);
}

TEST(HandshakeTest, ServerRefusesClientWithoutTheSecret) {
  Nonce nc = freshNonce(), ns = freshNonce();
  auto auth = encodeAuth("wrong", nc, ns, info());
  EXPECT_FALSE(verifyAuth("right", nc, ns, auth).isOk());
}

TEST(HandshakeTest, TamperedConnectInfoIsRefused) {
  Nonce nc = freshNonce(), ns = freshNonce();
  auto auth = encodeAuth("k", nc, ns, info());
  auth[32 + 16] ^= 1;  // flip a bit of the rank
  EXPECT_FALSE(verifyAuth("k", nc, ns, auth).isOk());
}

TEST(HandshakeTest, ReplayedAuthWithAnotherNonceIsRefused) {
  Nonce nc = freshNonce(), ns = freshNonce();
  auto auth = encodeAuth("k", nc, ns, info());
  EXPECT_FALSE(verifyAuth("k", nc, freshNonce(), auth).isOk());
}

TEST(HandshakeTest, OtherVersionIsNamed) {
  auto hello = encodeHello(freshNonce());
  wire::store<std::uint16_t>(&hello[4], 7);
  std::uint16_t v = 0;
  auto r = decodeHello(hello, &v);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(v, 7);
  EXPECT_NE(r.status().message().find("version 7"), std::string::npos);
}

TEST(HandshakeTest, GarbageIsNotAMeridianPeer) {
  std::array<std::uint8_t, kHelloBytes> junk{};
  junk.fill(0x41);
  auto r = decodeHello(junk);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("magic"), std::string::npos);
}

TEST(HandshakeTest, BlockingWrappersAgreeOverASocketPair) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  Result<ConnectInfo> server = internalError("not run");
  std::thread t([&] { server = serverHandshake(b.get(), "pw", deadline); });
  Status client = clientHandshake(a.get(), "pw", info(), deadline);
  t.join();
  EXPECT_TRUE(client.isOk()) << client.toString();
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  EXPECT_EQ(server->rank, 3);
}

TEST(HandshakeTest, BlockingWrappersReportAWrongSecretOnBothSides) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  Result<ConnectInfo> server = internalError("not run");
  std::thread t([&] { server = serverHandshake(b.get(), "server-secret", deadline); });
  Status client = clientHandshake(a.get(), "client-secret", info(), deadline);
  a.reset();  // the client gives up; the server sees the close
  t.join();
  EXPECT_EQ(client.code(), StatusCode::kPeerError);
  EXPECT_FALSE(server.isOk());
}

}  // namespace
}  // namespace meridian::transport::tcp
