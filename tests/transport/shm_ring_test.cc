// The shared-memory path's pieces that need no second process: the ring (records in order,
// wrap-around, full, and every impossible value a peer could write refused, never followed)
// and the pairing messages (round trips, and malformed ones refused with a reason).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/wire.h"
#include "transport/shm/pairing.h"
#include "transport/shm/ring.h"

namespace meridian::transport::shm {
namespace {

constexpr std::size_t kCapacity = 4096;

struct Memory {
  Memory() : bytes(ringBytes(kCapacity) + 64) {
    std::memset(raw(), 0, ringBytes(kCapacity));
  }
  std::uint8_t* raw() {
    auto p = reinterpret_cast<std::uintptr_t>(bytes.data());
    return bytes.data() + ((64 - p % 64) % 64);
  }
  RingControl& control() { return *reinterpret_cast<RingControl*>(raw()); }
  std::uint8_t* data() { return raw() + kRingControlBytes; }
  std::vector<std::uint8_t> bytes;
};

// Writes one record of `n` bytes, each `fill`; false when the ring is full.
bool put(RingWriter& w, std::size_t n, std::uint8_t fill) {
  std::size_t granted = 0;
  auto at = w.reserve(n, n, &granted);
  EXPECT_TRUE(at.isOk()) << at.status().toString();
  if (!at.isOk() || *at == nullptr) return false;
  EXPECT_EQ(granted, n);
  std::memset(*at, fill, n);
  w.commit(RecordKind::kFrame, n);
  return true;
}

TEST(ShmRingTest, RecordsArriveInOrderAcrossManyWrapArounds) {
  Memory m;
  RingWriter w(m.raw(), kCapacity);
  RingReader r(m.raw(), kCapacity);
  std::size_t written = 0, read = 0;
  for (int round = 0; round < 200; ++round) {
    // Sizes that do not divide the ring: pads happen at the end again and again.
    while (put(w, 100 + (written * 37) % 700, static_cast<std::uint8_t>(written))) ++written;
    Record rec;
    for (auto more = r.next(&rec); more.isOk() && *more; more = r.next(&rec)) {
      ASSERT_EQ(rec.kind, RecordKind::kFrame);
      ASSERT_EQ(rec.content.size(), 100 + (read * 37) % 700) << "record " << read;
      ASSERT_EQ(rec.content[0], static_cast<std::uint8_t>(read));
      ASSERT_EQ(rec.content.back(), static_cast<std::uint8_t>(read));
      r.release();
      ++read;
    }
    ASSERT_EQ(read, written);
  }
  EXPECT_GT(m.control().head.load(), 20 * kCapacity) << "the ring should have wrapped many times";
}

TEST(ShmRingTest, AFullRingSaysNotNowAndTakesMoreOnceRead) {
  Memory m;
  RingWriter w(m.raw(), kCapacity);
  RingReader r(m.raw(), kCapacity);
  int n = 0;
  while (put(w, 500, 1)) ++n;
  EXPECT_EQ(n, static_cast<int>(kCapacity / 512));
  EXPECT_FALSE(w.sleepUnlessRoom(500)) << "no room: the producer may sleep";
  Record rec;
  auto first = r.next(&rec);
  ASSERT_TRUE(first.isOk() && *first);
  r.release();
  EXPECT_TRUE(r.producerNeedsWaking()) << "the producer waited for room: the consumer rings it";
  EXPECT_TRUE(r.producerNeedsWaking()) << "until the producer says it is up again";
  w.awake();
  EXPECT_FALSE(r.producerNeedsWaking());
  EXPECT_TRUE(put(w, 500, 2));
}

TEST(ShmRingTest, TheSleepFlagsMeetTheirWakers) {
  Memory m;
  RingWriter w(m.raw(), kCapacity);
  RingReader r(m.raw(), kCapacity);
  EXPECT_FALSE(r.sleepUnlessPending()) << "empty: the consumer may sleep";
  ASSERT_TRUE(put(w, 8, 1));
  EXPECT_TRUE(w.consumerNeedsWaking());
  EXPECT_TRUE(w.consumerNeedsWaking()) << "only the sleeper takes its flag down (another thread may answer a ring)";
  EXPECT_TRUE(r.sleepUnlessPending()) << "a record waits: do not sleep";
  r.awake();
  EXPECT_FALSE(w.consumerNeedsWaking()) << "an awake consumer needs no ring";
  w.announceDoorbell(true);
  EXPECT_TRUE(r.producerRings());
}

TEST(ShmRingTest, ARecordLargerThanAQuarterOfTheRingIsRefused) {
  Memory m;
  RingWriter w(m.raw(), kCapacity);
  std::size_t granted = 0;
  EXPECT_FALSE(w.reserve(kCapacity / 2, kCapacity / 2, &granted).isOk());
  auto at = w.reserve(1, kCapacity, &granted);
  ASSERT_TRUE(at.isOk() && *at != nullptr);
  EXPECT_EQ(granted, w.maxContent()) << "a large want gets at most a quarter";
}

// What a broken or hostile peer could write into the shared memory.
TEST(ShmRingTest, ImpossibleCountersAndRecordHeadersAreRefusedNotFollowed) {
  {
    Memory m;
    RingReader r(m.raw(), kCapacity);
    m.control().head.store(kCapacity + 64);  // more than the ring holds
    Record rec;
    auto got = r.next(&rec);
    ASSERT_FALSE(got.isOk());
    EXPECT_EQ(got.status().code(), StatusCode::kPeerError);
  }
  {
    Memory m;
    RingReader r(m.raw(), kCapacity);
    wire::store<std::uint32_t>(m.data(), 1u << 30);  // a record past the end
    wire::store<std::uint32_t>(m.data() + 4, static_cast<std::uint32_t>(RecordKind::kFrame));
    m.control().head.store(64);
    Record rec;
    auto got = r.next(&rec);
    ASSERT_FALSE(got.isOk());
    EXPECT_NE(got.status().message().find("past the ring's end"), std::string::npos) << got.status().message();
  }
  {
    Memory m;
    RingReader r(m.raw(), kCapacity);
    wire::store<std::uint32_t>(m.data(), 200);  // longer than what was published
    wire::store<std::uint32_t>(m.data() + 4, static_cast<std::uint32_t>(RecordKind::kFrame));
    m.control().head.store(64);
    Record rec;
    EXPECT_FALSE(r.next(&rec).isOk());
  }
  {
    Memory m;
    RingReader r(m.raw(), kCapacity);
    wire::store<std::uint32_t>(m.data(), 8);
    wire::store<std::uint32_t>(m.data() + 4, 99);  // no such kind
    m.control().head.store(64);
    Record rec;
    auto got = r.next(&rec);
    ASSERT_FALSE(got.isOk());
    EXPECT_NE(got.status().message().find("unknown kind"), std::string::npos);
  }
  {
    Memory m;
    RingReader r(m.raw(), kCapacity);
    wire::store<std::uint32_t>(m.data(), 56);  // a pad that stops short of the end
    wire::store<std::uint32_t>(m.data() + 4, static_cast<std::uint32_t>(RecordKind::kPad));
    m.control().head.store(64);
    Record rec;
    EXPECT_FALSE(r.next(&rec).isOk());
  }
  {
    Memory m;
    RingWriter w(m.raw(), kCapacity);
    ASSERT_TRUE(put(w, 8, 1));
    m.control().tail.store(4096 * 3);  // the consumer "read" what was never written
    std::size_t granted = 0;
    auto at = w.reserve(8, 8, &granted);
    ASSERT_FALSE(at.isOk());
    EXPECT_EQ(at.status().code(), StatusCode::kPeerError);
  }
}

TEST(ShmPairingTest, EveryMessageRoundTrips) {
  PairingMessage hello;
  hello.kind = PairingKind::kHello;
  hello.pid = 4242;
  hello.doorbell = 17;
  hello.hostKey = "boot-id/1000/4026531840/4026531836";
  auto h = decodePairing(std::span<const std::uint8_t>(
                             reinterpret_cast<const std::uint8_t*>(encodePairing(hello).data()), encodePairing(hello).size()),
                         1 << 20);
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  EXPECT_EQ(h->kind, PairingKind::kHello);
  EXPECT_EQ(h->pid, 4242);
  EXPECT_EQ(h->doorbell, 17);
  EXPECT_EQ(h->hostKey, hello.hostKey);

  PairingMessage offer;
  offer.kind = PairingKind::kOffer;
  offer.doorbell = -1;
  offer.segment.name = "/meridian-0123456789abcdef-00ff";
  offer.segment.bytes = 1 << 20;
  offer.segment.ownerPid = 77;
  offer.segment.token[3] = 9;
  const std::string text = encodePairing(offer);
  auto o = decodePairing(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()),
                         2 << 20);
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->doorbell, -1);
  EXPECT_EQ(o->segment.name, offer.segment.name);
  EXPECT_EQ(o->segment.token, offer.segment.token);

