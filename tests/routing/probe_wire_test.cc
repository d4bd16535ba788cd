// Probe datagram codec: round trip, and every kind of bad datagram refused with a reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "routing/probe_wire.h"

namespace meridian::routing {
namespace {

const std::string kSecret = "job-secret";
ProbeKey key(const std::string& s = kSecret) {
  return probeKey(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

ProbeMessage sample() {
  ProbeMessage m;
  m.type = ProbeType::kEcho;
  m.path = 3;
  m.sessionId = 0x0123456789abcdefull;
  m.senderRank = 5;
  m.targetRank = 17;
  m.seq = 99;
  m.sendTimeUs = -42;  // a clock value is opaque: any 64-bit value goes through
  return m;
}

TEST(ProbeWireTest, RoundTrips) {
  auto bytes = encodeProbe(sample(), key());
  auto back = decodeProbe(bytes, key());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value(), sample());
}

TEST(ProbeWireTest, NothingTravelsInClearAndNoTwoDatagramsAreAlike) {
  const auto a = encodeProbe(sample(), key());
  const auto b = encodeProbe(sample(), key());
  EXPECT_NE(a, b) << "the same probe sealed twice gave the same bytes: the nonce is not fresh";
  // The session id, the ranks and the sequence number appear nowhere in the datagram.
  auto contains = [](const std::array<std::uint8_t, kProbeBytes>& d, const std::vector<std::uint8_t>& needle) {
    return std::search(d.begin(), d.end(), needle.begin(), needle.end()) != d.end();
  };
  const std::vector<std::uint8_t> session = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};
  const std::vector<std::uint8_t> ranks = {5, 0, 0, 0, 17, 0, 0, 0};
  EXPECT_FALSE(contains(a, session));
  EXPECT_FALSE(contains(a, ranks));
}

TEST(ProbeWireTest, RefusesWrongSecretTamperingAndMalformedDatagrams) {
  auto bytes = encodeProbe(sample(), key());
  auto expectRefused = [&](std::span<const std::uint8_t> b, const std::string& needle, const std::string& k = kSecret) {
    auto r = decodeProbe(b, key(k));
    ASSERT_FALSE(r.isOk());
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expectRefused(bytes, "tag", "another-secret");
  // The nonce, every field of the sealed part, and the tag.
  for (std::size_t i : {8u, 19u, 20u, 22u, 30u, 40u, 48u, 59u, 60u, 75u}) {
    auto t = bytes;
    t[i] ^= 1;
    expectRefused(t, "tag");
  }
  auto t = bytes;
  t[0] = 'X';
  expectRefused(t, "magic");
  t = bytes;
  t[4] = 1;  // the unsealed probes of earlier builds
  expectRefused(t, "version");
  expectRefused(std::span<const std::uint8_t>(bytes.data(), kProbeBytes - 1), "75 bytes");
  std::vector<std::uint8_t> longer(bytes.begin(), bytes.end());
  longer.push_back(0);
  expectRefused(longer, "77 bytes");
  expectRefused(std::span<const std::uint8_t>(), "0 bytes");
}

TEST(ProbeWireTest, RandomBytesNeverDecode) {
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::uint8_t> b(rng() % 2 ? kProbeBytes : rng() % 100);
    for (auto& x : b) x = static_cast<std::uint8_t>(rng());
    if (b.size() >= 5) {  // give the header a chance so the tag is what stops it
      b[0] = 'M';
      b[1] = 'R';
      b[2] = 'P';
      b[3] = 'B';
      b[4] = kProbeVersion;
    }
    EXPECT_FALSE(decodeProbe(b, key()).isOk());
  }
}

}  // namespace
}  // namespace meridian::routing
