// The data-stream frame: a fixed 56-byte little-endian header, then `length` payload
// bytes for DATA frames, or a 16-byte remote-read descriptor for DATA-REF frames. Every field from the wire is checked against its bound here,
// before anything is allocated or read. Pure; unit-tested and fuzzed.
//
//  0 magic u16 "MF" | 2 version u8 | 3 type u8 | 4 flags u32 | 8 tag u64
// 16 seq u64 (per-channel message number) | 24 prevSameTag u64 | 32 offset u64
// 40 totalBytes u64 | 48 length u32 | 52 reserved u32 (0)
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/status.h"

namespace meridian::transport {

inline constexpr std::uint16_t kFrameMagic = 0x464D;  // "MF"
// 2: DATA-REF frames carry a RemoteRef (address and key) instead of a bare address.
// 3: PATH-NAMES frames.
inline constexpr std::uint8_t kFrameVersion = 3;
inline constexpr std::size_t kFrameHeaderBytes = 56;
inline constexpr std::uint32_t kMaxChunkBytes = 64u << 20;           // one chunk's payload
inline constexpr std::uint64_t kMaxMessageBytes = 1ull << 40;        // one message (1 TiB)
// prevSameTag: kNoPrevSeq means "the first message with this tag"; otherwise every
// earlier message with the tag has a seq <= prevSameTag, and with kFlagPrevExact set
// prevSameTag is exactly the previous one.
inline constexpr std::uint64_t kNoPrevSeq = ~0ull;
inline constexpr std::uint32_t kFlagPrevExact = 1u;

enum class FrameType : std::uint8_t {
  kData = 1,   // a chunk of a message; `length` payload bytes follow
  kAck = 2,    // the receiver placed chunk (seq, offset, length)
  kClose = 3,  // the sender is closing the stream on purpose
  // A chunk the receiver reads from the sender's memory itself: as kData, but what follows
  // is a RemoteRef (kRemoteRefBytes) naming where the chunk's first byte lies in the sender,
  // not its `length` payload bytes.
  kDataRef = 4,
  // The sender's fabric rail names (transport/fabric/link.h): `length` bytes follow, at
  // most kMaxPathNamesPayloadBytes (totalBytes = length, offset 0). Once per channel, on its
  // first TCP stream, from a sender that has rails: the receiver pairs its own with them.
  kPathNames = 5,
  // Pairing a shared-memory path (transport/shm/pairing.h): `length` bytes follow, as for
  // kPathNames, on a channel's first TCP stream.
  kShmPairing = 6,
};
inline constexpr std::uint32_t kMaxPathNamesPayloadBytes = 4096;

// Where a DATA-REF chunk lies in the sender's memory: what every kind of remote read needs.
// Same-host cross-memory attach uses the address (key 0); RDMA READ the address and the
// registration's remote key; shared memory an offset and the segment's key. The backend
// that reads it checks both against what it may read before it reads.
struct RemoteRef {
  std::uint64_t address = 0;
  std::uint64_t key = 0;
};
inline constexpr std::size_t kRemoteRefBytes = 16;
using RemoteRefBytes = std::array<std::uint8_t, kRemoteRefBytes>;
RemoteRefBytes encodeRemoteRef(const RemoteRef& ref);
RemoteRef decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes> bytes);

struct FrameHeader {
  FrameType type = FrameType::kData;
  std::uint64_t tag = 0;
  std::uint64_t seq = 0;
  std::uint64_t prevSameTag = kNoPrevSeq;  // see kNoPrevSeq
  bool prevExact = false;                  // prevSameTag is exactly the previous same-tag message
  std::uint64_t offset = 0;
  std::uint64_t totalBytes = 0;
  std::uint32_t length = 0;
};

using FrameHeaderBytes = std::array<std::uint8_t, kFrameHeaderBytes>;

FrameHeaderBytes encodeFrameHeader(const FrameHeader& h);
// Fails with kPeerError (naming the field and its bound) on a bad magic, unknown version
// or type, non-zero reserved bits, or a length/offset/total outside its bound.
Result<FrameHeader> decodeFrameHeader(std::span<const std::uint8_t> bytes);

}  // namespace meridian::transport
