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

Hmac256 proof(std::string_view secret, std::string_view role, const Nonce& nc, const Nonce& ns,
              std::span<const std::uint8_t> extra = {}) {
  std::vector<std::uint8_t> msg;
  msg.reserve(role.size() + nc.size() + ns.size() + extra.size());
  msg.insert(msg.end(), role.begin(), role.end());
  msg.insert(msg.end(), nc.begin(), nc.end());
  msg.insert(msg.end(), ns.begin(), ns.end());
  msg.insert(msg.end(), extra.begin(), extra.end());
  return hmacSha256(asBytes(secret), msg);
}

constexpr std::size_t kInfoBytes = 24;

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

}  // namespace

Nonce freshNonce() {
  Nonce n{};
  randomBytes(n);
  return n;
}

std::array<std::uint8_t, kHelloBytes> encodeHello(const Nonce& clientNonce) {
  std::array<std::uint8_t, kHelloBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], kProtocolVersion);
  std::memcpy(&b[8], clientNonce.data(), clientNonce.size());
  return b;
}

Result<Nonce> decodeHello(std::span<const std::uint8_t> bytes, std::uint16_t* peerVersion) {
  if (bytes.size() != kHelloBytes) return peerError("handshake: hello is {} bytes, expected {}", bytes.size(), kHelloBytes);
  if (wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) {
    return peerError("handshake: bad magic 0x{:08x} (not a Meridian peer)", wire::load<std::uint32_t>(&bytes[0]));
  }
  std::uint16_t version = wire::load<std::uint16_t>(&bytes[4]);
  if (peerVersion) *peerVersion = version;
  if (version != kProtocolVersion) {
    return peerError("handshake: peer speaks protocol version {}, this build speaks {}", version, kProtocolVersion);
  }
  Nonce n{};
  std::memcpy(n.data(), &bytes[8], n.size());
  return n;
}

std::array<std::uint8_t, kChallengeBytes> encodeChallenge(std::string_view secret, const Nonce& clientNonce,
                                                          const Nonce& serverNonce, HandshakeResult status) {
  std::array<std::uint8_t, kChallengeBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], kProtocolVersion);
  wire::store<std::uint16_t>(&b[6], static_cast<std::uint16_t>(status));
  std::memcpy(&b[8], serverNonce.data(), serverNonce.size());
  Hmac256 mac = proof(secret, "meridian-server", clientNonce, serverNonce);
  std::memcpy(&b[40], mac.data(), mac.size());
  return b;
}

Result<Nonce> verifyChallenge(std::string_view secret, const Nonce& clientNonce,
                              std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kChallengeBytes) return peerError("handshake: challenge has the wrong size");
  if (wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) return peerError("handshake: bad magic from server");
  std::uint16_t version = wire::load<std::uint16_t>(&bytes[4]);
  auto status = static_cast<HandshakeResult>(wire::load<std::uint16_t>(&bytes[6]));
  if (status == HandshakeResult::kVersionMismatch || version != kProtocolVersion) {
    return peerError("handshake: server speaks protocol version {}, this build speaks {}", version, kProtocolVersion);
  }
  if (status != HandshakeResult::kOk) return peerError("handshake: server refused the connection");
  Nonce ns{};
  std::memcpy(ns.data(), &bytes[8], ns.size());
  Hmac256 got{};
  std::memcpy(got.data(), &bytes[40], got.size());
  if (!equalDigests(got, proof(secret, "meridian-server", clientNonce, ns))) {
    return peerError("handshake: server does not hold the job secret (MERIDIAN_SECRET differs)");
  }
  return ns;
}

std::array<std::uint8_t, kAuthBytes> encodeAuth(std::string_view secret, const Nonce& clientNonce,
                                                const Nonce& serverNonce, const ConnectInfo& info) {
  std::array<std::uint8_t, kAuthBytes> b{};
  auto infoBytes = encodeInfo(info);
  Hmac256 mac = proof(secret, "meridian-client", clientNonce, serverNonce, infoBytes);
  std::memcpy(&b[0], mac.data(), mac.size());
  std::memcpy(&b[32], infoBytes.data(), infoBytes.size());
  return b;
}

Result<ConnectInfo> verifyAuth(std::string_view secret, const Nonce& clientNonce, const Nonce& serverNonce,
                               std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kAuthBytes) return peerError("handshake: auth has the wrong size");
  Hmac256 got{};
  std::memcpy(got.data(), &bytes[0], got.size());
  auto info = bytes.subspan(32, kInfoBytes);
  if (!equalDigests(got, proof(secret, "meridian-client", clientNonce, serverNonce, info))) {
    return peerError("handshake: client does not hold the job secret (MERIDIAN_SECRET differs)");
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
  ci.rank = wire::load<std::int32_t>(&info[16]);
  ci.relayTarget = wire::load<std::int32_t>(&info[20]);
  if (ci.kind == ConnectionKind::kRelay && (ci.relayTarget < 0 || ci.relayTarget == ci.rank)) {
    return peerError("handshake: relay from rank {} to rank {} names no other rank", ci.rank, ci.relayTarget);
  }
  if (ci.streamCount == 0 || ci.streamIndex >= ci.streamCount) {
    return peerError("handshake: stream {} of {} is out of range", ci.streamIndex, ci.streamCount);
  }
  return ci;
}

