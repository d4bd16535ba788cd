// Fabric paths across the lab (label `lab`): two-regions-fabric.yaml puts every channel's fabric
// path (libfabric's tcp;ofi_rxm bound to the wan-a interface) on wan-a and its TCP path on wan-b,
// so one multipath channel stripes over two kinds of path across real emulated links. Congesting
// or cutting the fabric plane moves the traffic to the TCP plane, and it comes back when the
// plane does; no result is ever wrong.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/lab_session.h"
#include "tests/common/lab_timeline.h"

namespace meridian::testing {
namespace {

// A channel's paths here: the TCP path on wan-b, the relay slot, then the fabric path
// (docs/transport.md, "Fabric rails and fabric paths").
constexpr std::size_t kFabricPath = 2;

class FabricLabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = labUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
    session_ = std::make_unique<LabSession>(
        "mlfabric", fmt::format("{}/lab/topologies/two-regions-fabric.yaml", MERIDIAN_SOURCE_DIR), "--time-scale 0.25");
    auto up = session_->up();
    ASSERT_EQ(up.code, 0) << up.output;
  }
  std::unique_ptr<LabSession> session_;
};

// The largest share of the fabric path among `rows` (0 when none).
double bestFabricShare(const std::vector<nlohmann::json>& rows) {
  double best = 0;
  for (const auto& r : rows) best = std::max(best, shareOfPath(r, kFabricPath));
  return best;
}

// wan-a (the fabric plane) from 100 to 20 Mbit/s for 7 s (from 9 s after the launch: the bench's
// clock starts 2-3 s after it, once the communicator is up) under a loop of 16 MiB ring
// allreduces: within 2 s the fabric path carries about its share of what is left (20 of
// 120 Mbit/s), not half; after the restore it carries a fair part again.
TEST_F(FabricLabTest, CongestingTheFabricPlaneMovesTrafficToTcpAndBack) {
  Timeline tl = runTimeline(*session_, {.env = "MERIDIAN_ALGO=ring MERIDIAN_LOG=info:transport",
                                        .seconds = 24,
                                        .changes = {{9, "set wan-a east west --rate 20Mbit"},
                                                    {16, "restore wan-a east west"}}});
  ASSERT_EQ(tl.code, 0) << tl.output;
  ASSERT_EQ(tl.startSec.size(), 2u) << "the changes were not placed on the timeline: " << tl.output;
  const double cut = tl.startSec[0], restored = tl.startSec[1];
  // The fabric paths are up and carry their share while both planes are equal.
  auto before = rowsWithin(tl.rows, 0, cut);
  ASSERT_FALSE(before.empty()) << tl.output;
  for (const auto& r : before) {
    EXPECT_GT(shareOfPath(r, kFabricPath), 0.25) << "at t=" << r["t"] << ": " << tl.output;
  }
  auto congested = rowsWithin(tl.rows, cut + 2, restored);
  ASSERT_FALSE(congested.empty()) << tl.output;
  for (const auto& r : congested) {
    EXPECT_LT(shareOfPath(r, kFabricPath), 0.3) << "at t=" << r["t"] << ": " << tl.output;
  }
  // Back: the last rows, from 4 s after the restore on, give the fabric path a fair part.
  auto after = rowsWithin(tl.rows, restored + 4, 1e9);
  ASSERT_FALSE(after.empty()) << tl.output;
  const double best = bestFabricShare(after);
  EXPECT_GT(best, 0.3) << "the fabric path did not take its share back: " << tl.output;
  std::printf("[ fabric   ] wan-a 100 -> 20 Mbit/s at t=%.1f s, restored at %.1f s: fabric share %.2f before, "
              "%.2f at most during, %.2f at best after\n",
              cut, restored, shareOfPath(before.back(), kFabricPath), bestFabricShare(congested), best);
}

// wan-a cut entirely for 9 s while checked allreduces run: every result is right (the fabric
// path's chunks move to the TCP path when it stalls), nothing crosses on the fabric path
// meanwhile, and after the restore the fabric path carries bytes again.
TEST_F(FabricLabTest, CuttingTheFabricPlaneLosesNothingAndThePathComesBack) {
  Timeline tl = runTimeline(*session_, {.env = "MERIDIAN_PATH_STALL_MS=1000 MERIDIAN_ALGO=ring MERIDIAN_LOG=info:transport",
                                        .seconds = 32,  // the provider's retransmit backoff after the cut: up to ~6 s
                                        .changes = {{8, "cut wan-a east west"}, {17, "restore wan-a east west"}},
                                        .check = true});
  ASSERT_EQ(tl.code, 0) << tl.output;
  ASSERT_EQ(tl.startSec.size(), 2u) << tl.output;
  EXPECT_EQ(wrongElements(tl.rows), 0u) << tl.output;
  const double cut = tl.startSec[0], restored = tl.startSec[1];
  // From 1.5 s after the cut (the stall limit is 1 s) to the restore; ops under the cut take
  // 2-3 s, so the 9 s cut holds at least one whole row.
  auto during = rowsWithin(tl.rows, cut + 1.5, restored);
  ASSERT_FALSE(during.empty()) << tl.output;
  for (const auto& r : during) {
    EXPECT_LT(shareOfPath(r, kFabricPath), 0.01) << "at t=" << r["t"] << ": " << tl.output;
    EXPECT_GT(r["ops"].get<int>(), 0) << "the ops stopped during the cut: " << tl.output;
  }
  auto after = rowsWithin(tl.rows, restored + 3, 1e9);
  ASSERT_FALSE(after.empty()) << tl.output;
  const double best = bestFabricShare(after);
  // It comes back when the provider's own TCP connection retransmits (its backoff after a 9 s
  // cut: a few seconds), and its share grows from there: carrying bytes again is the check.
  EXPECT_GT(best, 0.02) << "the fabric path did not come back: " << tl.output;
  std::printf("[ fabric   ] wan-a cut at t=%.1f s, restored at %.1f s: %zu rows during the cut on TCP alone, "
              "fabric share %.2f at best after\n",
              cut, restored, during.size(), best);
}

}  // namespace
}  // namespace meridian::testing
