// Sealed records: round trips in every mode, and every kind of tampering an on-path attacker
// can do to a record (flip, drop, replay, reorder, cut, another key) fails its tag.
#include "core/aead.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace meridian {
namespace {

DirectionKey keyOf(std::uint8_t seed) {
  DirectionKey k;
  for (std::size_t i = 0; i < k.key.size(); ++i) k.key[i] = static_cast<std::uint8_t>(seed + i);
  for (std::size_t i = 0; i < k.iv.size(); ++i) k.iv[i] = static_cast<std::uint8_t>(seed * 3 + i);
  return k;
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed = 1) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 7);
  return v;
}

struct Sealed {
  std::vector<std::uint8_t> body;
  std::array<std::uint8_t, kAeadTagBytes> tag{};
};

Sealed sealOne(RecordCipher& c, const std::vector<std::uint8_t>& in) {
  Sealed s;
  s.body.resize(in.size());
  c.seal(in, s.body.data(), s.tag.data());
  return s;
}

class AeadModes : public ::testing::TestWithParam<WireSecurity> {};

TEST_P(AeadModes, RecordsRoundTripWholeAndStreamed) {
  RecordCipher tx(GetParam(), RecordCipher::Role::kSeal, keyOf(1));
  RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(1));
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{56}, std::size_t{70000}}) {
    auto in = pattern(n);
    Sealed s = sealOne(tx, in);
    if (GetParam() == WireSecurity::kEncrypt && n >= 16) {
      EXPECT_NE(s.body, in) << "encrypt left the bytes readable";
    } else if (GetParam() != WireSecurity::kEncrypt) {
      EXPECT_EQ(s.body, in);
    }
    std::vector<std::uint8_t> out(n);
    // Opened in uneven pieces, as bytes arrive from a socket.
    rx.begin(n);
    for (std::size_t done = 0; done < n;) {
      std::size_t step = std::min<std::size_t>(n - done, 1 + done % 4093);
      rx.update(s.body.data() + done, out.data() + done, step);
      done += step;
    }
    EXPECT_TRUE(rx.finishOpen(s.tag.data())) << n;
    EXPECT_EQ(out, in);
  }
  EXPECT_EQ(tx.records(), 4u);
  EXPECT_EQ(rx.records(), 4u);
}

INSTANTIATE_TEST_SUITE_P(All, AeadModes,
                         ::testing::Values(WireSecurity::kEncrypt, WireSecurity::kAuthenticate, WireSecurity::kOff),
                         [](const auto& p) { return std::string(wireSecurityName(p.param)); });

class AeadTamper : public ::testing::TestWithParam<WireSecurity> {};

TEST_P(AeadTamper, FlippedBitFailsTheTag) {
  RecordCipher tx(GetParam(), RecordCipher::Role::kSeal, keyOf(2));
  RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(2));
  Sealed s = sealOne(tx, pattern(1000));
  s.body[500] ^= 0x01;
  std::vector<std::uint8_t> out(1000);
  EXPECT_FALSE(rx.open(s.body, out.data(), s.tag.data()));
}

TEST_P(AeadTamper, FlippedTagFails) {
  RecordCipher tx(GetParam(), RecordCipher::Role::kSeal, keyOf(2));
  RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(2));
  Sealed s = sealOne(tx, pattern(64));
  s.tag[0] ^= 0x80;
  std::vector<std::uint8_t> out(64);
  EXPECT_FALSE(rx.open(s.body, out.data(), s.tag.data()));
}

TEST_P(AeadTamper, DroppedReplayedOrReorderedRecordsFail) {
  RecordCipher tx(GetParam(), RecordCipher::Role::kSeal, keyOf(3));
  Sealed a = sealOne(tx, pattern(100, 1));
  Sealed b = sealOne(tx, pattern(100, 2));
  std::vector<std::uint8_t> out(100);
  {  // b first (a dropped, or the two swapped)
    RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(3));
    EXPECT_FALSE(rx.open(b.body, out.data(), b.tag.data()));
  }
  {  // a twice (a replay)
    RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(3));
    EXPECT_TRUE(rx.open(a.body, out.data(), a.tag.data()));
    EXPECT_FALSE(rx.open(a.body, out.data(), a.tag.data()));
  }
}