std::array<std::uint8_t, kResultBytes> encodeResult(HandshakeResult result) {
  std::array<std::uint8_t, kResultBytes> b{};
  wire::store<std::uint32_t>(&b[0], kHandshakeMagic);
  wire::store<std::uint16_t>(&b[4], static_cast<std::uint16_t>(result));
  return b;
}

Status decodeResult(std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kResultBytes || wire::load<std::uint32_t>(&bytes[0]) != kHandshakeMagic) {
    return peerError("handshake: malformed result");
  }
  auto r = static_cast<HandshakeResult>(wire::load<std::uint16_t>(&bytes[4]));
  switch (r) {
    case HandshakeResult::kOk: return Status::ok();
    case HandshakeResult::kAuthFailed: return peerError("handshake: server says our job secret is wrong");
    case HandshakeResult::kVersionMismatch: return peerError("handshake: protocol version mismatch");
    case HandshakeResult::kRejected: return peerError("handshake: server rejected the connection (unknown session or rank)");
  }
  return peerError("handshake: unknown result code {}", static_cast<int>(r));
}

Status clientHandshake(int fd, std::string_view secret, const ConnectInfo& info, TimePoint deadline) {
  Nonce nc = freshNonce();
  auto hello = encodeHello(nc);
  MERIDIAN_RETURN_IF_ERROR(sendAll(fd, hello.data(), hello.size(), deadline));
  std::array<std::uint8_t, kChallengeBytes> ch{};
  MERIDIAN_RETURN_IF_ERROR(recvAll(fd, ch.data(), ch.size(), deadline).withContext("handshake"));
  auto ns = verifyChallenge(secret, nc, ch);
  if (!ns) return ns.status();
  auto auth = encodeAuth(secret, nc, ns.value(), info);
  MERIDIAN_RETURN_IF_ERROR(sendAll(fd, auth.data(), auth.size(), deadline));
  std::array<std::uint8_t, kResultBytes> res{};
  MERIDIAN_RETURN_IF_ERROR(recvAll(fd, res.data(), res.size(), deadline).withContext("handshake"));
  return decodeResult(res);
}

ServerHandshake::ServerHandshake(std::string secret, Admit admit)
    : secret_(std::move(secret)),
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
    auto nc = decodeHello(bytes, &version);
    if (!nc) {
      result_ = nc.status();
      step_ = Step::kDone;
      if (version != 0 && version != kProtocolVersion) {  // a Meridian peer of another version
        auto ch = encodeChallenge(secret_, Nonce{}, serverNonce_, HandshakeResult::kVersionMismatch);
        return {ch.begin(), ch.end()};
      }
      return {};
    }
    clientNonce_ = nc.value();
    step_ = Step::kAuth;
    auto ch = encodeChallenge(secret_, clientNonce_, serverNonce_, HandshakeResult::kOk);
    return {ch.begin(), ch.end()};
  }
  result_ = verifyAuth(secret_, clientNonce_, serverNonce_, bytes);
  HandshakeResult verdict = result_ ? HandshakeResult::kOk : HandshakeResult::kAuthFailed;
  if (result_ && admit_) {
    if (Status why = admit_(result_.value()); !why.isOk()) {
      result_ = why;
      verdict = HandshakeResult::kRejected;
    }
  }
  step_ = Step::kDone;
  auto res = encodeResult(verdict);
  return {res.begin(), res.end()};
}

Result<ConnectInfo> serverHandshake(int fd, std::string_view secret, TimePoint deadline,
                                    const ServerHandshake::Admit& admit) {
  ServerHandshake hs{std::string(secret), admit};
  std::vector<std::uint8_t> in;
  while (!hs.finished()) {
    in.resize(hs.wantBytes());
    MERIDIAN_RETURN_IF_ERROR(recvAll(fd, in.data(), in.size(), deadline).withContext("handshake"));
    const std::vector<std::uint8_t> out = hs.feed(in);
    if (out.empty()) continue;
    Status sent = sendAll(fd, out.data(), out.size(), deadline);
    if (!sent.isOk() && hs.result()) return sent;  // a failure's own reason wins over a failed send
  }
  return hs.result();
}

}  // namespace meridian::transport::tcp
