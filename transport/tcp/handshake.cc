// Handshake codec and blocking wrappers.
#include "transport/tcp/handshake.h"

#include <cstring>
#include <vector>

#include "core/wire.h"
#include "transport/tcp/socket.h"

namespace meridian::transport::tcp {

namespace {

std::span<const std::uint8_t> asBytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

Hmac256 masterKey(std::string_view secret) { return hmacSha256(asBytes("meridian-master-v2"), asBytes(secret)); }

Hmac256 rankKey(std::string_view secret, std::int32_t rank) {
  std::array<std::uint8_t, 17> msg{};
  std::memcpy(msg.data(), "meridian-rank", 13);
  wire::store<std::int32_t>(&msg[13], rank);
  return hmacSha256(masterKey(secret), msg);
}

// HMAC(key, role | transcript | extra).
Hmac256 proof(const Hmac256& key, std::string_view role, const Transcript& transcript,
              std::span<const std::uint8_t> extra = {}) {
  std::vector<std::uint8_t> msg;
  msg.reserve(role.size() + transcript.size() + extra.size());
  msg.insert(msg.end(), role.begin(), role.end());
  msg.insert(msg.end(), transcript.begin(), transcript.end());
  msg.insert(msg.end(), extra.begin(), extra.end());
  return hmacSha256(key, msg);
}

constexpr std::size_t kInfoBytes = 24;
constexpr std::size_t kChallengeMacAt = 48;
constexpr std::size_t kResultMacAt = 8;

std::array<std::uint8_t, kInfoBytes> encodeInfo(const ConnectInfo& info) {
  std::array<std::uint8_t, kInfoBytes> b{};
  b[0] = static_cast<std::uint8_t>(info.kind);
  b[1] = info.pathCount;
  wire::store<std::uint16_t>(&b[2], info.pathIndex);
  wire::store<std::uint16_t>(&b[4], info.streamIndex);
  wire::store<std::uint16_t>(&b[6], info.streamCount);
  wire::store<std::uint64_t>(&b[8], info.sessionId);
  wire::store<std::int32_t>(&b[16], info.rank);
  wire::store<std::int32_t>(&b[20], info.relayTarget);
  return b;
}

Result<WireSecurity> modeFromWire(std::uint8_t m) {
  if (m > static_cast<std::uint8_t>(WireSecurity::kEncrypt)) return peerError("handshake: unknown wire-security mode {}", m);
  return static_cast<WireSecurity>(m);
}

void append(Transcript& t, std::span<const std::uint8_t> bytes) { t.insert(t.end(), bytes.begin(), bytes.end()); }

}  // namespace

Nonce freshNonce() {
  Nonce n{};
  randomBytes(n);
  return n;
}

std::array<std::uint8_t, kHelloBytes> encodeHello(const Nonce& clientNonce, WireSecurity mode) {
  std::array<std::uint8_t, kHelloBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], kProtocolVersion);
  b[6] = static_cast<std::uint8_t>(mode);
  std::memcpy(&b[8], clientNonce.data(), clientNonce.size());
  return b;
}

Result<Nonce> decodeHello(std::span<const std::uint8_t> bytes, std::uint16_t* peerVersion, WireSecurity* mode) {
  if (bytes.size() != kHelloBytes) return peerError("handshake: hello is {} bytes, expected {}", bytes.size(), kHelloBytes);
  if (wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) {
    return peerError("handshake: bad magic 0x{:08x} (not a Meridian peer)", wire::load<std::uint32_t>(&bytes[0]));
  }
  std::uint16_t version = wire::load<std::uint16_t>(&bytes[4]);
  if (peerVersion) *peerVersion = version;
  if (version != kProtocolVersion) {
    return peerError("handshake: peer speaks protocol version {}, this build speaks {}", version, kProtocolVersion);
  }
  auto m = modeFromWire(bytes[6]);
  if (!m) return m.status();
  if (bytes[7] != 0) return peerError("handshake: reserved hello byte is {}", bytes[7]);
  if (mode) *mode = m.value();
  Nonce n{};
  std::memcpy(n.data(), &bytes[8], n.size());
  return n;
}

