// The job-secret handshake (version 2): both sides prove the secret over the whole
// transcript, the client proves the key of the rank it claims, both agree the wire-security
// mode, and both derive the same session keys.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "core/fd.h"
#include "core/wire.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/sealed_socket.h"
#include "transport/tcp/socket.h"

namespace meridian::transport::tcp {
namespace {

constexpr WireSecurity kEnc = WireSecurity::kEncrypt;

ConnectInfo info() {
  ConnectInfo ci;
  ci.sessionId = 0xabcdef;
  ci.rank = 3;
  ci.pathIndex = 1;
  ci.streamIndex = 1;
  ci.streamCount = 2;
  return ci;
}

// Runs the codec by hand with the client's secret `cs` and the server's `ss`; returns what the
// server made of the auth (or the first error on the way).
struct ByHand {
  Transcript client, server;
  Nonce nc = freshNonce(), ns = freshNonce();
  Result<ConnectInfo> run(std::string_view cs, std::string_view ss, const ConnectInfo& ci) {
    auto hello = encodeHello(nc, kEnc);
    client.assign(hello.begin(), hello.end());
    server = client;
    auto ch = encodeChallenge(ss, server, ns, HandshakeResult::kOk, kEnc);
    auto gotNs = verifyChallenge(cs, client, kEnc, ch);
    if (!gotNs) return gotNs.status();
    auto auth = encodeAuth(cs, client, ci);
    return verifyAuth(ss, server, auth);
  }
};

TEST(HandshakeTest, MatchingSecretsAuthenticateBothWaysAndAgreeKeys) {
  ByHand h;
  auto ci = h.run("s3cret", "s3cret", info());
  ASSERT_TRUE(ci.isOk()) << ci.status().toString();
  EXPECT_EQ(ci->sessionId, 0xabcdefu);
  EXPECT_EQ(ci->rank, 3);
  EXPECT_EQ(ci->pathIndex, 1);
  EXPECT_EQ(ci->streamCount, 2);
  EXPECT_EQ(h.client, h.server);
  const SessionKeys c = deriveSessionKeys("s3cret", h.client, kEnc, true);
  const SessionKeys s = deriveSessionKeys("s3cret", h.server, kEnc, false);
  EXPECT_EQ(c.send.key, s.recv.key);
  EXPECT_EQ(c.send.iv, s.recv.iv);
  EXPECT_EQ(c.recv.key, s.send.key);
  EXPECT_NE(c.send.key, c.recv.key) << "each direction has its own key";
  ByHand again;
  ASSERT_TRUE(again.run("s3cret", "s3cret", info()).isOk());
  EXPECT_NE(deriveSessionKeys("s3cret", again.client, kEnc, true).send.key, c.send.key)
      << "fresh nonces give fresh keys";
}

TEST(HandshakeTest, ARelayRequestCarriesItsTargetAndMustNameAnotherRank) {
  ConnectInfo r = info();
  r.kind = ConnectionKind::kRelay;
  r.relayTarget = 5;
  ByHand h;
  auto ci = h.run("k", "k", r);
  ASSERT_TRUE(ci.isOk()) << ci.status().toString();
  EXPECT_EQ(ci->kind, ConnectionKind::kRelay);
  EXPECT_EQ(ci->relayTarget, 5);
  for (int bad : {-1, 3}) {  // nobody, or the client itself
    r.relayTarget = bad;
    ByHand b;
    EXPECT_EQ(b.run("k", "k", r).status().code(), StatusCode::kPeerError) << bad;
  }
}

TEST(HandshakeTest, ClientRefusesServerWithoutTheSecret) {
  ByHand h;
  auto r = h.run("right", "wrong", info());
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("job secret"), std::string::npos);
}

TEST(HandshakeTest, ServerRefusesClientWithoutTheSecret) {
  ByHand h;
  auto hello = encodeHello(h.nc, kEnc);
  h.client.assign(hello.begin(), hello.end());
  h.server = h.client;
  auto ch = encodeChallenge("right", h.server, h.ns, HandshakeResult::kOk, kEnc);
  h.client.insert(h.client.end(), ch.begin(), ch.end());  // a client that skips the check
  auto auth = encodeAuth("wrong", h.client, info());
  EXPECT_FALSE(verifyAuth("right", h.server, auth).isOk());
}

TEST(HandshakeTest, TamperedConnectInfoOrClaimedRankIsRefused) {
  for (std::size_t at : {std::size_t{32 + 16}, std::size_t{32 + 8}, std::size_t{32 + 2}}) {  // rank, session, path
    ByHand h;
    auto hello = encodeHello(h.nc, kEnc);
    h.client.assign(hello.begin(), hello.end());
    h.server = h.client;
    auto ch = encodeChallenge("k", h.server, h.ns, HandshakeResult::kOk, kEnc);
    ASSERT_TRUE(verifyChallenge("k", h.client, kEnc, ch).isOk());
    auto auth = encodeAuth("k", h.client, info());
    auth[at] ^= 1;
    EXPECT_FALSE(verifyAuth("k", h.server, auth).isOk()) << "byte " << at;
  }
}

TEST(HandshakeTest, ADowngradedHelloFailsTheServersProof) {
  // An attacker rewrites the client's hello to ask for `off`; the server answers `off`.
  const Nonce nc = freshNonce();
  auto hello = encodeHello(nc, kEnc);
  Transcript client(hello.begin(), hello.end());
  auto forged = hello;
  forged[6] = static_cast<std::uint8_t>(WireSecurity::kOff);
  Transcript server(forged.begin(), forged.end());
  auto ch = encodeChallenge("k", server, freshNonce(), HandshakeResult::kOk, WireSecurity::kOff);
  auto r = verifyChallenge("k", client, kEnc, ch);
  EXPECT_FALSE(r.isOk()) << "the proof covers the hello the client sent";
}

TEST(HandshakeTest, DifferentModesAreRefusedSayingWhich) {
  ServerHandshake hs("pw", WireSecurity::kAuthenticate);
  const Nonce nc = freshNonce();
  auto hello = encodeHello(nc, kEnc);
  Transcript client(hello.begin(), hello.end());
  const auto ch = hs.feed(hello);
  EXPECT_TRUE(hs.finished());
  EXPECT_NE(hs.result().status().message().find("MERIDIAN_WIRE_SECURITY=encrypt"), std::string::npos)
      << hs.result().status().toString();
  auto r = verifyChallenge("pw", client, kEnc, ch);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("MERIDIAN_WIRE_SECURITY=authenticate"), std::string::npos) << r.status().toString();
}

