// The frame header codec: round trips and every bound checked before use.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/wire.h"
#include "transport/frame.h"

namespace meridian::transport {
namespace {

FrameHeader sample() {
  FrameHeader h;
  h.type = FrameType::kData;
  h.tag = 0x1122334455667788ull;
  h.seq = 42;
  h.prevSameTag = 7;
  h.prevExact = true;
  h.offset = 1 << 20;
  h.totalBytes = 3 << 20;
  h.length = 512 * 1024;
  return h;
}

TEST(FrameTest, RoundTripsEveryField) {
  FrameHeader h = sample();
  auto bytes = encodeFrameHeader(h);
  auto d = decodeFrameHeader(bytes);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d->type, h.type);
  EXPECT_EQ(d->tag, h.tag);
  EXPECT_EQ(d->seq, h.seq);
  EXPECT_EQ(d->prevSameTag, h.prevSameTag);
  EXPECT_TRUE(d->prevExact);
  EXPECT_EQ(d->offset, h.offset);
  EXPECT_EQ(d->totalBytes, h.totalBytes);
  EXPECT_EQ(d->length, h.length);
}

TEST(FrameTest, RefusesWrongSize) {
  auto bytes = encodeFrameHeader(sample());
  auto d = decodeFrameHeader(std::span<const std::uint8_t>(bytes.data(), bytes.size() - 1));
  EXPECT_EQ(d.status().code(), StatusCode::kPeerError);
}

TEST(FrameTest, RefusesBadMagic) {
  auto bytes = encodeFrameHeader(sample());
  bytes[0] ^= 0xff;
  auto d = decodeFrameHeader(bytes);
  EXPECT_EQ(d.status().code(), StatusCode::kPeerError);
  EXPECT_NE(d.status().message().find("magic"), std::string::npos);
}

TEST(FrameTest, RefusesOtherVersionNamingIt) {
  auto bytes = encodeFrameHeader(sample());
  bytes[2] = kFrameVersion + 1;
  auto d = decodeFrameHeader(bytes);
  EXPECT_EQ(d.status().code(), StatusCode::kPeerError);
  EXPECT_NE(d.status().message().find(fmt::format("version {}", kFrameVersion + 1)), std::string::npos);
}

TEST(FrameTest, RemoteRefRoundTripsAddressAndKey) {
  const RemoteRef ref{0x00007f0012345678ULL, 0xfeedface01020304ULL};
  const RemoteRefBytes b = encodeRemoteRef(ref);
  const RemoteRef back = decodeRemoteRef(b);
  EXPECT_EQ(back.address, ref.address);
  EXPECT_EQ(back.key, ref.key);
  EXPECT_EQ(b[0], 0x78) << "little-endian on the wire";
  EXPECT_EQ(b[8], 0x04);
}

TEST(FrameTest, RefusesUnknownTypeAndReservedBits) {
  auto bytes = encodeFrameHeader(sample());
  bytes[3] = 9;
  EXPECT_FALSE(decodeFrameHeader(bytes).isOk());
  bytes = encodeFrameHeader(sample());
  bytes[53] = 1;
  EXPECT_FALSE(decodeFrameHeader(bytes).isOk());
  bytes = encodeFrameHeader(sample());
  bytes[4] |= 2;  // only the prev-exact flag is defined
  EXPECT_FALSE(decodeFrameHeader(bytes).isOk());
}

TEST(FrameTest, RefusesOversizedChunkBeforeAnyAllocation) {
  FrameHeader h = sample();
  h.totalBytes = 1ull << 32;
  h.offset = 0;
  auto bytes = encodeFrameHeader(h);
  wire::store<std::uint32_t>(&bytes[48], kMaxChunkBytes + 1);
  auto d = decodeFrameHeader(bytes);
  ASSERT_FALSE(d.isOk());
  EXPECT_NE(d.status().message().find("exceeds the bound"), std::string::npos);
}

TEST(FrameTest, RefusesOversizedMessage) {
  FrameHeader h = sample();
  auto bytes = encodeFrameHeader(h);
  wire::store<std::uint64_t>(&bytes[40], kMaxMessageBytes + 1);
  EXPECT_FALSE(decodeFrameHeader(bytes).isOk());
}

TEST(FrameTest, RefusesChunkOutsideItsMessage) {
  FrameHeader h = sample();
  h.offset = h.totalBytes - 10;
  h.length = 11;
  EXPECT_FALSE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
  h.offset = ~0ull - 5;  // would wrap when added
  h.length = 10;
  EXPECT_FALSE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
}

TEST(FrameTest, RefusesPreviousSameTagThatIsNotEarlier) {
  FrameHeader h = sample();
  h.prevSameTag = h.seq;
  EXPECT_FALSE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
  h.prevSameTag = kNoPrevSeq;
  EXPECT_TRUE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
}

TEST(FrameTest, AcceptsZeroLengthMessage) {
  FrameHeader h;
  h.totalBytes = 0;
  h.length = 0;
  EXPECT_TRUE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
}

}  // namespace
}  // namespace meridian::transport
