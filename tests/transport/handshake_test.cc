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

// The server's state machine, fed by hand as the TCP engine feeds it.
TEST(ServerHandshakeTest, AcceptsAClientStepByStepAndAsksItsAdmission) {
  int admitted = 0;
  ServerHandshake hs("pw", [&](const ConnectInfo& ci) {
    ++admitted;
    return ci.rank == 3 ? Status::ok() : peerError("not rank 3");
  });
  const Nonce nc = freshNonce();
  ASSERT_EQ(hs.wantBytes(), kHelloBytes);
  const auto challenge = hs.feed(encodeHello(nc));
  ASSERT_EQ(challenge.size(), kChallengeBytes);
  auto ns = verifyChallenge("pw", nc, challenge);
  ASSERT_TRUE(ns.isOk()) << ns.status().toString();
  EXPECT_FALSE(hs.finished());
  ASSERT_EQ(hs.wantBytes(), kAuthBytes);
  const auto result = hs.feed(encodeAuth("pw", nc, ns.value(), info()));
  EXPECT_TRUE(decodeResult(result).isOk());
  EXPECT_TRUE(hs.finished());
  EXPECT_EQ(hs.wantBytes(), 0u);
  ASSERT_TRUE(hs.result().isOk());
  EXPECT_EQ(hs.result()->rank, 3);
  EXPECT_EQ(admitted, 1);
}

TEST(ServerHandshakeTest, RefusesWhatAdmissionRefusesAndTellsTheClient) {
  ServerHandshake hs("pw", [](const ConnectInfo&) { return peerError("no channel to that rank"); });
  const Nonce nc = freshNonce();
  auto ns = verifyChallenge("pw", nc, hs.feed(encodeHello(nc)));
  ASSERT_TRUE(ns.isOk());
  const auto result = hs.feed(encodeAuth("pw", nc, ns.value(), info()));
  EXPECT_NE(decodeResult(result).message().find("rejected"), std::string::npos) << decodeResult(result).toString();
  ASSERT_FALSE(hs.result().isOk());
  EXPECT_NE(hs.result().status().message().find("no channel"), std::string::npos);
}

TEST(ServerHandshakeTest, TellsAnotherVersionWhyAndGarbageNothing) {
  ServerHandshake other("pw");
  auto hello = encodeHello(freshNonce());
  wire::store<std::uint16_t>(&hello[4], kProtocolVersion + 1);
  const auto reply = other.feed(hello);
  EXPECT_TRUE(other.finished());
  ASSERT_EQ(reply.size(), kChallengeBytes) << "a Meridian peer of another version is told";
  EXPECT_FALSE(other.result().isOk());
  EXPECT_NE(other.result().status().message().find("version"), std::string::npos);

  ServerHandshake garbage("pw");
  std::array<std::uint8_t, kHelloBytes> junk{};
  junk.fill(0x5a);
  EXPECT_TRUE(garbage.feed(junk).empty()) << "garbage gets no answer";
  EXPECT_TRUE(garbage.finished());
  EXPECT_FALSE(garbage.result().isOk());

  ServerHandshake wrongSize("pw");
  EXPECT_TRUE(wrongSize.feed(std::span<const std::uint8_t>(junk.data(), 3)).empty());
  EXPECT_EQ(wrongSize.result().status().code(), StatusCode::kInternal) << "fed the wrong number of bytes";
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