std::array<std::uint8_t, kChallengeBytes> encodeChallenge(std::string_view secret, Transcript& transcript,
                                                          const Nonce& serverNonce, HandshakeResult status,
                                                          WireSecurity mode) {
  std::array<std::uint8_t, kChallengeBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], kProtocolVersion);
  wire::store<std::uint16_t>(&b[6], static_cast<std::uint16_t>(status));
  b[8] = static_cast<std::uint8_t>(mode);
  std::memcpy(&b[16], serverNonce.data(), serverNonce.size());
  Hmac256 mac = proof(masterKey(secret), "meridian-server", transcript, std::span(b).first(kChallengeMacAt));
  std::memcpy(&b[kChallengeMacAt], mac.data(), mac.size());
  append(transcript, b);
  return b;
}

Result<Nonce> verifyChallenge(std::string_view secret, Transcript& transcript, WireSecurity mode,
                              std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kChallengeBytes) return peerError("handshake: challenge has the wrong size");
  if (wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) return peerError("handshake: bad magic from server");
  std::uint16_t version = wire::load<std::uint16_t>(&bytes[4]);
  auto status = static_cast<HandshakeResult>(wire::load<std::uint16_t>(&bytes[6]));
  if (status == HandshakeResult::kVersionMismatch || version != kProtocolVersion) {
    return peerError("handshake: server speaks protocol version {}, this build speaks {}", version, kProtocolVersion);
  }
  Hmac256 got{};
  std::memcpy(got.data(), &bytes[kChallengeMacAt], got.size());
  if (!equalDigests(got, proof(masterKey(secret), "meridian-server", transcript, bytes.first(kChallengeMacAt)))) {
    return peerError("handshake: server does not hold the job secret (MERIDIAN_SECRET differs) or the hello was changed");
  }
  auto serverMode = modeFromWire(bytes[8]);
  if (!serverMode) return serverMode.status();
  if (status == HandshakeResult::kModeMismatch || serverMode.value() != mode) {
    return peerError("handshake: the server runs MERIDIAN_WIRE_SECURITY={}, this rank {}: every rank must run the same",
                     wireSecurityName(serverMode.value()), wireSecurityName(mode));
  }
  if (status != HandshakeResult::kOk) return peerError("handshake: server refused the connection");
  Nonce ns{};
  std::memcpy(ns.data(), &bytes[16], ns.size());
  append(transcript, bytes);
  return ns;
}

std::array<std::uint8_t, kAuthBytes> encodeAuth(std::string_view secret, Transcript& transcript,
                                                const ConnectInfo& info) {
  std::array<std::uint8_t, kAuthBytes> b{};
  auto infoBytes = encodeInfo(info);
  Hmac256 mac = proof(rankKey(secret, info.rank), "meridian-client", transcript, infoBytes);
  std::memcpy(&b[0], mac.data(), mac.size());
  std::memcpy(&b[32], infoBytes.data(), infoBytes.size());
  append(transcript, b);
  return b;
}

Result<ConnectInfo> verifyAuth(std::string_view secret, Transcript& transcript, std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kAuthBytes) return peerError("handshake: auth has the wrong size");
  Hmac256 got{};
  std::memcpy(got.data(), &bytes[0], got.size());
  auto info = bytes.subspan(32, kInfoBytes);
  const std::int32_t claimed = wire::load<std::int32_t>(&info[16]);
  if (!equalDigests(got, proof(rankKey(secret, claimed), "meridian-client", transcript, info))) {
    return peerError("handshake: client does not hold the job secret (MERIDIAN_SECRET differs) or not the key of "
                     "rank {} it claims",
                     claimed);
  }
  ConnectInfo ci;
  const std::uint16_t kind = info[0];
  if (kind != static_cast<std::uint16_t>(ConnectionKind::kDataStream) &&
      kind != static_cast<std::uint16_t>(ConnectionKind::kStore) &&
      kind != static_cast<std::uint16_t>(ConnectionKind::kRelay)) {
    return peerError("handshake: unknown connection kind {}", kind);
  }
  ci.kind = static_cast<ConnectionKind>(kind);
  ci.pathCount = info[1];
  ci.pathIndex = wire::load<std::uint16_t>(&info[2]);
  ci.streamIndex = wire::load<std::uint16_t>(&info[4]);
  ci.streamCount = wire::load<std::uint16_t>(&info[6]);
  ci.sessionId = wire::load<std::uint64_t>(&info[8]);
  ci.rank = claimed;
  ci.relayTarget = wire::load<std::int32_t>(&info[20]);
  if (ci.kind == ConnectionKind::kRelay && (ci.relayTarget < 0 || ci.relayTarget == ci.rank)) {
    return peerError("handshake: relay from rank {} to rank {} names no other rank", ci.rank, ci.relayTarget);
  }
  if (ci.streamCount == 0 || ci.streamIndex >= ci.streamCount) {
    return peerError("handshake: stream {} of {} is out of range", ci.streamIndex, ci.streamCount);
  }
  append(transcript, bytes);
  return ci;
}

