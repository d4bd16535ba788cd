// Region assignment: from MERIDIAN_REGION names, and inferred by clustering an RTT matrix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/common/noise.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "routing/regions.h"

namespace meridian::routing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Noise = meridian::testing::Noise;

// Three regions, two ranks each, interleaved so numbering by lowest rank is visible:
// ranks 0 and 3 in London, 1 and 4 in Virginia, 2 and 5 in Singapore. 0.2 ms inside a region;
// London-Virginia 78 ms, London-Singapore 170 ms, Virginia-Singapore 217 ms; every entry
// (each direction separately) off by up to +-10%.
std::vector<double> threeRegions() {
  const int truth[6] = {0, 1, 2, 0, 1, 2};
  const double interMs[3][3] = {{0.2, 78, 170}, {78, 0.2, 217}, {170, 217, 0.2}};
  Noise noise(777);
  std::vector<double> m(36, 0.0);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) {
      if (i == j) continue;
      m[static_cast<std::size_t>(i * 6 + j)] = interMs[truth[i]][truth[j]] * 1000 * (0.9 + 0.2 * noise.next());
    }
  }
  return m;
}

void set(std::vector<double>& m, int n, int i, int j, double v) { m[static_cast<std::size_t>(i * n + j)] = v; }

TEST(RegionsFromNamesTest, NumbersRegionsByFirstAppearance) {
  auto r = regionsFromNames({"london", "london", "virginia", "singapore", "virginia", "singapore"});
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 0, 1, 2, 1, 2));
  EXPECT_THAT(r->names, ElementsAre("london", "virginia", "singapore"));
  EXPECT_FALSE(r->inferred);
}

TEST(RegionsFromNamesTest, NamesAreComparedExactly) {
  auto r = regionsFromNames({"eu-west", "EU-west", "eu-west"});
  ASSERT_TRUE(r.isOk());
  EXPECT_THAT(r->regionOf, ElementsAre(0, 1, 0));
}

TEST(RegionsFromNamesTest, MissingNamesAreAnErrorListingTheRanks) {
  auto r = regionsFromNames({"a", "", "b", ""});
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("MERIDIAN_REGION"));
  EXPECT_THAT(r.status().message(), HasSubstr("ranks 1, 3"));

  auto one = regionsFromNames({"a", "b", ""});
  ASSERT_FALSE(one.isOk());
  EXPECT_THAT(one.status().message(), HasSubstr("rank 2"));

  // A large job: the list is cut short but says how many.
  std::vector<std::string> many(100);
  auto lots = regionsFromNames(many);
  ASSERT_FALSE(lots.isOk());
  EXPECT_THAT(lots.status().message(), HasSubstr("0, 1, 2"));
  EXPECT_THAT(lots.status().message(), HasSubstr("(100 in all)"));
  EXPECT_THAT(lots.status().message(), ::testing::Not(HasSubstr(", 99")));

  EXPECT_EQ(regionsFromNames({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(InferRegionsTest, FindsThreeRegionsOfTwoInANoisyMatrix) {
  auto r = inferRegions(threeRegions(), 6);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_THAT(r->names, ElementsAre("region-0", "region-1", "region-2"));
  EXPECT_TRUE(r->inferred);
}

TEST(InferRegionsTest, OneQueuedDirectionDoesNotSplitARegion) {
  // Rank 0 measured rank 3 through a 40 ms queue; rank 3's own measurement is clean. The smaller
  // direction counts.
  auto m = threeRegions();
  set(m, 6, 0, 3, 40000);
  auto r = inferRegions(m, 6);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 1, 2, 0, 1, 2));
}

TEST(InferRegionsTest, UnknownEntriesGiveNoEvidence) {
  auto m = threeRegions();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  set(m, 6, 0, 3, -1);  // one direction of an intra-region pair
  set(m, 6, 1, 2, -1);  // both directions of an inter-region pair
  set(m, 6, 2, 1, nan);
  set(m, 6, 4, 5, -1);
  set(m, 6, 5, 4, -1);
  auto r = inferRegions(m, 6);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 1, 2, 0, 1, 2));
}

TEST(InferRegionsTest, WithoutIntraRegionRttsTheInterRegionOnesAllLink) {
  // With no 0.2 ms pair known there is no contrast to find: a documented limit, not a guess.
  auto m = threeRegions();
  for (auto [i, j] : {std::pair{0, 3}, std::pair{1, 4}, std::pair{2, 5}}) {
    set(m, 6, i, j, -1);
    set(m, 6, j, i, -1);
  }
  auto r = inferRegions(m, 6);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  // Inter-region RTTs alone (70-240 ms) have no gap of 3x, so they all link: one region.
  EXPECT_THAT(r->regionOf, ElementsAre(0, 0, 0, 0, 0, 0));
}

TEST(InferRegionsTest, AUniformMatrixIsOneRegion) {
  const int n = 4;
  Noise noise(777);
  std::vector<double> m(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) set(m, n, i, j, 50000 * (0.95 + 0.1 * noise.next()));
    }
  }
  auto r = inferRegions(m, n);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 0, 0, 0));
  EXPECT_THAT(r->names, ElementsAre("region-0"));
}

TEST(InferRegionsTest, FineStructureInsideOneMetroIsOneRegion) {
  // Two hosts of two ranks each: 0.05 ms on a host, 0.4 ms across hosts. The 8x gap is under
  // the 2 ms floor, so it is not a region boundary.
  const int n = 4;
  std::vector<double> m(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) set(m, n, i, j, i / 2 == j / 2 ? 50 : 400);
    }
  }
  auto r = inferRegions(m, n);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 0, 0, 0));
}

TEST(InferRegionsTest, NearbyRegionsAreStillSeparated) {
  // Two regions 8 ms apart (say London and Paris), ranks 0.3 ms apart inside each.
  const int n = 4;
  std::vector<double> m(n * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) set(m, n, i, j, (i < 2) == (j < 2) ? 300 : 8000);
    }
  }
  auto r = inferRegions(m, n);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0, 0, 1, 1));
}

TEST(InferRegionsTest, SingleRankIsOneRegion) {
  auto r = inferRegions({0.0}, 1);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_THAT(r->regionOf, ElementsAre(0));
  EXPECT_THAT(r->names, ElementsAre("region-0"));
}

TEST(InferRegionsTest, RejectsBadInput) {
  EXPECT_EQ(inferRegions({}, 0).status().code(), StatusCode::kInvalidArgument);
  auto wrongSize = inferRegions(std::vector<double>(8, 1.0), 3);
  ASSERT_FALSE(wrongSize.isOk());
  EXPECT_THAT(wrongSize.status().message(), HasSubstr("8 entries"));
  // Rank 5 has no known RTT to anybody: it cannot be placed.
  auto m = threeRegions();
  for (int j = 0; j < 6; ++j) {
    set(m, 6, 5, j, -1);
    set(m, 6, j, 5, -1);
  }
  auto isolated = inferRegions(m, 6);
  ASSERT_FALSE(isolated.isOk());
  EXPECT_EQ(isolated.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(isolated.status().message(), HasSubstr("rank 5"));
}

}  // namespace
}  // namespace meridian::routing
