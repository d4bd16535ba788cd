// What two ranks settle to pair their fabric rails: the list of rail names one side sends
// the other (in a PATH-NAMES frame on the channel's first TCP stream, which the mutual
// HMAC handshake authenticated), and the tags of the fabric path between them.
//
// Names: count u8, then per rail its name's length u16 (little-endian) and its bytes; at
// most kMaxRails rails of at most kMaxRailNameBytes each (the frame's bound,
// kMaxPathNamesBytes, follows). Decoding bounds every length before use; the rail checks
// each name's form when it adds the peer (Rail::addPeer). Pure; unit-tested and fuzzed.
//
// Tags: the frames of path k of the channel that rank i opened in session s, sent from
// the rail named `from` to the rail named `to`, carry the low 60 bits of
// HMAC-SHA256(secret, "meridian fabric path" | s | i | k | from | to). Every channel's paths
// on a shared rail get their own tags (a device has one channel per peer and session, and
// the two directions differ), and a party without the job secret cannot name them.
//
// Keys (sealed fabric frames, see path.h): the direction of path k from rail `from` to rail
// `to` is sealed under HKDF-SHA256(ikm = seed, info = "meridian fabric key" | k | from | to),
// where the seed is fabricSeed() of the sending key of the TCP stream on which the sender
// named its rails. Only the two ends of that stream's handshake hold it, and it is fresh
// for every connection, so no two channels (nor a channel made again) share a key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/aead.h"
#include "core/status.h"
#include "transport/fabric/rail.h"

namespace meridian::transport::fabric {

inline constexpr std::size_t kMaxRails = 8;
inline constexpr std::size_t kMaxPathNamesBytes = 1 + kMaxRails * (2 + kMaxRailNameBytes);

using RailName = std::vector<std::uint8_t>;

// invalidArgument for more than kMaxRails names, an empty one or one over kMaxRailNameBytes.
Result<std::vector<std::uint8_t>> encodeRailNames(std::span<const RailName> names);
// kPeerError naming the problem: empty, a count over kMaxRails, a name of length 0 or over
// kMaxRailNameBytes, bytes missing or left over.
Result<std::vector<RailName>> decodeRailNames(std::span<const std::uint8_t> bytes);

// The tag of fabric path `path`'s frames from rail `from` to rail `to` on the channel that
// rank `initiator` opened in session `sessionId`.
std::uint64_t fabricPathTag(std::string_view secret, std::uint64_t sessionId, int initiator, std::size_t path,
                            std::span<const std::uint8_t> from, std::span<const std::uint8_t> to);

using FabricSeed = std::array<std::uint8_t, kAeadKeyBytes>;
// The seed a TCP stream's direction key gives its channel's fabric paths.
FabricSeed fabricSeed(const DirectionKey& streamKey);
// The key of fabric path `path`'s frames from rail `from` to rail `to`.
DirectionKey fabricPathKey(const FabricSeed& seed, std::size_t path, std::span<const std::uint8_t> from,
                           std::span<const std::uint8_t> to);

}  // namespace meridian::transport::fabric