TEST(HandshakeTest, OtherVersionIsNamed) {
  auto hello = encodeHello(freshNonce(), kEnc);
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
  ServerHandshake hs("pw", kEnc, [&](const ConnectInfo& ci) {
    ++admitted;
    return ci.rank == 3 ? Status::ok() : peerError("not rank 3");
  });
  const Nonce nc = freshNonce();
  ASSERT_EQ(hs.wantBytes(), kHelloBytes);
  auto hello = encodeHello(nc, kEnc);
  Transcript t(hello.begin(), hello.end());
  const auto challenge = hs.feed(hello);
  ASSERT_EQ(challenge.size(), kChallengeBytes);
  auto ns = verifyChallenge("pw", t, kEnc, challenge);
  ASSERT_TRUE(ns.isOk()) << ns.status().toString();
  EXPECT_FALSE(hs.finished());
  ASSERT_EQ(hs.wantBytes(), kAuthBytes);
  const auto result = hs.feed(encodeAuth("pw", t, info()));
  EXPECT_TRUE(decodeResult("pw", t, result).isOk());
  EXPECT_TRUE(hs.finished());
  EXPECT_EQ(hs.wantBytes(), 0u);
  ASSERT_TRUE(hs.result().isOk());
  EXPECT_EQ(hs.result()->rank, 3);
  EXPECT_EQ(admitted, 1);
  EXPECT_EQ(hs.keys().send.key, deriveSessionKeys("pw", t, kEnc, true).recv.key);
}

TEST(ServerHandshakeTest, RefusesWhatAdmissionRefusesAndTellsTheClient) {
  ServerHandshake hs("pw", kEnc, [](const ConnectInfo&) { return peerError("no channel to that rank"); });
  auto hello = encodeHello(freshNonce(), kEnc);
  Transcript t(hello.begin(), hello.end());
  auto ns = verifyChallenge("pw", t, kEnc, hs.feed(hello));
  ASSERT_TRUE(ns.isOk());
  const auto result = hs.feed(encodeAuth("pw", t, info()));
  EXPECT_NE(decodeResult("pw", t, result).message().find("rejected"), std::string::npos)
      << decodeResult("pw", t, result).toString();
  ASSERT_FALSE(hs.result().isOk());
  EXPECT_NE(hs.result().status().message().find("no channel"), std::string::npos);
  auto forged = result;
  wire::store<std::uint16_t>(&forged[4], static_cast<std::uint16_t>(HandshakeResult::kOk));
  EXPECT_FALSE(decodeResult("pw", t, forged).isOk()) << "a refusal rewritten to ok on the way fails its MAC";
}

