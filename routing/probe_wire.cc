#include "routing/probe_wire.h"

#include <cstring>

#include "core/secret.h"
#include "core/wire.h"

namespace meridian::routing {

namespace {

constexpr std::uint8_t kMagic[4] = {'M', 'R', 'P', 'B'};
constexpr std::size_t kMacOffset = 48;
constexpr std::size_t kMacBytes = 16;

}  // namespace

std::array<std::uint8_t, kProbeBytes> encodeProbe(const ProbeMessage& m, std::span<const std::uint8_t> secret) {
  std::array<std::uint8_t, kProbeBytes> b{};
  std::memcpy(b.data(), kMagic, 4);
  b[4] = kProbeVersion;
  b[5] = static_cast<std::uint8_t>(m.type);
  wire::store<std::uint16_t>(&b[6], m.path);
  wire::store<std::uint64_t>(&b[8], m.sessionId);
  wire::store<std::int32_t>(&b[16], m.senderRank);
  wire::store<std::int32_t>(&b[20], m.targetRank);
  wire::store<std::uint64_t>(&b[24], m.seq);
  wire::store<std::int64_t>(&b[32], m.sendTimeUs);
  Hmac256 mac = hmacSha256(secret, std::span<const std::uint8_t>(b.data(), kMacOffset));
  std::memcpy(&b[kMacOffset], mac.data(), kMacBytes);
  return b;
}

Result<ProbeMessage> decodeProbe(std::span<const std::uint8_t> bytes, std::span<const std::uint8_t> secret) {
  if (bytes.size() != kProbeBytes) return invalidArgument("probe of {} bytes (expected {})", bytes.size(), kProbeBytes);
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) return invalidArgument("not a probe (bad magic)");
  if (bytes[4] != kProbeVersion) return invalidArgument("probe version {} (this build speaks {})", bytes[4], kProbeVersion);
  if (bytes[5] != static_cast<std::uint8_t>(ProbeType::kRequest) && bytes[5] != static_cast<std::uint8_t>(ProbeType::kEcho)) {
    return invalidArgument("unknown probe type {}", bytes[5]);
  }
  Hmac256 mac = hmacSha256(secret, bytes.first(kMacOffset));
  // Constant-time comparison of the truncated MAC.
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < kMacBytes; ++i) diff = static_cast<std::uint8_t>(diff | (mac[i] ^ bytes[kMacOffset + i]));
  if (diff != 0) return invalidArgument("probe with a bad MAC (wrong job secret or altered)");
  ProbeMessage m;
  m.type = static_cast<ProbeType>(bytes[5]);
  m.path = wire::load<std::uint16_t>(&bytes[6]);
  m.sessionId = wire::load<std::uint64_t>(&bytes[8]);
  m.senderRank = wire::load<std::int32_t>(&bytes[16]);
  m.targetRank = wire::load<std::int32_t>(&bytes[20]);
  m.seq = wire::load<std::uint64_t>(&bytes[24]);
  m.sendTimeUs = wire::load<std::int64_t>(&bytes[32]);
  return m;
}

}  // namespace meridian::routing