  PairingMessage no;
  no.kind = PairingKind::kRefused;
  no.reason = std::string("another\nhost");
  const std::string refused = encodePairing(no);
  auto n = decodePairing(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(refused.data()), refused.size()), 1 << 20);
  ASSERT_TRUE(n.isOk()) << n.status().toString();
  EXPECT_EQ(n->reason, "another?host") << "control characters do not travel";
}

TEST(ShmPairingTest, MalformedMessagesAreRefusedWithAReason) {
  for (const std::string& bad : std::vector<std::string>{"", "hello", "hello 0 3 key", "hello 12 -5 key", "hello 12 3 ", "hello 12 3 a b",
                                "offer 3 v1 /etc/passwd 4096 1 00", "offer 3 v1 /meridian-x 99999999999 1 00",
                                "attached now", "bonjour", std::string("hello 1 2 \x01key"),
                                "refused " + std::string(600, 'x')}) {
    auto m = decodePairing(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bad.data()), bad.size()),
                           1 << 20);
    EXPECT_FALSE(m.isOk()) << "accepted '" << bad << "'";
    if (!m.isOk()) {
      EXPECT_EQ(m.status().code(), StatusCode::kPeerError) << bad;
    }
  }
}

TEST(ShmPairingTest, TakingADescriptorOfThisProcessWorksAndANonsenseOneSaysWhy) {
  auto mine = takePeerFd(static_cast<std::int32_t>(::getpid()), 0);
  if (!mine.isOk() && mine.status().message().find("not implemented") != std::string::npos) {
    GTEST_SKIP() << "this kernel has no pidfd_getfd: " << mine.status().message();
  }
  ASSERT_TRUE(mine.isOk()) << mine.status().toString();
  EXPECT_GE(mine->get(), 0);
  auto none = takePeerFd(static_cast<std::int32_t>(::getpid()), 987654);
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("pidfd_getfd"), std::string::npos) << none.status().message();
}

}  // namespace
}  // namespace meridian::transport::shm
