// Probe datagrams: fixed-size UDP messages that measure a path's round trip. A request
// carries the sender's timestamp; the peer echoes it back unchanged but for the type. Both
// are authenticated with the job secret (HMAC-SHA256, first 16 bytes), so a stranger on
// the network can neither forge echoes (and fake a fast path) nor use a node as a reflector.
//
//   offset  size  field
//        0     4  magic "MRPB"
//        4     1  version (1)
//        5     1  type: 1 request, 2 echo
//        6     2  path index (of the sender's paths)
//        8     8  session id (the communicator or probe job)
//       16     4  sender rank
//       20     4  target rank
//       24     8  sequence number (per path, from the request's sender)
//       32     8  send time of the request, sender's clock, microseconds
//       40     8  reserved (zero)
//       48    16  HMAC-SHA256(secret, bytes 0..47), truncated
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace meridian::routing {

inline constexpr std::size_t kProbeBytes = 64;
inline constexpr std::uint8_t kProbeVersion = 1;

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

std::array<std::uint8_t, kProbeBytes> encodeProbe(const ProbeMessage& m, std::span<const std::uint8_t> secret);

// Checks size, magic, version, type and MAC before reading anything else; every failure is
// an invalidArgument saying which.
Result<ProbeMessage> decodeProbe(std::span<const std::uint8_t> bytes, std::span<const std::uint8_t> secret);

}  // namespace meridian::routing
