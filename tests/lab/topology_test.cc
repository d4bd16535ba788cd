// The topology parser (merge order, every error with its line), the unit parsers and printers, and
// the shipped topology files.
#include "lab/topology.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <ostream>
#include <sstream>
#include <string>

#include "lab/lab.h"
#include "lab/scenario.h"

namespace meridian::lab {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string shipped(const std::string& name) { return std::string(MERIDIAN_SOURCE_DIR) + "/lab/topologies/" + name; }

Topology mustParse(const std::string& yaml) {
  auto r = parseTopology(yaml, "t.yaml");
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? r.value() : Topology{};
}

std::string errorOf(const std::string& yaml) {
  auto r = parseTopology(yaml, "t.yaml");
  EXPECT_FALSE(r.isOk()) << "parsed although it should not:\n" << yaml;
  if (r.isOk()) return {};
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

// A small valid topology; the error cases below each change one line of it.
const char* const kBase =
    "name: t\n"                          // 1
    "regions:\n"                         // 2
    "  - name: a\n"                      // 3
    "    nodes: 1\n"                     // 4
    "  - name: b\n"                      // 5
    "    nodes: 2\n"                     // 6
    "planes:\n"                          // 7
    "  - name: wan-a\n"                  // 8
    "    default: {rate: 100Mbit}\n"     // 9
    "    intra: {delay: 100us}\n"        // 10
    "    links:\n"                       // 11
    "      - between: [a, b]\n"          // 12
    "        delay: 10ms\n";             // 13

// kBase with line `line` (1-based) replaced by `text`, which may span several lines.
std::string withLine(int line, const std::string& text) {
  std::istringstream in(kBase);
  std::string out, current;
  for (int n = 1; std::getline(in, current); ++n) out += (n == line ? text : current) + "\n";
  return out;
}

TEST(TopologyTest, BaseIsValid) {
  Topology t = mustParse(kBase);
  ASSERT_EQ(t.planes.size(), 1u);
  EXPECT_EQ(t.link(0, 0, 1).delayUs, 10000);
  EXPECT_EQ(t.link(0, 1, 1).delayUs, 100);
}

// ---- The shipped files ----

TEST(TopologyTest, TwoRegionsFileHasTheDocumentedValues) {
  auto r = loadTopology(shipped("two-regions.yaml"));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Topology& t = r.value();
  EXPECT_EQ(t.name, "two-regions");
  EXPECT_EQ(t.source, shipped("two-regions.yaml"));
  EXPECT_EQ(t.timeScale, 1.0);
  EXPECT_EQ(t.mtu, 9000);
  ASSERT_EQ(t.regions.size(), 2u);
  EXPECT_EQ(t.regions[0].name, "east");
  EXPECT_EQ(t.regions[1].name, "west");
  ASSERT_EQ(t.nodes.size(), 4u);
  const char* names[] = {"east-1", "east-2", "west-1", "west-2"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.nodes[i].name, names[i]);
    EXPECT_EQ(t.nodes[i].index, i);
    EXPECT_EQ(t.nodes[i].region, i / 2);
    EXPECT_EQ(t.nodes[i].indexInRegion, i % 2);
  }
  ASSERT_EQ(t.planes.size(), 2u);
  EXPECT_EQ(t.planes[0].name, "wan-a");
  EXPECT_EQ(t.planes[1].name, "wan-b");
  const double interDelay[] = {20000, 30000};
  for (int p = 0; p < 2; ++p) {
    ASSERT_EQ(t.planes[p].links.size(), 4u);
    for (int s = 0; s < 2; ++s) {
      for (int d = 0; d < 2; ++d) {
        const LinkParams& l = t.link(p, s, d);
        const bool intra = s == d;
        EXPECT_EQ(l.delayUs, intra ? 500 : interDelay[p]) << p << s << d;
        EXPECT_EQ(l.rateBitsPerSec, intra ? 400e6 : 100e6) << p << s << d;
        EXPECT_EQ(l.queueBytes, intra ? 2500000u : 625000u) << p << s << d;  // the 50 ms default
        EXPECT_EQ(l.jitterUs, 0);
        EXPECT_EQ(l.loss, 0);
        EXPECT_FALSE(l.cut);
      }
    }
  }
}

TEST(TopologyTest, ThreeRegionsFileIsRealistic) {
  auto r = loadTopology(shipped("three-regions.yaml"));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  const Topology& t = r.value();
  EXPECT_EQ(t.name, "three-regions");
  EXPECT_EQ(t.timeScale, 1.0);
  ASSERT_EQ(t.regions.size(), 3u);
  EXPECT_EQ(t.regions[0].name, "london");
  EXPECT_EQ(t.regions[1].name, "virginia");
  EXPECT_EQ(t.regions[2].name, "singapore");
  for (const Region& region : t.regions) EXPECT_EQ(region.nodes, 2);
  ASSERT_EQ(t.nodes.size(), 6u);
  EXPECT_EQ(t.nodes[5].name, "singapore-2");
  ASSERT_EQ(t.planes.size(), 2u);
  EXPECT_EQ(t.planes[0].name, "wan-a");
  EXPECT_EQ(t.planes[1].name, "wan-b");

  const int lon = 0, vir = 1, sgp = 2;
  // Published round trips: London-Virginia ~75 ms, London-Singapore ~170 ms, Virginia-Singapore ~220 ms.
  auto rttMs = [&](int plane, int a, int b) {
    return (t.link(plane, a, b).delayUs + t.link(plane, b, a).delayUs) / 1000;
  };
  EXPECT_NEAR(rttMs(0, lon, vir), 76, 4);
  EXPECT_NEAR(rttMs(0, lon, sgp), 170, 8);
  EXPECT_NEAR(rttMs(0, vir, sgp), 220, 10);
  for (int p = 0; p < 2; ++p) {
    for (int s = 0; s < 3; ++s) {
      for (int d = 0; d < 3; ++d) {
        const LinkParams& l = t.link(p, s, d);
        EXPECT_EQ(l, t.link(p, d, s)) << "asymmetric " << p << s << d;
        EXPECT_EQ(l.loss, 0);
        if (s == d) {
          EXPECT_GE(l.delayUs, 100);
          EXPECT_LE(l.delayUs, 250);
          EXPECT_EQ(l.rateBitsPerSec, 1e9);
        } else {
          EXPECT_GE(l.rateBitsPerSec, 200e6);
          EXPECT_LE(l.rateBitsPerSec, 400e6);
          EXPECT_GT(l.jitterUs, 0);
          EXPECT_LE(l.jitterUs, 2000);
          // The second carrier is the slower, longer one on every route.
          if (p == 1) {
            EXPECT_GT(l.delayUs, t.link(0, s, d).delayUs);
            EXPECT_LT(l.rateBitsPerSec, t.link(0, s, d).rateBitsPerSec);
          }
        }
        // Queues are about 50 ms at the rate.
        EXPECT_NEAR(static_cast<double>(l.queueBytes), l.rateBitsPerSec / 8 * 0.05, 0.01 * l.rateBitsPerSec / 8);
      }
    }
  }
}

// ---- Merging ----

TEST(TopologyTest, MergesDefaultThenIntraThenLinksInOrder) {
  Topology t = mustParse(
      "name: merge\n"
      "regions:\n"
      "  - {name: a, nodes: 1}\n"
      "  - {name: b, nodes: 1}\n"
      "  - {name: c, nodes: 1}\n"
      "planes:\n"
      "  - name: p\n"
      "    default: {delay: 10ms, jitter: 1ms, rate: 100Mbit, queue: 1MiB, loss: 0.1%}\n"
      "    intra: {delay: 200us, rate: 1Gbit}\n"
      "    links:\n"
      "      - between: [a, b]\n"
      "        delay: 30ms\n"
      "      - from: a\n"
      "        to: b\n"
      "        rate: 50Mbit\n"
      "        loss: 0\n"
      "      - between: [a, a]\n"
      "        jitter: 0ms\n"
      "      - from: c\n"
      "        to: a\n"
      "        delay: 70ms\n"
      "      - between: [c, a]\n"
      "        delay: 60ms\n");
  const int a = 0, b = 1, c = 2;
  // Intra on top of default (the queue stays the default's), then the [a, a] entry on top of intra.
  EXPECT_EQ(t.link(0, a, a), (LinkParams{200, 0, 1e9, 1048576, 0.001, false}));
  EXPECT_EQ(t.link(0, b, b), (LinkParams{200, 1000, 1e9, 1048576, 0.001, false}));
  // between: both ways; from/to: one way only.
  EXPECT_EQ(t.link(0, a, b), (LinkParams{30000, 1000, 50e6, 1048576, 0, false}));
  EXPECT_EQ(t.link(0, b, a), (LinkParams{30000, 1000, 100e6, 1048576, 0.001, false}));
  // A later entry overrides an earlier one.
  EXPECT_EQ(t.link(0, c, a).delayUs, 60000);
  EXPECT_EQ(t.link(0, a, c).delayUs, 60000);
  // Untouched pairs keep the default.
  EXPECT_EQ(t.link(0, b, c), (LinkParams{10000, 1000, 100e6, 1048576, 0.001, false}));
  EXPECT_EQ(t.link(0, c, b).delayUs, 10000);
}

TEST(TopologyTest, QueueDefaultsToFiftyMillisecondsOfTheMergedRate) {
  Topology t = mustParse(
      "name: q\n"
      "regions: [{name: a, nodes: 1}, {name: b, nodes: 1}]\n"
      "planes:\n"
      "  - name: p\n"
      "    default: {delay: 1ms}\n"
      "    links:\n"
      "      - from: a\n"
      "        to: b\n"
      "        rate: 20Mbit\n"
      "      - from: b\n"
      "        to: a\n"
      "        rate: 20Mbit\n"
      "        queue: 0\n");
  EXPECT_EQ(t.link(0, 0, 1).queueBytes, 125000u);  // 20 Mbit/s * 50 ms / 8
  EXPECT_EQ(t.link(0, 1, 0).queueBytes, 125000u);  // 0 = the default
  EXPECT_EQ(t.link(0, 0, 0).rateBitsPerSec, 0);    // unlimited
  EXPECT_EQ(t.link(0, 0, 0).queueBytes, 65536u);
}

TEST(TopologyTest, OptionalTopLevelValues) {
  Topology t = mustParse(kBase);
  EXPECT_EQ(t.timeScale, 1.0);
  EXPECT_EQ(t.mtu, 9000);
  t = mustParse(withLine(1, "name: t\ntime_scale: 0.25\nmtu: 1500"));
  EXPECT_EQ(t.timeScale, 0.25);
  EXPECT_EQ(t.mtu, 1500);
  // Keys in any order: planes before regions and mtu still work.
  t = mustParse(
      "planes:\n"
      "  - {name: p, default: {delay: 2ms}}\n"
      "mtu: 1280\n"
      "regions: [{name: x, nodes: 3}]\n"
      "name: order\n");
  EXPECT_EQ(t.mtu, 1280);
  EXPECT_EQ(t.nodes.size(), 3u);
  EXPECT_EQ(t.link(0, 0, 0).delayUs, 2000);
}

// ---- Errors: every one names the file, the line and the reason ----

TEST(TopologyTest, ErrorMessagesAreExact) {
  EXPECT_EQ(errorOf(withLine(9, "    default: {rate: 100Mbit, dealy: 5ms}")),
            "t.yaml:9: plane wan-a: unknown key 'dealy' (expected delay, jitter, rate, queue, loss)");
  EXPECT_EQ(errorOf(withLine(12, "      - from: a\n        to: b")),
            "t.yaml:8: plane wan-a: no delay for b -> a (add a links entry)");
  EXPECT_EQ(errorOf(withLine(13, "        delay: 38")),
            "t.yaml:13: plane wan-a: delay needs a unit, e.g. 38ms (got '38'; units: ns, us, ms, s)");
  EXPECT_EQ(errorOf(withLine(5, "  - name: a")), "t.yaml:5: duplicate region 'a' (first on line 3)");
  EXPECT_EQ(errorOf(withLine(12, "      - between: [a, paris]")),
            "t.yaml:12: plane wan-a: unknown region 'paris' (regions: a, b)");
}

struct ErrorCase {
  int line;              // of kBase to replace
  const char* text;      // what to put there
  int errorLine;         // expected in the message
  const char* expected;  // substring of the message
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << "line " << c.line << " = \"" << c.text << "\""; }

class TopologyErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(TopologyErrorTest, NamesFileLineAndReason) {
  const ErrorCase& c = GetParam();
  const std::string message = errorOf(withLine(c.line, c.text));
  EXPECT_THAT(message, StartsWith(fmt::format("t.yaml:{}: ", c.errorLine)));
  EXPECT_THAT(message, HasSubstr(c.expected));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TopologyErrorTest,
    ::testing::Values(
        // Unknown keys, at every level.
        ErrorCase{1, "name: t\ncolour: blue", 2, "unknown key 'colour' (expected name, time_scale, mtu, regions"},
        ErrorCase{4, "    nodes: 1\n    zone: x", 5, "unknown key 'zone' (expected name, nodes)"},
        ErrorCase{8, "  - name: wan-a\n    speed: 1", 9,
                  "unknown key 'speed' (expected name, carries, default, intra, links)"},
        ErrorCase{13, "        dealy: 10ms", 13, "unknown key 'dealy' (expected between, from, to, delay, jitter"},
        ErrorCase{13, "        delay: 10ms\n        delay: 20ms", 14, "duplicate key 'delay' (first on line 13)"},
        // Missing values.
        ErrorCase{1, "# no name", 2, "missing key 'name'"},
        ErrorCase{10, "    intra: {rate: 1Gbit}", 8, "plane wan-a: no delay for a -> a (add a links entry)"},
        ErrorCase{4, "    nodes:", 4, "'nodes' has no value"},
        // Values and units.
        ErrorCase{13, "        delay: 38 parsecs", 13, "delay '38 parsecs' has an unknown unit 'parsecs'"},
        ErrorCase{13, "        delay: -5ms", 13, "delay '-5ms' is negative"},
        ErrorCase{9, "    default: {rate: -1Mbit}", 9, "rate '-1Mbit' is negative"},
        ErrorCase{13, "        delay: nanms", 13, "delay 'nanms' is not a finite number"},
        ErrorCase{13, "        delay: 11s", 13, "delay '11s' is above the limit of 10s"},
        ErrorCase{13, "        delay: 10ms\n        jitter: 20s", 14, "jitter '20s' is above the limit of 10s"},
        ErrorCase{9, "    default: {rate: 2Tbit}", 9, "rate '2Tbit' is above the limit of 1Tbit"},
        ErrorCase{9, "    default: {rate: 100MB}", 9, "rate '100MB' is in bytes"},
        ErrorCase{9, "    default: {rate: 100}", 9, "rate needs a unit, e.g. 400Mbit"},
        ErrorCase{9, "    default: {queue: 2GiB}", 9, "queue '2GiB' is above the limit of 1GiB"},
        ErrorCase{9, "    default: {queue: 1.5B}", 9, "queue '1.5B' is not a whole number of bytes"},
        ErrorCase{9, "    default: {rate: 1Mbit, queue: 1500B}", 8, "a -> a (1500B) cannot hold one packet of the mtu"},
        ErrorCase{9, "    default: {loss: 150%}", 9, "loss '150%' is above 100%"},
        ErrorCase{9, "    default: {loss: 2}", 9, "loss '2' is above 1"},
        ErrorCase{13, "        delay: [10ms]", 13, "'delay' must be a single value, not a list"},
        ErrorCase{1, "name: t\ntime_scale: 0", 2, "time_scale must be a number above 0 and at most 10, got '0'"},
        ErrorCase{1, "name: t\ntime_scale: 11", 2, "time_scale must be a number above 0"},
        ErrorCase{1, "name: t\nmtu: 100", 2, "mtu 100 is outside 1280..65000"},
        ErrorCase{4, "    nodes: 0", 4, "region a has 0 nodes, it needs at least 1"},
        ErrorCase{4, "    nodes: two", 4, "'nodes' must be a whole number, got 'two'"},
        ErrorCase{6, "    nodes: 250", 6, "more than 250 nodes in all"},
        // Names.
        ErrorCase{1, "name: My Lab", 1, "topology name 'My Lab' must be 1 to 24 characters"},
        ErrorCase{3, "  - name: new-york", 3, "region name 'new-york' must be 1 to 10 characters of a-z and 0-9"},
        ErrorCase{3, "  - name: montevideo1", 3, "region name 'montevideo1'"},
        ErrorCase{8, "  - name: wan-very-long", 8,
                  "plane name 'wan-very-long' is 13 characters, at most 12 (it is also the interface name"},
        ErrorCase{8, "  - name: Wan", 8, "plane name 'Wan' must be a-z, 0-9 and '-', starting with a letter"},
        ErrorCase{13, "        delay: 10ms\n  - name: wan-a\n    default: {delay: 1ms}", 14,
                  "duplicate plane 'wan-a' (first on line 8)"},
        // Links entries.
        ErrorCase{12, "      - between: [a, b]\n        from: a", 13,
                  "a links entry has either 'between' (both directions) or 'from' and 'to' (one direction), not both"},
        ErrorCase{12, "      - from: a", 12, "a links entry with 'from' needs 'to' too"},
        ErrorCase{12, "      - to: b", 12, "a links entry with 'to' needs 'from' too"},
        ErrorCase{12, "      - jitter: 1ms", 12, "a links entry needs 'between: [a, b]' (both directions) or 'from'"},
        ErrorCase{12, "      - between: [a]", 12, "'between' must be a list of two regions"},
        ErrorCase{12, "      - from: paris\n        to: a", 12, "unknown region 'paris' (regions: a, b)"},
        ErrorCase{13, "        # nothing", 12, "a links entry that sets nothing (expected delay, jitter, rate"},
        ErrorCase{10, "    intra: 5", 10, "plane wan-a: 'intra' must be a map of 'key: value' entries"},
        // What a plane carries.
        ErrorCase{8, "  - name: wan-a\n    carries: rdma", 9,
                  "plane wan-a: carries 'rdma': expected tcp (Meridian's TCP path, the default) or fabric"},
        ErrorCase{8, "  - name: wan-a\n    carries: fabric", 8,
                  "the only plane carries fabric; at least one plane must carry tcp"},
        // YAML syntax, reported at the line yaml-cpp names.
        ErrorCase{6, "    nodes: 2: 3", 6, "invalid YAML: "},
        ErrorCase{12, "      - between: [a, b", 13, "invalid YAML: "}));

TEST(TopologyTest, StructuralErrors) {
  EXPECT_EQ(errorOf(""), "t.yaml:1: the file is empty (expected name, regions and planes)");
  EXPECT_THAT(errorOf("[1, 2]"), StartsWith("t.yaml:1: the topology must be a map"));
  EXPECT_EQ(errorOf(std::string(kBase) + "---\nname: u\n"),
            "t.yaml:15: a second YAML document ('---'); one topology per file");
  EXPECT_THAT(errorOf("name: t\nregions: []\nplanes: []\n"),
              StartsWith("t.yaml:2: 'regions' must be a non-empty list"));
  EXPECT_THAT(errorOf("name: t\nregions: [{name: a, nodes: 1}]\nplanes:\n"),
              StartsWith("t.yaml:3: 'planes' must be a non-empty list"));
  EXPECT_THAT(errorOf("name: t\nregions: [{name: a, nodes: 1}]\n"), HasSubstr("missing key 'planes'"));
  EXPECT_THAT(errorOf("name: t\nregions:\n  - a\nplanes: []\n"), StartsWith("t.yaml:3: a region must be a map"));
  EXPECT_THAT(errorOf("name: t\nregions: [{name: a, nodes: 1}]\nplanes:\n  - name: p\n    links: 5\n"),
              StartsWith("t.yaml:5: plane p: 'links' must be a list"));
  std::string many = "name: t\nregions: [{name: a, nodes: 1}]\nplanes:\n";
  for (int p = 0; p <= kMaxPlanes; ++p) many += fmt::format("  - {{name: p{}, default: {{delay: 1ms}}}}\n", p);
  EXPECT_THAT(errorOf(many), StartsWith("t.yaml:4: 17 planes, at most 16 allowed"));
}

// `carries: fabric` marks the one plane the fabric path crosses; the others stay TCP.
TEST(TopologyTest, OnePlaneMayCarryTheFabricPath) {
  const std::string two = std::string(kBase) +
                          "  - name: wan-b\n"
                          "    carries: fabric\n"
                          "    default: {delay: 1ms}\n";
  Topology t = mustParse(two);
  ASSERT_EQ(t.planes.size(), 2u);
  EXPECT_FALSE(t.planes[0].fabric);
  EXPECT_TRUE(t.planes[1].fabric);
  EXPECT_EQ(t.fabricPlane(), 1);
  EXPECT_EQ(mustParse(kBase).fabricPlane(), -1);
  EXPECT_EQ(mustParse(withLine(8, "  - name: wan-a\n    carries: tcp")).fabricPlane(), -1);
  EXPECT_EQ(errorOf(two + "  - name: wan-c\n    carries: fabric\n    default: {delay: 1ms}\n"),
            "t.yaml:18: plane wan-c: a second plane that carries fabric (wan-b already does); at most one");

  auto loaded = loadTopology(shipped("two-regions-fabric.yaml"));
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  const Topology& shippedFabric = *loaded;
  ASSERT_EQ(shippedFabric.planes.size(), 2u);
  EXPECT_EQ(shippedFabric.planes[static_cast<std::size_t>(shippedFabric.fabricPlane())].name, "wan-a");
  // The same links as two-regions.yaml: the lab tests compare the two.
  auto plain = loadTopology(shipped("two-regions.yaml"));
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  for (std::size_t p = 0; p < 2; ++p) EXPECT_EQ(shippedFabric.planes[p].links, plain->planes[p].links);
}

// What a node's processes are told: the TCP planes in MERIDIAN_PATHS, the fabric plane as the
// fabric's domain (its interface), the provider that crosses an IP network, and fabric required.
TEST(TopologyTest, TheFabricPlaneBecomesTheFabricDomainAndLeavesThePaths) {
  for (const char* k : {"MERIDIAN_PATHS", "MERIDIAN_FABRIC", "MERIDIAN_FABRIC_PROVIDER", "MERIDIAN_FABRIC_DOMAIN"}) {
    ::unsetenv(k);
  }
  auto loaded = loadTopology(shipped("two-regions-fabric.yaml"));
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  LabState lab;
  lab.name = "t";
  lab.topology = *loaded;
  auto list = nodeEnvironment(lab, 2);
  std::map<std::string, std::string> env(list.begin(), list.end());
  EXPECT_EQ(env["MERIDIAN_PATHS"], "198.18.1.3");
  EXPECT_EQ(env["MERIDIAN_PLANES"], "wan-b");
  EXPECT_EQ(env["MERIDIAN_LAB_ADDR_WAN_A"], "198.18.0.3");
  EXPECT_EQ(env["MERIDIAN_FABRIC"], "on");
  EXPECT_EQ(env["MERIDIAN_FABRIC_PROVIDER"], "tcp;ofi_rxm");
  EXPECT_EQ(env["MERIDIAN_FABRIC_DOMAIN"], "wan-a");
  // What the caller set wins.
  ::setenv("MERIDIAN_FABRIC", "auto", 1);
  list = nodeEnvironment(lab, 2);
  env = std::map<std::string, std::string>(list.begin(), list.end());
  EXPECT_EQ(env.count("MERIDIAN_FABRIC"), 0u);
  ::unsetenv("MERIDIAN_FABRIC");
  // Without a fabric plane, no fabric settings.
  auto plain = loadTopology(shipped("two-regions.yaml"));
  ASSERT_TRUE(plain.isOk());
  lab.topology = *plain;
  list = nodeEnvironment(lab, 2);
  env = std::map<std::string, std::string>(list.begin(), list.end());
  EXPECT_EQ(env["MERIDIAN_PATHS"], "198.18.0.3,198.18.1.3");
  EXPECT_EQ(env.count("MERIDIAN_FABRIC_DOMAIN"), 0u);
}

TEST(TopologyTest, LoadReportsUnreadableFiles) {
  auto missing = loadTopology("/nonexistent-dir/x.yaml");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(), "cannot read topology file /nonexistent-dir/x.yaml: No such file or directory");
  auto directory = loadTopology(shipped(""));
  ASSERT_FALSE(directory.isOk());
  EXPECT_THAT(directory.status().message(), HasSubstr("Is a directory"));
}

