// The connection handshake: a versioned, mutual HMAC-SHA256 challenge-response that
// proves both ends hold the job secret before a single frame is exchanged.
//
//   client -> server  HELLO      magic, version, client nonce                  (40 bytes)
//   server -> client  CHALLENGE  magic, version, status, server nonce,
//                                HMAC(secret, "server" | nonceC | nonceS)      (72 bytes)
//   client -> server  AUTH       HMAC(secret, "client" | nonceC | nonceS | info), info (56 bytes)
//   server -> client  RESULT     magic, status                                 (8 bytes)
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

#include "core/clock.h"
#include "core/secret.h"
#include "core/status.h"

namespace meridian::transport::tcp {

inline constexpr std::uint32_t kHandshakeMagic = 0x4E44524D;  // "MRDN" little-endian
inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::size_t kHelloBytes = 40;
inline constexpr std::size_t kChallengeBytes = 72;
inline constexpr std::size_t kAuthBytes = 56;
inline constexpr std::size_t kResultBytes = 8;

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

enum class HandshakeResult : std::uint16_t { kOk = 0, kVersionMismatch = 1, kAuthFailed = 2, kRejected = 3 };

std::array<std::uint8_t, kHelloBytes> encodeHello(const Nonce& clientNonce);
// Fails with kPeerError on bad magic or a version we do not speak (the message says which).
Result<Nonce> decodeHello(std::span<const std::uint8_t> bytes, std::uint16_t* peerVersion = nullptr);

std::array<std::uint8_t, kChallengeBytes> encodeChallenge(std::string_view secret, const Nonce& clientNonce,
                                                          const Nonce& serverNonce, HandshakeResult status);
// Checks the server's proof; returns the server nonce.
Result<Nonce> verifyChallenge(std::string_view secret, const Nonce& clientNonce,
                              std::span<const std::uint8_t> bytes);

std::array<std::uint8_t, kAuthBytes> encodeAuth(std::string_view secret, const Nonce& clientNonce,
                                                const Nonce& serverNonce, const ConnectInfo& info);
Result<ConnectInfo> verifyAuth(std::string_view secret, const Nonce& clientNonce, const Nonce& serverNonce,
                               std::span<const std::uint8_t> bytes);

std::array<std::uint8_t, kResultBytes> encodeResult(HandshakeResult result);
Status decodeResult(std::span<const std::uint8_t> bytes);

// The server's side: feed it exactly wantBytes() bytes at a time as they arrive, send back
// what each feed returns, until finished(); result() then says who connected, or why not.
// A client of another version is told so (a CHALLENGE with kVersionMismatch); garbage is
// told nothing. `admit` (optional) decides on an authenticated client: an error refuses
// it with kRejected and becomes the result.
class ServerHandshake {
 public:
  using Admit = std::function<Status(const ConnectInfo&)>;
  ServerHandshake(std::string secret, Admit admit = {});
  std::size_t wantBytes() const;
  std::vector<std::uint8_t> feed(std::span<const std::uint8_t> bytes);
  bool finished() const { return step_ == Step::kDone; }
  const Result<ConnectInfo>& result() const { return result_; }

 private:
  enum class Step : std::uint8_t { kHello, kAuth, kDone };
  std::string secret_;
  Admit admit_;
  Step step_ = Step::kHello;
  Nonce clientNonce_{};
  Nonce serverNonce_{};
  Result<ConnectInfo> result_;
};

// Blocking wrappers for set-up paths (fd must be a blocking or pollable socket).
Status clientHandshake(int fd, std::string_view secret, const ConnectInfo& info, TimePoint deadline);
Result<ConnectInfo> serverHandshake(int fd, std::string_view secret, TimePoint deadline,
                                    const ServerHandshake::Admit& admit = {});

Nonce freshNonce();

}  // namespace meridian::transport::tcp
