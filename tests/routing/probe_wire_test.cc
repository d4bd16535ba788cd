// Probe datagram codec: round trip, and every kind of bad datagram refused with a reason.
#include <gtest/gtest.h>

#include <random>

#include "routing/probe_wire.h"

namespace meridian::routing {
namespace {

const std::string kSecret = "job-secret";
std::span<const std::uint8_t> secret(const std::string& s = kSecret) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
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
  auto bytes = encodeProbe(sample(), secret());
  auto back = decodeProbe(bytes, secret());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value(), sample());
}

TEST(ProbeWireTest, RefusesWrongSecretTamperingAndMalformedDatagrams) {
  auto bytes = encodeProbe(sample(), secret());
  auto expectRefused = [&](std::span<const std::uint8_t> b, const std::string& needle, const std::string& key = kSecret) {
    auto r = decodeProbe(b, secret(key));
    ASSERT_FALSE(r.isOk());
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expectRefused(bytes, "bad MAC", "another-secret");
  for (std::size_t i : {6u, 16u, 24u, 32u, 40u, 50u}) {
    auto t = bytes;
    t[i] ^= 1;
    expectRefused(t, "bad MAC");
  }
  auto t = bytes;
  t[0] = 'X';
  expectRefused(t, "magic");
  t = bytes;
  t[4] = 2;
  expectRefused(t, "version");
  t = bytes;
  t[5] = 9;
  expectRefused(t, "type");
  expectRefused(std::span<const std::uint8_t>(bytes.data(), 63), "63 bytes");
  std::vector<std::uint8_t> longer(bytes.begin(), bytes.end());
  longer.push_back(0);
  expectRefused(longer, "65 bytes");
  expectRefused(std::span<const std::uint8_t>(), "0 bytes");
}

TEST(ProbeWireTest, RandomBytesNeverDecode) {
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::uint8_t> b(rng() % 80);
    for (auto& x : b) x = static_cast<std::uint8_t>(rng());
    if (b.size() >= 6) {  // give the header a chance so the MAC check is what stops it
      b[0] = 'M';
      b[1] = 'R';
      b[2] = 'P';
      b[3] = 'B';
      b[4] = kProbeVersion;
      b[5] = 1;
    }
    EXPECT_FALSE(decodeProbe(b, secret()).isOk());
  }
}

}  // namespace
}  // namespace meridian::routing
