// Probe datagrams: fixed-size UDP messages that measure a path's round trip. A request
// carries the sender's timestamp; the peer echoes it back unchanged but for the type. Both
// are sealed with AES-256-GCM under the probe key (HKDF-SHA256 of the job secret), whatever
// MERIDIAN_WIRE_SECURITY says (a probe is 76 bytes: sealing it costs well under a
// microsecond), so a stranger on the network can neither read them (who probes whom, when,
// in which session), forge echoes (and fake a fast path), nor use a node as a reflector for
// datagrams of its own. Each datagram has a fresh random 96-bit nonce (one key seals every
// probe of the job: random nonces stay unique with overwhelming odds up to 2^32 datagrams,
// far more than a job sends). An echo counts only for a request its prober sent, and only
// once (PathEstimator::onEcho), so a replayed echo is worthless.
//
//   offset  size  field (clear)
//        0     4  magic "MRPB"
//        4     1  version (2)
//        5     3  reserved (zero)
//        8    12  nonce (random)
//   sealed (40 bytes at offset 20, the record's length authenticated):
//       +0     1  type: 1 request, 2 echo
//       +1     1  reserved (zero)
//       +2     2  path index (of the request's sender's paths)
//       +4     8  session id (the communicator or probe job)
//      +12     4  request's sender rank
//      +16     4  request's target rank
//      +20     8  sequence number (per path, from the request's sender)
//      +28     8  send time of the request, sender's clock, microseconds
//      +36     4  reserved (zero)
//       60    16  AES-GCM tag
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace meridian::routing {

inline constexpr std::size_t kProbeBytes = 76;
inline constexpr std::uint8_t kProbeVersion = 2;

enum class ProbeType : std::uint8_t { kRequest = 1, kEcho = 2 };

struct ProbeMessage {
  ProbeType type = ProbeType::kRequest;
  std::uint16_t path = 0;
  std::uint64_t sessionId = 0;
  std::int32_t senderRank = 0;
  std::int32_t targetRank = 0;
  std::uint64_t seq = 0;
  std::int64_t sendTimeUs = 0;
  bool operator==(const ProbeMessage&) const = default;
};

// The key every probe of a job is sealed with, from the job secret.
using ProbeKey = std::array<std::uint8_t, 32>;
ProbeKey probeKey(std::span<const std::uint8_t> secret);

std::array<std::uint8_t, kProbeBytes> encodeProbe(const ProbeMessage& m, const ProbeKey& key);

// Checks size, magic and version, then opens the sealed part (the tag), then the type:
// every failure is an invalidArgument saying which; nothing sealed is read before its tag
// checked.
Result<ProbeMessage> decodeProbe(std::span<const std::uint8_t> bytes, const ProbeKey& key);

}  // namespace meridian::routing
