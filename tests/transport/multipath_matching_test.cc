// MultipathChannel's receive side driven by hand, as its progress thread would drive it: where
// an arriving message lands depends on whether its receive was posted, including a receive
// posted by another thread while the progress round that reads the message is under way.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "transport/frame.h"
#include "transport/multipath/multipath_channel.h"

namespace meridian::transport {
namespace {

std::shared_ptr<MultipathChannel> oneRankChannel() {
  return std::make_shared<MultipathChannel>(1, std::vector<PathEndpoints>{{"127.0.0.1:1", "127.0.0.1:2"}},
                                            MultipathConfig{}, [] {});
}

FrameHeader firstChunk(std::uint64_t tag, std::uint32_t bytes) {
  FrameHeader h;
  h.type = FrameType::kData;
  h.tag = tag;
  h.seq = 0;
  h.totalBytes = bytes;
  h.length = bytes;
  return h;
}

// The payload of the chunk `t` arrives (as readStream copies it) and the chunk completes.
void deliver(MultipathChannel& ch, const RecvTarget& t, const std::vector<std::uint8_t>& payload) {
  std::uint8_t* dst = ch.targetPointer(t, 0);
  ASSERT_NE(dst, nullptr);
  std::memcpy(dst, payload.data(), payload.size());
  ASSERT_TRUE(ch.onDataComplete(t, 0).isOk());
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7);
  return v;
}

TEST(MultipathMatchingTest, AReceivePostedDuringTheProgressRoundTakesItsMessageInPlace) {
  auto ch = oneRankChannel();
  ch->drainPosted();  // the round began: nothing was posted yet
  std::vector<std::uint8_t> buf(4096);
  RequestPtr req = ch->irecv(buf.data(), buf.size(), 7).value();  // posted meanwhile, not drained
  auto t = ch->onDataHeader(firstChunk(7, 4096), 0);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  // Straight into the caller's buffer: no early-message buffer, no copy afterwards.
  EXPECT_EQ(ch->targetPointer(t.value(), 0), buf.data());
  const auto payload = pattern(4096, 3);
  deliver(*ch, t.value(), payload);
  ASSERT_TRUE(req->done());
  EXPECT_TRUE(req->status().isOk()) << req->status().toString();
  EXPECT_EQ(req->bytes(), 4096u);
  EXPECT_EQ(buf, payload);
}

TEST(MultipathMatchingTest, AMessageAheadOfItsReceiveIsBufferedAndCopiedOnce) {
  auto ch = oneRankChannel();
  ch->drainPosted();
  auto t = ch->onDataHeader(firstChunk(9, 4096), 0);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  const auto payload = pattern(4096, 11);
  std::vector<std::uint8_t> buf(4096);
  EXPECT_NE(ch->targetPointer(t.value(), 0), buf.data());
  deliver(*ch, t.value(), payload);
  RequestPtr req = ch->irecv(buf.data(), buf.size(), 9).value();
  EXPECT_FALSE(req->done()) << "a receive is bound on the progress thread, not when posted";
  ch->drainPosted();
  ASSERT_TRUE(req->done());
  EXPECT_TRUE(req->status().isOk()) << req->status().toString();
  EXPECT_EQ(buf, payload);
}

TEST(MultipathMatchingTest, ALateReceiveKeepsItsTagsOrderBehindEarlierBufferedMessages) {
  // Two messages of tag 5: the first arrives before any receive (buffered); two receives
  // are then posted during the round in which the second arrives. The first receive must
  // get the first message, the second the second, in place.
  auto ch = oneRankChannel();
  ch->drainPosted();
  auto t0 = ch->onDataHeader(firstChunk(5, 64), 0);
  ASSERT_TRUE(t0.isOk());
  const auto first = pattern(64, 1), second = pattern(64, 2);
  deliver(*ch, t0.value(), first);
  std::vector<std::uint8_t> a(64), b(64);
  RequestPtr ra = ch->irecv(a.data(), a.size(), 5).value();
  RequestPtr rb = ch->irecv(b.data(), b.size(), 5).value();
  FrameHeader h = firstChunk(5, 64);
  h.seq = 1;
  h.prevSameTag = 0;
  h.prevExact = true;
  auto t1 = ch->onDataHeader(h, 0);
  ASSERT_TRUE(t1.isOk()) << t1.status().toString();
  EXPECT_EQ(ch->targetPointer(t1.value(), 0), b.data());
  deliver(*ch, t1.value(), second);
  ASSERT_TRUE(ra->done() && rb->done());
  EXPECT_EQ(a, first);
  EXPECT_EQ(b, second);
}

}  // namespace
}  // namespace meridian::transport
