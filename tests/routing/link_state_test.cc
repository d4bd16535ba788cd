// The link-state table: rows on the wire (round trip, every malformed field rejected) and
// the planner's view, including the documented order of stand-ins for missing rates.
#include "routing/link_state.h"

#include <string>

#include <gtest/gtest.h>

namespace meridian::routing {
namespace {

std::span<const std::uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

LinkFigures link(int peer, int path, double srttUs, std::optional<double> rate) {
  LinkFigures f;
  f.peer = peer;
  f.path = path;
  f.minRttUs = srttUs * 0.9;
  f.srttUs = srttUs;
  f.jitterUs = 5;
  f.loss = 0.01;
  f.rateBytesPerSec = rate;
  return f;
}

TEST(LinkRowTest, RoundTripsWithMissingValuesKeptMissing) {
  LinkRow row;
  row.rank = 2;
  row.atUs = 123456789;
  row.links = {link(0, 0, 80000, 5e7), link(0, 1, 90000, std::nullopt), link(1, 0, 150, 1e9)};
  row.links[1].congested = true;
  row.links[2].srttUs.reset();
  row.links[2].kind = transport::PathKind::kSharedMemory;
  row.links[1].kind = transport::PathKind::kFabric;
  const auto bytes = encodeLinkRow(row);
  auto back = decodeLinkRow(bytes, 3);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value().rank, 2);
  EXPECT_EQ(back.value().atUs, 123456789);
  ASSERT_EQ(back.value().links.size(), 3u);
  EXPECT_EQ(back.value().links[0].rateBytesPerSec, 5e7);
  EXPECT_FALSE(back.value().links[1].rateBytesPerSec.has_value());
  EXPECT_TRUE(back.value().links[1].congested);
  EXPECT_FALSE(back.value().links[2].srttUs.has_value());
  EXPECT_EQ(back.value().links[2].minRttUs, 135);
  EXPECT_EQ(back.value().links[0].kind, transport::PathKind::kTcp);
  EXPECT_EQ(back.value().links[1].kind, transport::PathKind::kFabric);
  EXPECT_EQ(back.value().links[2].kind, transport::PathKind::kSharedMemory);
}

TEST(LinkRowTest, RejectsMalformedRows) {
  const char* bad[] = {
      "",
      "[1,2]",
      R"({"r":0,"t":0})",
      R"({"r":3,"t":0,"l":[]})",                                     // rank out of range
      R"({"r":0,"t":0,"l":[[0,0,null,null,null,null,null,false,0]]})",  // itself as a peer
      R"({"r":0,"t":0,"l":[[1,64,null,null,null,null,null,false]]})", // path out of range
      R"({"r":0,"t":0,"l":[[1,0,-1,null,null,null,null,false]]})",    // negative RTT
      R"({"r":0,"t":0,"l":[[1,0,null,null,null,1.5,null,false]]})",   // loss above 1
      R"({"r":0,"t":0,"l":[[1,0,null,null,null,null,"fast",false]]})",
      R"({"r":0,"t":0,"l":[[1,0,null,null,null,null,null]]})",        // 7 fields
      R"({"r":0,"t":0,"l":[[1,0,null,null,null,null,null,0]]})",      // congested not a bool
      R"({"r":0.5,"t":0,"l":[]})",
  };
  for (const char* text : bad) EXPECT_FALSE(decodeLinkRow(bytesOf(text), 3).isOk()) << text;
  // The same rows, each field fixed, decode: the refusals above are about that field.
  for (const char* text : {R"({"r":0,"t":0,"l":[[1,0,null,null,null,null,null,false,0]]})",
                           R"({"r":0,"t":0,"l":[[1,63,10,12,1,0.5,1e9,true,2]]})"}) {
    EXPECT_TRUE(decodeLinkRow(bytesOf(text), 3).isOk()) << text;
  }
  // More links than (n-1) * kMaxPathsPerPeer, and an oversized message.
  std::string many = R"({"r":0,"t":0,"l":[)";
  for (int i = 0; i <= kMaxPathsPerPeer; ++i) many += std::string(i ? "," : "") + "[1,0,null,null,null,null,null,false,0]";
  many += "]}";
  EXPECT_FALSE(decodeLinkRow(bytesOf(many), 2).isOk());
  EXPECT_FALSE(decodeLinkRow(std::vector<std::uint8_t>(kMaxLinkRowBytes + 1, ' '), 3).isOk());
  // Deep nesting is an error, not a stack overflow.
  EXPECT_FALSE(decodeLinkRow(bytesOf(std::string(500000, '[')), 3).isOk());
}

TEST(LinkStateTableTest, KeepsTheNewestRowPerRank) {
  LinkStateTable t(2);
  LinkRow a{0, 100, {link(1, 0, 100, 1e9)}};
  ASSERT_TRUE(t.update(a).isOk());
  LinkRow older{0, 50, {link(1, 0, 999, 1e9)}};
  ASSERT_TRUE(t.update(older).isOk());
  EXPECT_EQ(t.row(0)->atUs, 100);
  EXPECT_FALSE(t.update(LinkRow{2, 0, {}}).isOk());
}

// Three regions (0, 1 in A; 2, 3 in B; 4 alone in C); RTTs 0.2 ms in A/B, 40 ms A-B, 100 ms
// to C. Only some pairs have carried data.
LinkStateTable sampleTable() {
  LinkStateTable t(5);
  auto rtt = [](int a, int b) {
    const int ra = a < 2 ? 0 : a < 4 ? 1 : 2, rb = b < 2 ? 0 : b < 4 ? 1 : 2;
    return ra == rb ? 200.0 : (ra == 2 || rb == 2) ? 100000.0 : 40000.0;
  };
  for (int r = 0; r < 5; ++r) {
    LinkRow row{r, 1, {}};
    for (int p = 0; p < 5; ++p) {
      if (p == r) continue;
      std::optional<double> rate;
      if (r == 0 && p == 2) rate = 2e7;  // measured A -> B
      if (r == 1 && p == 0) rate = 1e9;  // measured inside A
      if (r == 3 && p == 1) rate = 3e7;  // measured B -> A
      row.links.push_back(link(p, 0, rtt(r, p), rate));
      // A second path to 2 from 0, also measured: rates add up.
      if (r == 0 && p == 2) row.links.push_back(link(p, 1, rtt(r, p) * 1.1, 1e7));
    }
    EXPECT_TRUE(t.update(row).isOk());
  }
  return t;
}

TEST(LinkStateTableTest, ViewFillsMissingRatesInTheDocumentedOrder) {
  const LinkStateTable t = sampleTable();
  ASSERT_TRUE(t.complete());
  const NetworkView v = t.view({0, 0, 1, 1, 2}, 3);
  ASSERT_TRUE(validate(v).isOk());
  // Measured: both paths of 0 -> 2 add up; latency is half the smaller RTT.
  EXPECT_DOUBLE_EQ(v.link(0, 2).bytesPerSec, 3e7);
  EXPECT_DOUBLE_EQ(v.link(0, 2).latencySec, 0.020);
  // 2 -> 0 unmeasured: the reverse direction stands in.
  EXPECT_DOUBLE_EQ(v.link(2, 0).bytesPerSec, 3e7);
  // 1 -> 3 unmeasured both ways: the median of the A-B measurements (2e7+1e7 = 3e7, 3e7).
  EXPECT_DOUBLE_EQ(v.link(1, 3).bytesPerSec, 3e7);
  // 2 -> 3 (inside B) never measured, nothing between B and B: pairs of similar RTT (inside A).
  EXPECT_DOUBLE_EQ(v.link(2, 3).bytesPerSec, 1e9);
  // To C nothing measured, nothing near 100 ms: the window prior, 4 MiB / 0.1 s.
  EXPECT_DOUBLE_EQ(v.link(0, 4).bytesPerSec, kPriorWindowBytes / 0.1);
  EXPECT_DOUBLE_EQ(v.link(0, 4).latencySec, 0.050);
}

// Two hosts of one region: ranks 0 and 1 share host X, 2 on host Y. Between 0 and 1 the
// TCP paths carried data before the shared-memory path paired; then the shared-memory link.
TEST(LinkStateTableTest, ASharedMemoryLinkIsItsOwnKindAndNeverStandsInForPairsBetweenHosts) {
  LinkStateTable t(3);
  auto shm = [](int peer, int path, double rate) {
    LinkFigures f;
    f.peer = peer;
    f.path = path;
    f.kind = transport::PathKind::kSharedMemory;
    f.rateBytesPerSec = rate;
    return f;
  };
  // 0 -> 1: a stale TCP rate (1e9) and the shared-memory link's measured 6e9.
  ASSERT_TRUE(t.update(LinkRow{0, 1, {link(1, 0, 60, 1e9), shm(1, 2, 6e9), link(2, 0, 300, std::nullopt)}}).isOk());
  // 1 -> 0: the shared-memory link only; 1 -> 2 measured between the hosts.
  ASSERT_TRUE(t.update(LinkRow{1, 1, {link(0, 0, 60, std::nullopt), shm(0, 2, 5e9), link(2, 0, 300, 2e8)}}).isOk());
  ASSERT_TRUE(t.update(LinkRow{2, 1, {link(0, 0, 300, std::nullopt), link(1, 0, 300, std::nullopt)}}).isOk());
  ASSERT_TRUE(t.complete());
  const NetworkView v = t.view({0, 0, 0}, 1);
  // The shared-memory link's rate, not its sum with the TCP path standing by.
  EXPECT_DOUBLE_EQ(v.link(0, 1).bytesPerSec, 6e9);
  EXPECT_DOUBLE_EQ(v.link(1, 0).bytesPerSec, 5e9);
  // 0 -> 2 and 2 -> 0 unmeasured, same region: the median of measured links between hosts
  // (1 -> 2 at 2e8), where counting shared-memory rates would have given 5e9 or 6e9.
  EXPECT_DOUBLE_EQ(v.link(0, 2).bytesPerSec, 2e8);
  EXPECT_DOUBLE_EQ(v.link(2, 0).bytesPerSec, 2e8);
  EXPECT_DOUBLE_EQ(v.link(2, 1).bytesPerSec, 2e8);  // the reverse direction stands in
}

// Rank 0 re-plans early when this count rises (collectives/routing_control.h).
TEST(LinkStateTableTest, CountsMeasuredRatesAndAnUnmeasuredPathAddsNone) {
  LinkStateTable t = sampleTable();
  EXPECT_EQ(t.measuredRates(), 4u) << "0->2 on two paths, 1->0, 3->1";
  LinkRow row = *t.row(4);
  row.atUs = 2;
  row.links.push_back(link(0, 1, 100000.0, std::nullopt));
  ASSERT_TRUE(t.update(row).isOk());
  EXPECT_EQ(t.measuredRates(), 4u);
  row.atUs = 3;
  row.links.back().rateBytesPerSec = 1e6;
  ASSERT_TRUE(t.update(row).isOk());
  EXPECT_EQ(t.measuredRates(), 5u);
}

TEST(LinkStateTableTest, IncompleteUntilEveryPairHasAnRttAndUnknownPairsAreUnusable) {
  LinkStateTable t(3);
  EXPECT_FALSE(t.complete());
  ASSERT_TRUE(t.update(LinkRow{0, 1, {link(1, 0, 100, std::nullopt), link(2, 0, 100, std::nullopt)}}).isOk());
  EXPECT_FALSE(t.complete());  // 1 <-> 2 unknown
  const NetworkView partial = t.view({0, 0, 0}, 1);
  EXPECT_EQ(partial.link(1, 2).bytesPerSec, 0.0);
  EXPECT_GT(partial.link(1, 0).bytesPerSec, 0.0) << "0's RTT to 1 serves 1 -> 0 too";
  ASSERT_TRUE(t.update(LinkRow{2, 1, {link(1, 0, 100, std::nullopt)}}).isOk());
  EXPECT_TRUE(t.complete());
  const std::vector<double> m = t.rttMatrixUs();
  EXPECT_EQ(m[1 * 3 + 2], 100);
  EXPECT_EQ(m[0], -1);
}

}  // namespace
}  // namespace meridian::routing