TEST(ServerHandshakeTest, TellsAnotherVersionWhyAndGarbageNothing) {
  ServerHandshake other("pw", kEnc);
  auto hello = encodeHello(freshNonce(), kEnc);
  wire::store<std::uint16_t>(&hello[4], kProtocolVersion + 1);
  const auto reply = other.feed(hello);
  EXPECT_TRUE(other.finished());
  ASSERT_EQ(reply.size(), kChallengeBytes) << "a Meridian peer of another version is told";
  EXPECT_FALSE(other.result().isOk());
  EXPECT_NE(other.result().status().message().find("version"), std::string::npos);

  ServerHandshake garbage("pw", kEnc);
  std::array<std::uint8_t, kHelloBytes> junk{};
  junk.fill(0x5a);
  EXPECT_TRUE(garbage.feed(junk).empty()) << "garbage gets no answer";
  EXPECT_TRUE(garbage.finished());
  EXPECT_FALSE(garbage.result().isOk());

  ServerHandshake wrongSize("pw", kEnc);
  EXPECT_TRUE(wrongSize.feed(std::span<const std::uint8_t>(junk.data(), 3)).empty());
  EXPECT_EQ(wrongSize.result().status().code(), StatusCode::kInternal) << "fed the wrong number of bytes";
}

TEST(HandshakeTest, BlockingWrappersAgreeAndSealedRecordsFlowBothWays) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  Result<ServerHandshakeResult> server = internalError("not run");
  std::thread t([&] { server = serverHandshake(b.get(), "pw", kEnc, deadline); });
  auto client = clientHandshake(a.get(), "pw", kEnc, info(), deadline);
  t.join();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  EXPECT_EQ(server->info.rank, 3);
  SealedSocket ca(a.get(), client.value()), sb(b.get(), server->keys);
  std::vector<std::uint8_t> big(200'000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 13);
  std::thread w([&] { ASSERT_TRUE(ca.send(big, deadline).isOk()); });
  std::vector<std::uint8_t> got(big.size());
  ASSERT_TRUE(sb.read(got, deadline).isOk());
  w.join();
  EXPECT_EQ(got, big);
  std::array<std::uint8_t, 5> hi{1, 2, 3, 4, 5}, back{};
  ASSERT_TRUE(sb.send(hi, deadline).isOk());
  ASSERT_TRUE(ca.read(back, deadline).isOk());
  EXPECT_EQ(back, hi);
}

TEST(HandshakeTest, SealedSocketRefusesAChangedRecordAndAnOversizedLength) {
  SessionKeys k;
  k.mode = kEnc;
  k.send.key.fill(7);
  k.recv = k.send;
  for (int variant = 0; variant < 2; ++variant) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    UniqueFd a(sv[0]), b(sv[1]);
    auto deadline = Clock::now() + std::chrono::seconds(10);
    std::array<std::uint8_t, 4 + 8 + kAeadTagBytes> rec{};
    {
      int pv[2];
      ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pv), 0);
      UniqueFd x(pv[0]), y(pv[1]);
      SealedSocket sx(x.get(), k);
      std::array<std::uint8_t, 8> msg{1, 2, 3, 4, 5, 6, 7, 8};
      ASSERT_TRUE(sx.send(msg, deadline).isOk());
      ASSERT_TRUE(recvAll(y.get(), rec.data(), rec.size(), deadline).isOk());
    }
    if (variant == 0) rec[6] ^= 1;                            // a flipped bit in the body
    if (variant == 1) wire::store<std::uint32_t>(rec.data(), 1u << 30);  // a huge length
    ASSERT_TRUE(sendAll(a.get(), rec.data(), rec.size(), deadline).isOk());
    SealedSocket sb(b.get(), k);
    std::array<std::uint8_t, 8> out{};
    Status st = sb.read(out, deadline);
    EXPECT_EQ(st.code(), StatusCode::kPeerError) << variant;
    EXPECT_NE(st.message().find("integrity"), std::string::npos) << st.toString();
  }
}

TEST(HandshakeTest, BlockingWrappersReportAWrongSecretOnBothSides) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  Result<ServerHandshakeResult> server = internalError("not run");
  std::thread t([&] { server = serverHandshake(b.get(), "server-secret", kEnc, deadline); });
  auto client = clientHandshake(a.get(), "client-secret", kEnc, info(), deadline);
  a.reset();  // the client gives up; the server sees the close
  t.join();
  EXPECT_EQ(client.status().code(), StatusCode::kPeerError);
  EXPECT_FALSE(server.isOk());
}

}  // namespace
}  // namespace meridian::transport::tcp
