// Routing in the lab (label `lab`): meridian-probe on every node measures the round-trip
// matrix the topology configures, per plane, within 10%. Sub-millisecond links inside a
// region get an absolute allowance instead: the two TUN hops and the user-space wake-ups
// of two probers on a busy 2-core machine add 0.2-0.5 ms (0.3 ms on the minimum round trip,
// 0.8 ms on the smoothed one).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lab/topology.h"
#include "tests/common/lab_session.h"

namespace meridian::routing {
namespace {

using meridian::testing::LabSession;

void checkMatrix(const std::string& topologyName, double timeScale) {
  const std::string file = fmt::format("{}/lab/topologies/{}.yaml", MERIDIAN_SOURCE_DIR, topologyName);
  auto topo = lab::loadTopology(file);
  ASSERT_TRUE(topo.isOk()) << topo.status().message();
  LabSession session("mlroute", file, fmt::format("--time-scale {}", timeScale));
  auto up = session.up();
  ASSERT_EQ(up.code, 0) << up.output;
  const std::string out = ::testing::TempDir() + "/probe-" + topologyName + ".json";
  std::filesystem::remove(out);
  auto r = session.run(fmt::format("exec-all -- {} --duration 3 --every 3 --json {}", MERIDIAN_PROBE_BIN, out));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(out);
  auto report = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << "no report in " << out << "; output:\n" << r.output;
  const auto& names = report["regions"];
  ASSERT_EQ(names.size(), topo->regions.size());
  ASSERT_EQ(report["planes"].size(), topo->planes.size());
  const std::size_t nr = names.size();
  for (std::size_t p = 0; p < topo->planes.size(); ++p) {
    for (std::size_t s = 0; s < nr; ++s) {
      for (std::size_t d = 0; d < nr; ++d) {
        // Region names come from MERIDIAN_REGION in the order ranks first name them, which is
        // the topology's region order.
        ASSERT_EQ(names[s], topo->regions[s].name);
        const auto& cell = report["planes"][p]["rtt_ms"][s * nr + d];
        const auto& floor = report["planes"][p]["min_rtt_ms"][s * nr + d];
        if (s == d && topo->regions[s].nodes < 2) continue;  // nobody to probe inside the region
        ASSERT_FALSE(cell.is_null()) << "plane " << p << " " << names[s] << " -> " << names[d] << " not measured";
        const auto& there = topo->link(static_cast<int>(p), static_cast<int>(s), static_cast<int>(d));
        const auto& back = topo->link(static_cast<int>(p), static_cast<int>(d), static_cast<int>(s));
        const double configured = (there.delayUs + back.delayUs) * timeScale / 1000;
        const std::string what = fmt::format("{} plane {} {} -> {}", topologyName, topo->planes[p].name,
                                             names[s].get<std::string>(), names[d].get<std::string>());
        EXPECT_NEAR(floor.get<double>(), configured, std::max(0.10 * configured, 0.3)) << what << " (min RTT)";
        EXPECT_NEAR(cell.get<double>(), configured, std::max(0.10 * configured, 0.8)) << what << " (smoothed RTT)";
      }
    }
    EXPECT_TRUE(report["congested"].empty()) << report["congested"].dump();
  }
}

TEST(RoutingLabTest, ProbeMatrixMatchesTwoRegions) {
  if (auto why = meridian::testing::labUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  checkMatrix("two-regions", 1.0);
}

TEST(RoutingLabTest, ProbeMatrixMatchesThreeRegions) {
  if (auto why = meridian::testing::labUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  checkMatrix("three-regions", 1.0);
}

}  // namespace
}  // namespace meridian::routing