TEST(TopologyTest, LoadNamesThePathInParseErrors) {
  const std::string path = ::testing::TempDir() + "/topology_test_bad.yaml";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(withLine(13, "        delay: 38").c_str(), f);
  std::fclose(f);
  auto r = loadTopology(path);
  std::remove(path.c_str());
  ASSERT_FALSE(r.isOk());
  EXPECT_THAT(r.status().message(), StartsWith(path + ":13: plane wan-a: delay needs a unit"));
}

// ---- Nodes, addresses, lookups ----

TEST(TopologyTest, AddressesAreOneSlash24PerPlane) {
  Topology t = mustParse(kBase);
  EXPECT_EQ(t.address(0, 0), "198.18.0.1");
  EXPECT_EQ(t.address(0, 2), "198.18.0.3");
  EXPECT_EQ(t.address(1, 2), "198.18.1.3");
  EXPECT_EQ(t.address(15, 249), "198.18.15.250");
}

TEST(TopologyTest, FindByNameOrListTheKnownNames) {
  Topology t = mustParse(kBase);
  EXPECT_EQ(t.findRegion("b").value(), 1);
  EXPECT_EQ(t.findNode("b-2").value(), 2);
  EXPECT_EQ(t.findNode("a-1").value(), 0);
  EXPECT_EQ(t.findPlane("wan-a").value(), 0);
  EXPECT_EQ(t.findRegion("paris").status().message(), "unknown region 'paris' (regions: a, b)");
  EXPECT_EQ(t.findNode("paris-1").status().message(), "unknown node 'paris-1' (nodes: a-1, b-1, b-2)");
  EXPECT_EQ(t.findNode("b-3").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.findPlane("wan-b").status().message(), "unknown plane 'wan-b' (planes: wan-a)");
  // A long list is cut short.
  Topology big = mustParse(withLine(6, "    nodes: 40"));
  const std::string message = big.findNode("x").status().message();
  EXPECT_THAT(message, HasSubstr("a-1, b-1, b-2"));
  EXPECT_THAT(message, HasSubstr(", ... (41 in all)"));
  EXPECT_THAT(message, Not(HasSubstr("b-40")));
}

