#include "routing/probe_wire.h"

#include <cstring>

#include "core/aead.h"
#include "core/secret.h"
#include "core/wire.h"

namespace meridian::routing {

namespace {

constexpr std::uint8_t kMagic[4] = {'M', 'R', 'P', 'B'};
constexpr std::size_t kNonceOffset = 8;
constexpr std::size_t kBodyOffset = kNonceOffset + kAeadIvBytes;
constexpr std::size_t kBodyBytes = 40;
constexpr std::size_t kTagOffset = kBodyOffset + kBodyBytes;
static_assert(kTagOffset + kAeadTagBytes == kProbeBytes);

// One probe's cipher: the job's probe key with the datagram's nonce as its IV, record 0.
NumberedCipher probeCipher(const ProbeKey& key, const std::uint8_t* nonce, NumberedCipher::Role role) {
  DirectionKey dk;
  dk.key = key;
  std::memcpy(dk.iv.data(), nonce, dk.iv.size());
  return NumberedCipher(WireSecurity::kEncrypt, role, dk);
}

}  // namespace

ProbeKey probeKey(std::span<const std::uint8_t> secret) {
  static constexpr char kInfo[] = "meridian probe key";
  ProbeKey key{};
  hkdfSha256({}, secret, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(kInfo), sizeof(kInfo) - 1),
             key);
  return key;
}

std::array<std::uint8_t, kProbeBytes> encodeProbe(const ProbeMessage& m, const ProbeKey& key) {
  std::array<std::uint8_t, kProbeBytes> b{};
  std::memcpy(b.data(), kMagic, 4);
  b[4] = kProbeVersion;
  randomBytes(std::span<std::uint8_t>(&b[kNonceOffset], kAeadIvBytes));
  std::array<std::uint8_t, kBodyBytes> body{};
  body[0] = static_cast<std::uint8_t>(m.type);
  wire::store<std::uint16_t>(&body[2], m.path);
  wire::store<std::uint64_t>(&body[4], m.sessionId);
  wire::store<std::int32_t>(&body[12], m.senderRank);
  wire::store<std::int32_t>(&body[16], m.targetRank);
  wire::store<std::uint64_t>(&body[20], m.seq);
  wire::store<std::int64_t>(&body[28], m.sendTimeUs);
  probeCipher(key, &b[kNonceOffset], NumberedCipher::Role::kSeal).seal(0, body, &b[kBodyOffset], &b[kTagOffset]);
  return b;
}

Result<ProbeMessage> decodeProbe(std::span<const std::uint8_t> bytes, const ProbeKey& key) {
  if (bytes.size() != kProbeBytes) return invalidArgument("probe of {} bytes (expected {})", bytes.size(), kProbeBytes);
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) return invalidArgument("not a probe (bad magic)");
  if (bytes[4] != kProbeVersion) return invalidArgument("probe version {} (this build speaks {})", bytes[4], kProbeVersion);
  std::array<std::uint8_t, kBodyBytes> body{};
  if (!probeCipher(key, &bytes[kNonceOffset], NumberedCipher::Role::kOpen)
           .open(0, bytes.subspan(kBodyOffset, kBodyBytes), body.data(), &bytes[kTagOffset])) {
    return invalidArgument("probe failed its tag (wrong job secret, or altered on the way)");
  }
  if (body[0] != static_cast<std::uint8_t>(ProbeType::kRequest) && body[0] != static_cast<std::uint8_t>(ProbeType::kEcho)) {
    return invalidArgument("unknown probe type {}", body[0]);
  }
  ProbeMessage m;
  m.type = static_cast<ProbeType>(body[0]);
  m.path = wire::load<std::uint16_t>(&body[2]);
  m.sessionId = wire::load<std::uint64_t>(&body[4]);
  m.senderRank = wire::load<std::int32_t>(&body[12]);
  m.targetRank = wire::load<std::int32_t>(&body[16]);
  m.seq = wire::load<std::uint64_t>(&body[20]);
  m.sendTimeUs = wire::load<std::int64_t>(&body[28]);
  return m;
}

}  // namespace meridian::routing