std::array<std::uint8_t, kResultBytes> encodeResult(std::string_view secret, const Transcript& transcript,
                                                    HandshakeResult result) {
  std::array<std::uint8_t, kResultBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], static_cast<std::uint16_t>(result));
  Hmac256 mac = proof(masterKey(secret), "meridian-result", transcript, std::span(b).first(kResultMacAt));
  std::memcpy(&b[kResultMacAt], mac.data(), mac.size());
  return b;
}

Status decodeResult(std::string_view secret, const Transcript& transcript, std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kResultBytes || wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) {
    return peerError("handshake: malformed result");
  }
  Hmac256 got{};
  std::memcpy(got.data(), &bytes[kResultMacAt], got.size());
  if (!equalDigests(got, proof(masterKey(secret), "meridian-result", transcript, bytes.first(kResultMacAt)))) {
    return peerError("handshake: the server's result does not carry the job secret's proof (changed on the way)");
  }
  auto r = static_cast<HandshakeResult>(wire::load<std::uint16_t>(&bytes[4]));
  switch (r) {
    case HandshakeResult::kOk: return Status::ok();
    case HandshakeResult::kAuthFailed: return peerError("handshake: server says our job secret is wrong");
    case HandshakeResult::kVersionMismatch: return peerError("handshake: protocol version mismatch");
    case HandshakeResult::kModeMismatch: return peerError("handshake: MERIDIAN_WIRE_SECURITY differs between the ranks");
    case HandshakeResult::kRejected: return peerError("handshake: server rejected the connection (unknown session or rank)");
  }
  return peerError("handshake: unknown result code {}", static_cast<int>(r));
}

SessionKeys deriveSessionKeys(std::string_view secret, const Transcript& transcript, WireSecurity mode, bool client) {
  // Salt: both nonces (HELLO[8..40) and CHALLENGE[16..48)).
  std::array<std::uint8_t, 64> salt{};
  std::memcpy(salt.data(), &transcript.at(8), 32);
  std::memcpy(salt.data() + 32, &transcript.at(kHelloBytes + 16), 32);
  static constexpr std::string_view kLabel = "meridian-v2-session";
  std::vector<std::uint8_t> info(kLabel.begin(), kLabel.end());
  info.insert(info.end(), transcript.begin(), transcript.end());
  const Hmac256 master = masterKey(secret);
  std::array<std::uint8_t, 2 * (kAeadKeyBytes + kAeadIvBytes)> okm{};
  hkdfSha256(salt, master, info, okm);
  DirectionKey toServer, toClient;
  std::memcpy(toServer.key.data(), &okm[0], kAeadKeyBytes);
  std::memcpy(toServer.iv.data(), &okm[kAeadKeyBytes], kAeadIvBytes);
  std::memcpy(toClient.key.data(), &okm[kAeadKeyBytes + kAeadIvBytes], kAeadKeyBytes);
  std::memcpy(toClient.iv.data(), &okm[2 * kAeadKeyBytes + kAeadIvBytes], kAeadIvBytes);
  SessionKeys k;
  k.mode = mode;
  k.send = client ? toServer : toClient;
  k.recv = client ? toClient : toServer;
  return k;
}

namespace {
// A failed send or receive of handshake step `step`: a deadline is a timeout, said as such
// (never blamed on the secret); anything else keeps its code.
Status handshakeIo(const Status& st, const char* step) {
  if (st.isOk()) return st;
  if (st.code() == StatusCode::kTimeout) {
    return timeoutError("timed out waiting for the handshake ({}): {}", step, st.message());
  }
  return st.withContext(fmt::format("handshake ({})", step));
}
}  // namespace