// ---- LinkChange ----

TEST(LinkChangeTest, EmptyUntilAnyFieldIsSet) {
  EXPECT_TRUE(LinkChange{}.empty());
  LinkChange c;
  c.delayUs = 0;
  EXPECT_FALSE(c.empty());
  c = {};
  c.jitterUs = 1;
  EXPECT_FALSE(c.empty());
  c = {};
  c.rateBitsPerSec = 1;
  EXPECT_FALSE(c.empty());
  c = {};
  c.loss = 0;
  EXPECT_FALSE(c.empty());
  c = {};
  c.queueBytes = 1;
  EXPECT_FALSE(c.empty());
  c = {};
  c.cut = false;
  EXPECT_FALSE(c.empty());
}

TEST(LinkChangeTest, AppliesOnlyTheGivenFields) {
  const LinkParams base{10000, 100, 1e8, 12345, 0.01, false};
  EXPECT_EQ(LinkChange{}.applyTo(base), base);
  LinkChange c;
  c.delayUs = 5000;
  c.cut = true;
  EXPECT_EQ(c.applyTo(base), (LinkParams{5000, 100, 1e8, 12345, 0.01, true}));
  c = {};
  c.jitterUs = 0;
  c.loss = 0.5;
  c.queueBytes = 9000;
  EXPECT_EQ(c.applyTo(base), (LinkParams{10000, 0, 1e8, 9000, 0.5, false}));
}