TEST_P(AeadTamper, CutRecordOrOtherKeyFails) {
  RecordCipher tx(GetParam(), RecordCipher::Role::kSeal, keyOf(4));
  Sealed s = sealOne(tx, pattern(100));
  std::vector<std::uint8_t> out(100);
  {
    RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(4));
    EXPECT_FALSE(rx.open(std::span(s.body).first(99), out.data(), s.tag.data()));
  }
  {
    RecordCipher rx(GetParam(), RecordCipher::Role::kOpen, keyOf(5));
    EXPECT_FALSE(rx.open(s.body, out.data(), s.tag.data()));
  }
}

INSTANTIATE_TEST_SUITE_P(Protected, AeadTamper, ::testing::Values(WireSecurity::kEncrypt, WireSecurity::kAuthenticate),
                         [](const auto& p) { return std::string(wireSecurityName(p.param)); });

TEST(Aead, OffChecksNothing) {
  RecordCipher tx(WireSecurity::kOff, RecordCipher::Role::kSeal, keyOf(6));
  RecordCipher rx(WireSecurity::kOff, RecordCipher::Role::kOpen, keyOf(7));
  EXPECT_EQ(tx.tagBytes(), 0u);
  Sealed s = sealOne(tx, pattern(10));
  s.body[0] ^= 1;
  std::vector<std::uint8_t> out(10);
  EXPECT_TRUE(rx.open(s.body, out.data(), s.tag.data()));
  EXPECT_EQ(out, s.body);
}

TEST(Aead, BothEndsStepToANewKeyAtTheSameRecord) {
  constexpr std::uint64_t kLimit = 4096;
  RecordCipher tx(WireSecurity::kEncrypt, RecordCipher::Role::kSeal, keyOf(8), kLimit);
  RecordCipher rx(WireSecurity::kEncrypt, RecordCipher::Role::kOpen, keyOf(8), kLimit);
  RecordCipher stale(WireSecurity::kEncrypt, RecordCipher::Role::kOpen, keyOf(8));  // never rekeys
  std::vector<std::uint8_t> out(1000);
  for (int i = 0; i < 10; ++i) {
    auto in = pattern(1000, static_cast<std::uint8_t>(i));
    Sealed s = sealOne(tx, in);
    ASSERT_TRUE(rx.open(s.body, out.data(), s.tag.data())) << "record " << i;
    EXPECT_EQ(out, in);
    const bool staleOk = stale.open(s.body, out.data(), s.tag.data());
    EXPECT_EQ(staleOk, i < 5) << "record " << i << ": the key must change after 4096 bytes (5 records)";
  }
}

// ------------------------------------------------------------------ numbered records

TEST_P(AeadTamper, NumberedRecordsOpenInAnyOrderAndOnlyAsNumbered) {
  NumberedCipher tx(GetParam(), NumberedCipher::Role::kSeal, keyOf(5));
  NumberedCipher rx(GetParam(), NumberedCipher::Role::kOpen, keyOf(5));
  // Numbers across an epoch boundary, opened out of order (late records of the last epoch
  // still open after the next epoch's first).
  const std::uint64_t base = (std::uint64_t{1} << kNumberedEpochShift) - 2;
  std::vector<Sealed> sealed;
  for (std::uint64_t k = 0; k < 4; ++k) {
    auto in = pattern(1000 + k, static_cast<std::uint8_t>(k));
    Sealed s;
    s.body.resize(in.size());
    tx.seal(base + k, in, s.body.data(), s.tag.data());
    sealed.push_back(std::move(s));
  }
  for (std::uint64_t k : {3, 0, 2, 1}) {
    std::vector<std::uint8_t> out(sealed[k].body.size());
    EXPECT_TRUE(rx.open(base + k, sealed[k].body, out.data(), sealed[k].tag.data())) << k;
    EXPECT_EQ(out, pattern(1000 + k, static_cast<std::uint8_t>(k)));
  }
  // Opened under another number (a replayed frame with its number rewritten), or with a
  // flipped bit: the tag fails.
  std::vector<std::uint8_t> out(sealed[1].body.size());
  EXPECT_FALSE(rx.open(base + 0, sealed[1].body, out.data(), sealed[1].tag.data()));
  sealed[2].body[17] ^= 1;
  EXPECT_FALSE(rx.open(base + 2, sealed[2].body, out.data(), sealed[2].tag.data()));
  // Another direction's key fails.
  NumberedCipher other(GetParam(), NumberedCipher::Role::kOpen, keyOf(6));
  EXPECT_FALSE(other.open(base + 3, sealed[3].body, out.data(), sealed[3].tag.data()));
}

