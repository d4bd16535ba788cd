// Planned allreduces and plan switching over real TCP (ranks as threads): every algorithm
// the planner can pick gives the reference result, and forced random re-plans during 1,000
// collectives leave every result correct, with every rank switching at the same collective.
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "routing/planner.h"
#include "tests/common/collective_checks.h"
#include "tests/common/rank_harness.h"

namespace meridian::testing {
namespace {

using collectives::CommOptions;
using routing::Algorithm;
using routing::Plan;
using routing::PlanTable;

const std::vector<std::string> kRegions{"london", "virginia", "singapore"};

// Ranks interleaved over three regions (as launchers may number them), every collective a
// plan checkpoint, a small segment so pipelines run on small data. With static routing only
// the test's own proposals change the plan.
Result<std::unique_ptr<RankHarness>> startHarness(int ranks, const std::string& routing) {
  CommOptions opts;
  opts.routing = routing;
  opts.ringSegmentBytes = 16 << 10;
  opts.planCheckpointOps = 1;
  opts.chaosReplan = std::chrono::milliseconds(0);
  opts.timeout = std::chrono::seconds(60);
  return RankHarness::start(ranks, opts, [](int rank, CommOptions& o) {
    o.region = kRegions[static_cast<std::size_t>(rank) % kRegions.size()];
  });
}

PlanTable everywhere(const Plan& plan) {
  PlanTable t;
  t.classBytes = {routing::kMaxClassBytes};
  t.plans = {plan};
  return t;
}

// Runs allreduces until rank 0's proposal of epoch `epoch` is in force, then checks sizes
// from one element to several segments, in and out of place, sum and max.
std::string checkUnderPlan(collectives::Communicator& c, std::uint64_t epoch) {
  for (int i = 0; i < 4 && c.plan().epoch < epoch; ++i) {
    if (auto e = checkAllreduce(c, 8, DataType::kF32, ReduceOp::kSum, false); !e.empty()) return e;
  }
  if (c.plan().epoch != epoch) return fmt::format("epoch {} not in force after 4 collectives", epoch);
  for (std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1000}, std::size_t{100'003}}) {
    for (bool inPlace : {false, true}) {
      if (auto e = checkAllreduce(c, count, DataType::kF32, ReduceOp::kSum, inPlace); !e.empty()) return e;
    }
    if (auto e = checkAllreduce(c, count, DataType::kI32, ReduceOp::kMax, false); !e.empty()) return e;
  }
  return "";
}

TEST(PlannedAllreduceTest, EveryAlgorithmThePlannerCanPickMatchesTheReference) {
  auto h = startHarness(6, "static");
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  RankHarness& harness = *h.value();
  std::vector<Plan> plans(6);
  plans[0].algorithm = Algorithm::kRing;
  plans[0].ringOrder = {3, 1, 5, 0, 2, 4};
  plans[1].algorithm = Algorithm::kHalvingDoubling;  // 6 ranks: a fold, then 4 survivors
  plans[1].ringOrder = {5, 4, 3, 2, 1, 0};
  plans[2].algorithm = Algorithm::kTree;
  plans[2].ringOrder = {2, 0, 4, 1, 5, 3};
  plans[2].root = 4;
  plans[3].algorithm = Algorithm::kHierarchical;  // regions are rank % 3
  plans[3].groups = {{3, 0}, {1, 4}, {5, 2}};
  plans[3].crossOrder = {2, 0, 1};
  plans[4].algorithm = Algorithm::kParameterServer;
  plans[4].root = 3;
  plans[5].algorithm = Algorithm::kHierarchical;  // two regions of three: the direct exchange of 2
  plans[5].groups = {{0, 2, 4}, {1, 3, 5}};
  for (std::size_t k = 0; k < plans.size(); ++k) {
    ASSERT_TRUE(harness.comm(0).proposePlan(everywhere(plans[k]), "test").isOk());
    const std::uint64_t epoch = k + 1;
    EXPECT_EQ(RankHarness::summarize(harness.run([&](int, collectives::Communicator& c) {
                if (auto e = checkUnderPlan(c, epoch); !e.empty()) {
                  return fmt::format("{}: {}", routing::algorithmName(plans[k].algorithm), e);
                }
                return std::string();
              })),
              "");
  }
}

TEST(PlannedAllreduceTest, OnlyRankZeroProposesAndOnlyPlansThatFit) {
  auto h = startHarness(3, "static");
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  Plan p;
  p.ringOrder = {0, 1, 2};
  EXPECT_EQ(h.value()->comm(1).proposePlan(everywhere(p), "not rank 0").code(), StatusCode::kInvalidArgument);
  p.ringOrder = {0, 1, 1};
  EXPECT_EQ(h.value()->comm(0).proposePlan(everywhere(p), "bad order").code(), StatusCode::kInvalidArgument);
  p.ringOrder = {};
  PlanTable unsorted;
  unsorted.classBytes = {2048, 1024};
  unsorted.plans = {p, p};
  EXPECT_EQ(h.value()->comm(0).proposePlan(unsorted, "bad classes").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.value()->comm(2).forceReplan(1).code(), StatusCode::kInvalidArgument);
}

// Rank 0 forces a random plan every 10 collectives (from its own thread, while the other
// ranks run ahead into the next ops) during 1,000 collectives of mixed kinds and sizes: every
// result is right, nothing hangs, and every rank ends on the same epoch, adopted at the same
// collective. (MERIDIAN_CHAOS_REPLAN_MS, the timer-driven variant, runs in the lab test.)
TEST(PlanSwitchTest, RandomForcedReplansDuringAThousandCollectives) {
  auto h = startHarness(6, "adaptive");  // the planner's own re-plans mix in
  ASSERT_TRUE(h.isOk()) << h.status().toString();
  std::vector<collectives::PlanInForce> last(6);
  EXPECT_EQ(RankHarness::summarize(h.value()->run([&](int rank, collectives::Communicator& c) -> std::string {
              std::mt19937 rng(7);  // the same sequence of ops on every rank
              for (int i = 0; i < 1000; ++i) {
                if (rank == 0 && i % 10 == 0) {
                  if (Status st = c.forceReplan(static_cast<std::uint64_t>(i) + 1); !st.isOk()) return st.toString();
                }
                const std::size_t count = std::uniform_int_distribution<std::size_t>(1, 40'000)(rng);
                const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
                std::string e;
                if (kind < 8) {
                  e = checkAllreduce(c, count, kind % 2 ? DataType::kI32 : DataType::kF32,
                                     kind % 3 ? ReduceOp::kSum : ReduceOp::kMax, kind % 4 == 0,
                                     static_cast<std::uint32_t>(i));
                } else if (kind == 8) {
                  e = checkBroadcast(c, count, DataType::kF32, i % c.size(), false, static_cast<std::uint32_t>(i));
                } else {
                  e = checkAllgather(c, count / 8 + 1, DataType::kI32, false, static_cast<std::uint32_t>(i));
                }
                if (!e.empty()) return fmt::format("collective {}: {} (epoch {})", i, e, c.plan().epoch);
              }
              last[static_cast<std::size_t>(rank)] = c.plan();
              return std::string();
            })),
            "");
  EXPECT_GE(last[0].epoch, 90u) << "too few forced re-plans took effect";
  for (const auto& p : last) {
    EXPECT_EQ(p.epoch, last[0].epoch);
    EXPECT_EQ(p.sinceSeq, last[0].sinceSeq);
  }
}

}  // namespace
}  // namespace meridian::testing