TEST(LinkChangeTest, QueueFollowsTheRateOnlyWhileItIsTheDefault) {
  LinkChange slower;
  slower.rateBitsPerSec = 20e6;
  // A default queue (0, or 50 ms at the old rate) becomes 50 ms at the new rate...
  EXPECT_EQ(slower.applyTo(LinkParams{1000, 0, 4e8, 0, 0, false}).queueBytes, 125000u);
  EXPECT_EQ(slower.applyTo(LinkParams{1000, 0, 4e8, defaultQueueBytes(4e8), 0, false}).queueBytes, 125000u);
  // ...an explicit queue stays.
  EXPECT_EQ(slower.applyTo(LinkParams{1000, 0, 4e8, 12345, 0, false}).queueBytes, 12345u);
  // queue 0 asks for the default again.
  LinkChange reset;
  reset.queueBytes = 0;
  EXPECT_EQ(reset.applyTo(LinkParams{1000, 0, 4e8, 12345, 0, false}).queueBytes, 2500000u);
}

TEST(LinkChangeTest, DefaultQueueIsFiftyMillisecondsWithAFloorAndACap) {
  EXPECT_EQ(defaultQueueBytes(400e6), 2500000u);
  EXPECT_EQ(defaultQueueBytes(1e9), 6250000u);
  EXPECT_EQ(defaultQueueBytes(20e6), 125000u);
  EXPECT_EQ(defaultQueueBytes(1e6), 65536u);  // 6250 bytes would not hold one jumbo frame
  EXPECT_EQ(defaultQueueBytes(0), 65536u);
  EXPECT_EQ(defaultQueueBytes(1e12), std::uint64_t{1} << 30);
  EXPECT_GT(defaultQueueBytes(0), static_cast<std::uint64_t>(kMaxMtu));
}

