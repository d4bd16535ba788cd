#include "transport/fabric/link.h"

#include <algorithm>

#include "core/secret.h"
#include "core/wire.h"

namespace meridian::transport::fabric {
namespace {

// Appends `v` little-endian (core/wire.h's layout).
template <typename T>
void append(std::vector<std::uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  wire::store<T>(out.data() + at, v);
}

void appendName(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> name) {
  append<std::uint16_t>(out, static_cast<std::uint16_t>(name.size()));
  out.insert(out.end(), name.begin(), name.end());
}

}  // namespace

Result<std::vector<std::uint8_t>> encodeRailNames(std::span<const RailName> names) {
  if (names.size() > kMaxRails) return invalidArgument("{} fabric rails; at most {}", names.size(), kMaxRails);
  std::vector<std::uint8_t> out;
  out.push_back(static_cast<std::uint8_t>(names.size()));
  for (const auto& n : names) {
    if (n.empty() || n.size() > kMaxRailNameBytes) {
      return invalidArgument("a fabric rail name of {} bytes (1 to {})", n.size(), kMaxRailNameBytes);
    }
    appendName(out, n);
  }
  return out;
}

Result<std::vector<RailName>> decodeRailNames(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return peerError("empty fabric rail names");
  const std::size_t count = bytes[0];
  if (count > kMaxRails) return peerError("{} fabric rail names; at most {}", count, kMaxRails);
  std::vector<RailName> names;
  std::size_t at = 1;
  for (std::size_t i = 0; i < count; ++i) {
    if (bytes.size() - at < 2) return peerError("fabric rail name {} of {}: its length is missing", i, count);
    const std::size_t len = wire::load<std::uint16_t>(bytes.data() + at);
    at += 2;
    if (len == 0 || len > kMaxRailNameBytes) {
      return peerError("fabric rail name {} of {} bytes (1 to {})", i, len, kMaxRailNameBytes);
    }
    if (bytes.size() - at < len) return peerError("fabric rail name {}: {} bytes said, {} there", i, len, bytes.size() - at);
    names.emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
  }
  if (at != bytes.size()) return peerError("{} bytes after {} fabric rail names", bytes.size() - at, count);
  return names;
}

std::uint64_t fabricPathTag(std::string_view secret, std::uint64_t sessionId, int initiator, std::size_t path,
                            std::span<const std::uint8_t> from, std::span<const std::uint8_t> to) {
  std::vector<std::uint8_t> data;
  constexpr std::string_view kLabel = "meridian fabric path";
  data.insert(data.end(), kLabel.begin(), kLabel.end());
  append<std::uint64_t>(data, sessionId);
  append<std::uint32_t>(data, static_cast<std::uint32_t>(initiator));
  append<std::uint32_t>(data, static_cast<std::uint32_t>(path));
  // Each name with its length first, so no two (from, to) pairs give the same bytes.
  appendName(data, from);
  appendName(data, to);
  const auto key = std::span(reinterpret_cast<const std::uint8_t*>(secret.data()), secret.size());
  const Hmac256 mac = hmacSha256(key, data);
  return wire::load<std::uint64_t>(mac.data()) & ((std::uint64_t{1} << kMinTagBits) - 1);
}

FabricSeed fabricSeed(const DirectionKey& streamKey) {
  constexpr std::string_view kLabel = "meridian fabric seed";
  std::vector<std::uint8_t> ikm(streamKey.key.begin(), streamKey.key.end());
  ikm.insert(ikm.end(), streamKey.iv.begin(), streamKey.iv.end());
  FabricSeed seed{};
  hkdfSha256({}, ikm, std::span(reinterpret_cast<const std::uint8_t*>(kLabel.data()), kLabel.size()), seed);
  return seed;
}

DirectionKey fabricPathKey(const FabricSeed& seed, std::size_t path, std::span<const std::uint8_t> from,
                           std::span<const std::uint8_t> to) {
  std::vector<std::uint8_t> info;
  constexpr std::string_view kLabel = "meridian fabric key";
  info.insert(info.end(), kLabel.begin(), kLabel.end());
  append<std::uint32_t>(info, static_cast<std::uint32_t>(path));
  appendName(info, from);
  appendName(info, to);
  std::array<std::uint8_t, kAeadKeyBytes + kAeadIvBytes> out{};
  hkdfSha256({}, seed, info, out);
  DirectionKey k;
  std::copy_n(out.begin(), kAeadKeyBytes, k.key.begin());
  std::copy_n(out.begin() + kAeadKeyBytes, kAeadIvBytes, k.iv.begin());
  return k;
}

}  // namespace meridian::transport::fabric