TEST(Aead, NumberedRecordsAreBounded) {
  NumberedCipher tx(WireSecurity::kEncrypt, NumberedCipher::Role::kSeal, keyOf(7));
  EXPECT_THROW(tx.begin(0, kMaxNumberedRecordBytes + 1), std::logic_error);
  tx.begin(0, 4);
  EXPECT_THROW(tx.begin(1, 4), std::logic_error) << "a record began inside another";
}

TEST(Aead, ReplayWindowTakesEachNumberOnce) {
  ReplayWindow w;
  EXPECT_TRUE(w.fresh(0));
  w.take(0);
  EXPECT_FALSE(w.fresh(0));
  // Reordered within the window: each once.
  w.take(5);
  for (std::uint64_t n : {1, 2, 3, 4}) {
    EXPECT_TRUE(w.fresh(n)) << n;
    w.take(n);
    EXPECT_FALSE(w.fresh(n)) << n;
  }
  EXPECT_FALSE(w.fresh(5));
  EXPECT_TRUE(w.fresh(6));
  // A jump: what is a window behind the highest is too old, what is inside and unseen is fresh.
  const std::uint64_t top = 5 + ReplayWindow::kWindow + 10;
  w.take(top);
  EXPECT_FALSE(w.fresh(top));
  EXPECT_FALSE(w.fresh(top - ReplayWindow::kWindow)) << "too old";
  EXPECT_TRUE(w.fresh(top - ReplayWindow::kWindow + 1));
  EXPECT_TRUE(w.fresh(top - 1));
  // Slots reused by new numbers forget the old ones without forgetting the new.
  w.take(top + 1);
  EXPECT_FALSE(w.fresh(top + 1));
  EXPECT_TRUE(w.fresh(top + 2));
  // A jump of more than a window clears everything behind.
  w.take(top + 5 * ReplayWindow::kWindow);
  EXPECT_TRUE(w.fresh(top + 5 * ReplayWindow::kWindow - 1));
  EXPECT_FALSE(w.fresh(top + 1));
  EXPECT_FALSE(w.fresh(~0ull));
}

TEST(Aead, HkdfMatchesRfc5869CaseOne) {
  std::vector<std::uint8_t> ikm(22, 0x0b), salt(13), info(10);
  std::iota(salt.begin(), salt.end(), 0);
  std::iota(info.begin(), info.end(), 0xf0);
  std::array<std::uint8_t, 42> okm{};
  hkdfSha256(salt, ikm, info, okm);
  const std::array<std::uint8_t, 42> want{0x3c, 0xb2, 0x5f, 0x25, 0xfa, 0xac, 0xd5, 0x7a, 0x90, 0x43, 0x4f, 0x64, 0xd0, 0x36,
                                          0x2f, 0x2a, 0x2d, 0x2d, 0x0a, 0x90, 0xcf, 0x1a, 0x5a, 0x4c, 0x5d, 0xb0, 0x2d, 0x56,
                                          0xec, 0xc4, 0xc5, 0xbf, 0x34, 0x00, 0x72, 0x08, 0xd5, 0xb8, 0x87, 0x18, 0x58, 0x65};
  EXPECT_EQ(okm, want);
}

TEST(Aead, ModesParseAndNameEachOther) {
  for (WireSecurity m : {WireSecurity::kEncrypt, WireSecurity::kAuthenticate, WireSecurity::kOff}) {
    EXPECT_EQ(parseWireSecurity(wireSecurityName(m)).value(), m);
  }
  EXPECT_FALSE(parseWireSecurity("tls").isOk());
}

}  // namespace
}  // namespace meridian