// ---- Units ----

TEST(UnitsTest, ParsesDurations) {
  EXPECT_EQ(parseDurationUs("38ms").value(), 38000);
  EXPECT_EQ(parseDurationUs("0.5ms").value(), 500);
  EXPECT_EQ(parseDurationUs("200us").value(), 200);
  EXPECT_EQ(parseDurationUs("7\u00b5s").value(), 7);
  EXPECT_EQ(parseDurationUs("1s").value(), 1e6);
  EXPECT_EQ(parseDurationUs("500ns").value(), 0.5);
  EXPECT_EQ(parseDurationUs(" 38 ms ").value(), 38000);
  EXPECT_EQ(parseDurationUs("0").value(), 0);
  EXPECT_EQ(parseDurationUs("1e3us").value(), 1000);
  EXPECT_THAT(parseDurationUs("38").status().message(), HasSubstr("duration needs a unit, e.g. 38ms"));
  EXPECT_THAT(parseDurationUs("-1ms").status().message(), HasSubstr("is negative"));
  EXPECT_THAT(parseDurationUs("-0ms").status().message(), HasSubstr("is negative"));
  EXPECT_THAT(parseDurationUs("ms").status().message(), HasSubstr("is not a number, expected e.g. 38ms"));
  EXPECT_THAT(parseDurationUs("").status().message(), HasSubstr("is not a number"));
  EXPECT_THAT(parseDurationUs("1h").status().message(), HasSubstr("unknown unit 'h' (expected ns, us, ms or s)"));
  EXPECT_THAT(parseDurationUs("infms").status().message(), HasSubstr("not a finite number"));
  EXPECT_THAT(parseDurationUs("1e999ms").status().message(), HasSubstr("out of range"));
  // No 10 s limit here: scenario times use the same parser.
  EXPECT_EQ(parseDurationUs("90s").value(), 90e6);
}

