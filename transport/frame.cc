// Frame header codec.
#include "transport/frame.h"

#include "core/wire.h"

namespace meridian::transport {

// Layout (bytes): 0 magic u16 | 2 version u8 | 3 type u8 | 4 flags u32 | 8 tag u64 |
// 16 seq u64 | 24 prevSameTag u64 | 32 offset u64 | 40 totalBytes u64 | 48 length u32 |
// 52 reserved u32.
FrameHeaderBytes encodeFrameHeader(const FrameHeader& h) {
  FrameHeaderBytes b{};
  wire::store<std::uint16_t>(&b[0], kFrameMagic);
  b[2] = kFrameVersion;
  b[3] = static_cast<std::uint8_t>(h.type);
  wire::store<std::uint32_t>(&b[4], h.prevExact ? kFlagPrevExact : 0u);
  wire::store<std::uint64_t>(&b[8], h.tag);
  wire::store<std::uint64_t>(&b[16], h.seq);
  wire::store<std::uint64_t>(&b[24], h.prevSameTag);
  wire::store<std::uint64_t>(&b[32], h.offset);
  wire::store<std::uint64_t>(&b[40], h.totalBytes);
  wire::store<std::uint32_t>(&b[48], h.length);
  return b;
}

Result<FrameHeader> decodeFrameHeader(std::span<const std::uint8_t> b) {
  if (b.size() != kFrameHeaderBytes) {
    return peerError("frame: header is {} bytes, expected {}", b.size(), kFrameHeaderBytes);
  }
  if (wire::load<std::uint16_t>(&b[0]) != kFrameMagic) {
    return peerError("frame: bad magic 0x{:04x}", wire::load<std::uint16_t>(&b[0]));
  }
  if (b[2] != kFrameVersion) {
    return peerError("frame: version {} not supported (this build speaks {})", b[2], kFrameVersion);
  }
  const std::uint32_t flags = wire::load<std::uint32_t>(&b[4]);
  if ((flags & ~kFlagPrevExact) != 0 || wire::load<std::uint32_t>(&b[52]) != 0) {
    return peerError("frame: reserved bits set");
  }
  FrameHeader h;
  h.prevExact = (flags & kFlagPrevExact) != 0;
  std::uint8_t type = b[3];
  if (type < static_cast<std::uint8_t>(FrameType::kData) || type > static_cast<std::uint8_t>(FrameType::kShmPairing)) {
    return peerError("frame: unknown type {}", type);
  }
  h.type = static_cast<FrameType>(type);
  h.tag = wire::load<std::uint64_t>(&b[8]);
  h.seq = wire::load<std::uint64_t>(&b[16]);
  h.prevSameTag = wire::load<std::uint64_t>(&b[24]);
  h.offset = wire::load<std::uint64_t>(&b[32]);
  h.totalBytes = wire::load<std::uint64_t>(&b[40]);
  h.length = wire::load<std::uint32_t>(&b[48]);
  if (h.length > kMaxChunkBytes) {
    return peerError("frame: chunk length {} exceeds the bound {}", h.length, kMaxChunkBytes);
  }
  if (h.totalBytes > kMaxMessageBytes) {
    return peerError("frame: message size {} exceeds the bound {}", h.totalBytes, kMaxMessageBytes);
  }
  if (h.offset > h.totalBytes || h.length > h.totalBytes - h.offset) {
    return peerError("frame: chunk [{}, +{}) lies outside its {}-byte message", h.offset, h.length, h.totalBytes);
  }
  if (h.prevSameTag != kNoPrevSeq && h.prevSameTag >= h.seq) {
    return peerError("frame: previous same-tag message {} is not before message {}", h.prevSameTag, h.seq);
  }
  if (h.type == FrameType::kClose && (h.length != 0 || h.totalBytes != 0)) {
    return peerError("frame: close frame carries a length");
  }
  if ((h.type == FrameType::kPathNames || h.type == FrameType::kShmPairing) &&
      (h.length == 0 || h.length > kMaxPathNamesPayloadBytes || h.offset != 0 || h.totalBytes != h.length)) {
    return peerError("frame: path-names frame of {} bytes (1 to {}, offset 0, total = length)", h.length,
                     kMaxPathNamesPayloadBytes);
  }
  return h;
}

RemoteRefBytes encodeRemoteRef(const RemoteRef& ref) {
  RemoteRefBytes b{};
  wire::store<std::uint64_t>(&b[0], ref.address);
  wire::store<std::uint64_t>(&b[8], ref.key);
  return b;
}

RemoteRef decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes> b) {
  return RemoteRef{wire::load<std::uint64_t>(&b[0]), wire::load<std::uint64_t>(&b[8])};
}

}  // namespace meridian::transport
