#include "transport/fabric/link.h"

#include "core/secret.h"

namespace meridian::transport::fabric {

Result<std::vector<std::uint8_t>> encodeRailNames(std::span<const RailName> names) {
  if (names.size() > kMaxRails) return invalidArgument("{} fabric rails; at most {}", names.size(), kMaxRails);
  std::vector<std::uint8_t> out;
  out.push_back(static_cast<std::uint8_t>(names.size()));
  for (const auto& n : names) {
    if (n.empty() || n.size() > kMaxRailNameBytes) {
      return invalidArgument("a fabric rail name of {} bytes (1 to {})", n.size(), kMaxRailNameBytes);
    }
    out.push_back(static_cast<std::uint8_t>(n.size() & 0xff));
    out.push_back(static_cast<std::uint8_t>(n.size() >> 8));
    out.insert(out.end(), n.begin(), n.end());
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
    const std::size_t len = static_cast<std::size_t>(bytes[at]) | (static_cast<std::size_t>(bytes[at + 1]) << 8);
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
  for (int i = 0; i < 8; ++i) data.push_back(static_cast<std::uint8_t>(sessionId >> (8 * i)));
  for (std::uint32_t v : {static_cast<std::uint32_t>(initiator), static_cast<std::uint32_t>(path)}) {
    for (int i = 0; i < 4; ++i) data.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  // Each name with its length first, so no two (from, to) pairs give the same bytes.
  for (auto name : {from, to}) {
    data.push_back(static_cast<std::uint8_t>(name.size() & 0xff));
    data.push_back(static_cast<std::uint8_t>(name.size() >> 8));
    data.insert(data.end(), name.begin(), name.end());
  }
  const auto key = std::span(reinterpret_cast<const std::uint8_t*>(secret.data()), secret.size());
  const Hmac256 mac = hmacSha256(key, data);
  std::uint64_t tag = 0;
  for (int i = 0; i < 8; ++i) tag |= static_cast<std::uint64_t>(mac[static_cast<std::size_t>(i)]) << (8 * i);
  return tag & ((std::uint64_t{1} << kMinTagBits) - 1);
}

}  // namespace meridian::transport::fabric