TEST(UnitsTest, ParsesRatesInBits) {
  EXPECT_EQ(parseRateBitsPerSec("400Mbit").value(), 400e6);
  EXPECT_EQ(parseRateBitsPerSec("1Gbit").value(), 1e9);
  EXPECT_EQ(parseRateBitsPerSec("500kbit").value(), 500e3);
  EXPECT_EQ(parseRateBitsPerSec("100bit").value(), 100);
  EXPECT_EQ(parseRateBitsPerSec("1Tbit").value(), 1e12);
  EXPECT_EQ(parseRateBitsPerSec("400Mbps").value(), 400e6);  // bits, unlike tc
  EXPECT_EQ(parseRateBitsPerSec("400M").value(), 400e6);
  EXPECT_EQ(parseRateBitsPerSec("2.5G").value(), 2.5e9);
  EXPECT_EQ(parseRateBitsPerSec("unlimited").value(), 0);
  EXPECT_EQ(parseRateBitsPerSec("0").value(), 0);
  EXPECT_THAT(parseRateBitsPerSec("400").status().message(), HasSubstr("rate needs a unit, e.g. 400Mbit"));
  EXPECT_THAT(parseRateBitsPerSec("50MB").status().message(), HasSubstr("is in bytes"));
  EXPECT_THAT(parseRateBitsPerSec("50MiB").status().message(), HasSubstr("is in bytes"));
  EXPECT_THAT(parseRateBitsPerSec("2Tbit").status().message(), HasSubstr("above the limit of 1Tbit"));
  EXPECT_THAT(parseRateBitsPerSec("5Mfoo").status().message(), HasSubstr("unknown unit 'Mfoo'"));
  EXPECT_THAT(parseRateBitsPerSec("-1Mbit").status().message(), HasSubstr("is negative"));
}

