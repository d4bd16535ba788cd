// The connection handshake: a versioned, mutual challenge-response over the job secret that
// also agrees the wire-security mode and derives the connection's session keys. Version 2.
//
//   master     = HMAC-SHA256("meridian-master-v2", secret)
//   rankKey(r) = HMAC-SHA256(master, "meridian-rank" | r)
//
//   client -> server  HELLO      magic, version, mode, client nonce                       (40 bytes)
//   server -> client  CHALLENGE  magic, version, status, mode, server nonce,
//                                HMAC(master, "meridian-server" | HELLO | CHALLENGE[0..48))  (80 bytes)
//   client -> server  AUTH       HMAC(rankKey(info.rank), "meridian-client" | HELLO |
//                                     CHALLENGE | info), info                              (56 bytes)
//   server -> client  RESULT     magic, status, HMAC(master, "meridian-result" | HELLO |
//                                     CHALLENGE | AUTH | RESULT[0..8))                     (40 bytes)
//
// Every MAC covers the whole transcript so far: a changed mode (a downgrade), nonce or
// field fails it. The client proves the key of the rank it claims, so a connection is bound
// to one rank. Session keys: HKDF-SHA256(salt = client nonce | server nonce, ikm = master,
// info = "meridian-v2-session" | HELLO | CHALLENGE | AUTH) gives each direction its own
// AES-256-GCM key and IV (core/aead.h); every frame after the handshake is a sealed record.
// Both ends must run the same MERIDIAN_WIRE_SECURITY; a mismatch is refused, saying which.
//
// The codec below is pure (unit-tested and fuzzed). The server's side is one state machine
// without I/O (ServerHandshake) that both the blocking wrapper for set-up paths
// (serverHandshake, the store) and the TCP engine's non-blocking acceptor drive.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/aead.h"
#include "core/clock.h"
#include "core/secret.h"
#include "core/status.h"

namespace meridian::transport::tcp {

inline constexpr std::uint32_t kHandshakeMagic = 0x4E44524D;  // "MRDN" little-endian
inline constexpr std::uint16_t kProtocolVersion = 2;
inline constexpr std::size_t kHelloBytes = 40;
inline constexpr std::size_t kChallengeBytes = 80;
inline constexpr std::size_t kAuthBytes = 56;
inline constexpr std::size_t kResultBytes = 40;

using Nonce = std::array<std::uint8_t, 32>;

// kRelay: the client asks the server to splice the connection through to `relayTarget`'s
// path `pathIndex` (both in session `sessionId`); the client then runs a data-stream
// handshake with the target end to end, through the relay.
enum class ConnectionKind : std::uint16_t { kDataStream = 1, kStore = 2, kRelay = 3 };

// What the client tells the server once authenticated.
struct ConnectInfo {
  ConnectionKind kind = ConnectionKind::kDataStream;
  std::uint64_t sessionId = 0;   // which communicator/job the stream belongs to
  std::int32_t rank = -1;        // the client's rank
  std::uint16_t pathIndex = 0;   // which path of the channel
  std::uint16_t streamIndex = 0; // which stream of the path
  std::uint16_t streamCount = 1; // streams the client opens on this path
  std::int32_t relayTarget = -1; // kRelay: the rank to splice through to
  std::uint8_t pathCount = 0;    // kDataStream: paths the client opens (0: not said)
};

enum class HandshakeResult : std::uint16_t {
  kOk = 0,
  kVersionMismatch = 1,
  kAuthFailed = 2,
  kRejected = 3,
  kModeMismatch = 4,  // the two ends run different MERIDIAN_WIRE_SECURITY
};

// What a finished handshake leaves each end: the agreed mode and its two directions' keys.
struct SessionKeys {
  WireSecurity mode = WireSecurity::kEncrypt;
  DirectionKey send;
  DirectionKey recv;
};

// The handshake's running transcript (every message so far, in order).
using Transcript = std::vector<std::uint8_t>;

std::array<std::uint8_t, kHelloBytes> encodeHello(const Nonce& clientNonce, WireSecurity mode);
// Fails with kPeerError on bad magic or a version we do not speak (the message says which).
// *mode gets the client's mode (an unknown one is an error).
Result<Nonce> decodeHello(std::span<const std::uint8_t> bytes, std::uint16_t* peerVersion = nullptr,
                          WireSecurity* mode = nullptr);

// transcript: HELLO so far; the challenge is appended.
std::array<std::uint8_t, kChallengeBytes> encodeChallenge(std::string_view secret, Transcript& transcript,
                                                          const Nonce& serverNonce, HandshakeResult status,
                                                          WireSecurity mode);
// Checks the server's proof and mode (transcript: HELLO; the challenge is appended); returns
// the server nonce.
Result<Nonce> verifyChallenge(std::string_view secret, Transcript& transcript, WireSecurity mode,
                              std::span<const std::uint8_t> bytes);

std::array<std::uint8_t, kAuthBytes> encodeAuth(std::string_view secret, Transcript& transcript,
                                                const ConnectInfo& info);
Result<ConnectInfo> verifyAuth(std::string_view secret, Transcript& transcript, std::span<const std::uint8_t> bytes);

std::array<std::uint8_t, kResultBytes> encodeResult(std::string_view secret, const Transcript& transcript,
                                                    HandshakeResult result);
Status decodeResult(std::string_view secret, const Transcript& transcript, std::span<const std::uint8_t> bytes);

// Both ends' keys from the finished transcript (HELLO | CHALLENGE | AUTH); `client` picks
// which direction is send.
SessionKeys deriveSessionKeys(std::string_view secret, const Transcript& transcript, WireSecurity mode, bool client);

// The server's side: feed it exactly wantBytes() bytes at a time as they arrive, send back
// what each feed returns, until finished(); result() then says who connected, or why not.
// A client of another version is told so (a CHALLENGE with kVersionMismatch); garbage is
// told nothing. `admit` (optional) decides on an authenticated client: an error refuses
// it with kRejected and becomes the result.
class ServerHandshake {
 public:
  using Admit = std::function<Status(const ConnectInfo&)>;
  ServerHandshake(std::string secret, WireSecurity mode, Admit admit = {});
  std::size_t wantBytes() const;
  std::vector<std::uint8_t> feed(std::span<const std::uint8_t> bytes);
  bool finished() const { return step_ == Step::kDone; }
  const Result<ConnectInfo>& result() const { return result_; }
  // The session keys, once result() is ok.
  const SessionKeys& keys() const { return keys_; }

 private:
  enum class Step : std::uint8_t { kHello, kAuth, kDone };
  std::string secret_;
  WireSecurity mode_;
  Admit admit_;
  Step step_ = Step::kHello;
  Nonce serverNonce_{};
  Transcript transcript_;
  Result<ConnectInfo> result_;
  SessionKeys keys_;
};

// Blocking wrappers for set-up paths (fd must be a blocking or pollable socket).
Result<SessionKeys> clientHandshake(int fd, std::string_view secret, WireSecurity mode, const ConnectInfo& info,
                                    TimePoint deadline);
struct ServerHandshakeResult {
  ConnectInfo info;
  SessionKeys keys;
};
Result<ServerHandshakeResult> serverHandshake(int fd, std::string_view secret, WireSecurity mode, TimePoint deadline,
                                              const ServerHandshake::Admit& admit = {});

Nonce freshNonce();

}  // namespace meridian::transport::tcp