Result<SessionKeys> clientHandshake(int fd, std::string_view secret, WireSecurity mode, const ConnectInfo& info,
                                    TimePoint deadline) {
  Nonce nc = freshNonce();
  auto hello = encodeHello(nc, mode);
  Transcript transcript(hello.begin(), hello.end());
  MERIDIAN_RETURN_IF_ERROR(handshakeIo(sendAll(fd, hello.data(), hello.size(), deadline), "sending the hello"));
  std::array<std::uint8_t, kChallengeBytes> ch{};
  MERIDIAN_RETURN_IF_ERROR(handshakeIo(recvAll(fd, ch.data(), ch.size(), deadline), "the server's challenge"));
  auto ns = verifyChallenge(secret, transcript, mode, ch);
  if (!ns) return ns.status();
  auto auth = encodeAuth(secret, transcript, info);
  MERIDIAN_RETURN_IF_ERROR(handshakeIo(sendAll(fd, auth.data(), auth.size(), deadline), "sending the proof"));
  std::array<std::uint8_t, kResultBytes> res{};
  MERIDIAN_RETURN_IF_ERROR(handshakeIo(recvAll(fd, res.data(), res.size(), deadline), "the server's verdict"));
  MERIDIAN_RETURN_IF_ERROR(decodeResult(secret, transcript, res));
  return deriveSessionKeys(secret, transcript, mode, /*client=*/true);
}

ServerHandshake::ServerHandshake(std::string secret, WireSecurity mode, Admit admit)
    : secret_(std::move(secret)),
      mode_(mode),
      admit_(std::move(admit)),
      serverNonce_(freshNonce()),
      result_(peerError("handshake: not finished")) {}

std::size_t ServerHandshake::wantBytes() const {
  switch (step_) {
    case Step::kHello: return kHelloBytes;
    case Step::kAuth: return kAuthBytes;
    case Step::kDone: return 0;
  }
  return 0;
}

std::vector<std::uint8_t> ServerHandshake::feed(std::span<const std::uint8_t> bytes) {
  if (bytes.size() != wantBytes()) {
    result_ = internalError("handshake: fed {} bytes where {} were due", bytes.size(), wantBytes());
    step_ = Step::kDone;
    return {};
  }
  if (step_ == Step::kHello) {
    std::uint16_t version = 0;
    WireSecurity clientMode = mode_;
    auto nc = decodeHello(bytes, &version, &clientMode);
    step_ = Step::kDone;
    transcript_.assign(bytes.begin(), bytes.end());
    if (!nc) {
      result_ = nc.status();
      if (version != 0 && version != kProtocolVersion) {  // a Meridian peer of another version
        auto ch = encodeChallenge(secret_, transcript_, serverNonce_, HandshakeResult::kVersionMismatch, mode_);
        return {ch.begin(), ch.end()};
      }
      return {};
    }
    if (clientMode != mode_) {
      result_ = peerError("handshake: the client runs MERIDIAN_WIRE_SECURITY={}, this rank {}: every rank must run the same",
                          wireSecurityName(clientMode), wireSecurityName(mode_));
      auto ch = encodeChallenge(secret_, transcript_, serverNonce_, HandshakeResult::kModeMismatch, mode_);
      return {ch.begin(), ch.end()};
    }
    step_ = Step::kAuth;
    auto ch = encodeChallenge(secret_, transcript_, serverNonce_, HandshakeResult::kOk, mode_);
    return {ch.begin(), ch.end()};
  }
  result_ = verifyAuth(secret_, transcript_, bytes);
  HandshakeResult verdict = result_ ? HandshakeResult::kOk : HandshakeResult::kAuthFailed;
  if (result_) {
    keys_ = deriveSessionKeys(secret_, transcript_, mode_, /*client=*/false);
    if (admit_) {
      if (Status why = admit_(result_.value()); !why.isOk()) {
        result_ = why;
        verdict = HandshakeResult::kRejected;
      }
    }
  } else {
    append(transcript_, bytes);  // the client's result MAC covers what it sent
  }
  step_ = Step::kDone;
  auto res = encodeResult(secret_, transcript_, verdict);
  return {res.begin(), res.end()};
}

Result<ServerHandshakeResult> serverHandshake(int fd, std::string_view secret, WireSecurity mode, TimePoint deadline,
                                              const ServerHandshake::Admit& admit) {
  ServerHandshake hs{std::string(secret), mode, admit};
  std::vector<std::uint8_t> in;
  while (!hs.finished()) {
    in.resize(hs.wantBytes());
    MERIDIAN_RETURN_IF_ERROR(handshakeIo(recvAll(fd, in.data(), in.size(), deadline), "the client's messages"));
    const std::vector<std::uint8_t> out = hs.feed(in);
    if (out.empty()) continue;
    Status sent = sendAll(fd, out.data(), out.size(), deadline);
    if (!sent.isOk() && hs.result()) return sent;  // a failure's own reason wins over a failed send
  }
  if (!hs.result()) return hs.result().status();
  return ServerHandshakeResult{hs.result().value(), hs.keys()};
}

}  // namespace meridian::transport::tcp