TEST(UnitsTest, ParsesBytes) {
  EXPECT_EQ(parseBytes("2MiB").value(), 2097152u);
  EXPECT_EQ(parseBytes("256KiB").value(), 262144u);
  EXPECT_EQ(parseBytes("64KB").value(), 64000u);
  EXPECT_EQ(parseBytes("64kB").value(), 64000u);
  EXPECT_EQ(parseBytes("1500B").value(), 1500u);
  EXPECT_EQ(parseBytes("1500").value(), 1500u);
  EXPECT_EQ(parseBytes("2.5MB").value(), 2500000u);
  EXPECT_EQ(parseBytes("1.1KB").value(), 1100u);  // 1100.0000000000002 in binary floating point
  EXPECT_EQ(parseBytes("1GiB").value(), 1073741824u);
  EXPECT_EQ(parseBytes("4GB").value(), 4000000000u);  // no queue limit here
  EXPECT_THAT(parseBytes("1.5B").status().message(), HasSubstr("not a whole number of bytes"));
  EXPECT_THAT(parseBytes("1.5").status().message(), HasSubstr("not a whole number of bytes"));
  EXPECT_THAT(parseBytes("2mb").status().message(), HasSubstr("unknown unit 'mb'"));
  EXPECT_THAT(parseBytes("-1B").status().message(), HasSubstr("is negative"));
  EXPECT_THAT(parseBytes("1e30").status().message(), HasSubstr("out of range"));
}

TEST(UnitsTest, ParsesFractions) {
  EXPECT_EQ(parseFraction("0.5%").value(), 0.005);
  EXPECT_EQ(parseFraction("0.005").value(), 0.005);
  EXPECT_EQ(parseFraction("100%").value(), 1);
  EXPECT_EQ(parseFraction("1").value(), 1);
  EXPECT_EQ(parseFraction("0").value(), 0);
  EXPECT_THAT(parseFraction("101%").status().message(), HasSubstr("above 100%"));
  EXPECT_THAT(parseFraction("1.5").status().message(), HasSubstr("above 1"));
  EXPECT_THAT(parseFraction("-0.1").status().message(), HasSubstr("is negative"));
  EXPECT_THAT(parseFraction("5x").status().message(), HasSubstr("unknown unit 'x'"));
}

TEST(UnitsTest, FormatsInTheLargestExactUnit) {
  EXPECT_EQ(formatDuration(38000), "38ms");
  EXPECT_EQ(formatDuration(500), "500us");
  EXPECT_EQ(formatDuration(1500), "1.5ms");
  EXPECT_EQ(formatDuration(86500), "86.5ms");
  EXPECT_EQ(formatDuration(1e6), "1s");
  EXPECT_EQ(formatDuration(2.5e6), "2.5s");
  EXPECT_EQ(formatDuration(0.5), "500ns");
  EXPECT_EQ(formatDuration(0), "0ms");
  EXPECT_EQ(formatRate(4e8), "400Mbit");
  EXPECT_EQ(formatRate(1e9), "1Gbit");
  EXPECT_EQ(formatRate(1.5e9), "1.5Gbit");
  EXPECT_EQ(formatRate(5e5), "500kbit");
  EXPECT_EQ(formatRate(100), "100bit");
  EXPECT_EQ(formatRate(0), "unlimited");
  EXPECT_EQ(formatBytes(2097152), "2MiB");
  EXPECT_EQ(formatBytes(2621440), "2.5MiB");
  EXPECT_EQ(formatBytes(1536), "1.5KiB");
  EXPECT_EQ(formatBytes(1152), "1.125KiB");
  EXPECT_EQ(formatBytes(std::uint64_t{1} << 30), "1GiB");
  EXPECT_EQ(formatBytes(1000), "1000B");
  EXPECT_EQ(formatBytes(1023), "1023B");
  EXPECT_EQ(formatBytes(2500000), "2500000B");  // 1000-based sizes print as bytes
  EXPECT_EQ(formatBytes(5000000000), "5000000000B");  // not 4882812.5KiB
  EXPECT_EQ(formatBytes(0), "0B");
}

TEST(UnitsTest, FormattedValuesParseBackExactly) {
  for (double us : {0.0, 0.5, 1.0, 7.25, 200.0, 1500.0, 38000.0, 86500.0, 12345.678, 1e6, 0.0001, 999999.999, 3.6e9}) {
    EXPECT_EQ(parseDurationUs(formatDuration(us)).value(), us) << formatDuration(us);
  }
  for (double bits : {0.0, 1.0, 100.0, 1500.0, 4e8, 1.5e9, 123456789.0, 1e12, 0.5}) {
    EXPECT_EQ(parseRateBitsPerSec(formatRate(bits)).value(), bits) << formatRate(bits);
  }
  for (std::uint64_t bytes : {0ull, 1ull, 1000ull, 1023ull, 1024ull, 1152ull, 1536ull, 2500000ull, 2097152ull,
                              6250000ull, 1073741824ull, 123456789ull, 5000000000ull}) {
    EXPECT_EQ(parseBytes(formatBytes(bytes)).value(), bytes) << formatBytes(bytes);
  }
}

}  // namespace
}  // namespace meridian::lab

namespace meridian::lab {
namespace {

// Scenario files (lab/scenario.h): a region isolated from every other one and reconnected,
// and the mistakes such an event can hold, each refused naming the file and line.
TEST(ScenarioTest, IsolateAndReconnectARegion) {
  auto t = loadTopology(std::string(MERIDIAN_SOURCE_DIR) + "/lab/topologies/three-regions.yaml");
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  auto s = parseScenario(
      "events:\n  - at: 5s\n    isolate: {region: singapore}\n  - at: 25s\n    reconnect: {region: singapore}\n",
      "cut.yaml", t.value());
  ASSERT_TRUE(s.isOk()) << s.status().toString();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].kind, ScenarioEvent::Kind::kIsolate);
  EXPECT_EQ((*s)[0].src, "singapore");
  EXPECT_DOUBLE_EQ((*s)[0].atSec, 5.0);
  EXPECT_EQ((*s)[1].kind, ScenarioEvent::Kind::kReconnect);
  EXPECT_NE((*s)[0].describe().find("isolate singapore"), std::string::npos);
  const std::pair<const char*, const char*> bad[] = {
      {"events:\n  - at: 1s\n    isolate: {region: mars}\n", "mars"},
      {"events:\n  - at: 1s\n    isolate: {region: london, plane: wan-a}\n", "takes only region"},
      {"events:\n  - at: 1s\n    reconnect: {}\n", "region"},
      {"events:\n  - at: 1s\n    isolate: london\n", "takes a map"},
  };
  for (const auto& [text, want] : bad) {
    auto r = parseScenario(text, "bad.yaml", t.value());
    ASSERT_FALSE(r.isOk()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("bad.yaml:"), std::string::npos) << r.status().message();
  }
}

// Node events: kill, drain and restart name one node of the topology, nothing else.
TEST(ScenarioTest, KillDrainAndRestartANode) {
  auto t = loadTopology(std::string(MERIDIAN_SOURCE_DIR) + "/lab/topologies/three-regions.yaml");
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  auto s = parseScenario(
      "events:\n  - at: 9s\n    restart: {node: virginia-2}\n  - at: 2s\n    kill: {node: virginia-2}\n"
      "  - at: 4s\n    drain: {node: london-2}\n",
      "nodes.yaml", t.value());
  ASSERT_TRUE(s.isOk()) << s.status().toString();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[0].kind, ScenarioEvent::Kind::kKill);  // in time order
  EXPECT_EQ((*s)[0].src, "virginia-2");
  EXPECT_EQ((*s)[0].describe(), "kill virginia-2");
  EXPECT_EQ((*s)[1].kind, ScenarioEvent::Kind::kDrain);
  EXPECT_EQ((*s)[1].src, "london-2");
  EXPECT_EQ((*s)[2].kind, ScenarioEvent::Kind::kRestart);
  EXPECT_DOUBLE_EQ((*s)[2].atSec, 9.0);
  const std::pair<const char*, const char*> bad[] = {
      {"events:\n  - at: 1s\n    kill: {node: mars-1}\n", "mars-1"},
      {"events:\n  - at: 1s\n    kill: {region: london}\n", "kill takes only node, not 'region'"},
      {"events:\n  - at: 1s\n    restart: {}\n", "needs 'node'"},
      {"events:\n  - at: 1s\n    drain: london-1\n", "drain takes a map"},
      {"events:\n  - at: 1s\n    reboot: {node: london-1}\n", "unknown action 'reboot'"},
  };
  for (const auto& [text, want] : bad) {
    auto r = parseScenario(text, "bad.yaml", t.value());
    ASSERT_FALSE(r.isOk()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("bad.yaml:"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace meridian::lab
