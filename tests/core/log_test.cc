// MERIDIAN_LOG parsing: levels and subsystem filters.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/knobs.h"
#include "core/log.h"
#include "core/log_limit.h"

namespace meridian {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("MERIDIAN_LOG");
    log::configureFromEnv();
  }
};

TEST_F(LogTest, LevelFiltersMessages) {
  ::setenv("MERIDIAN_LOG", "info", 1);
  log::configureFromEnv();
  EXPECT_TRUE(log::enabled(Subsys::kTransport, spdlog::level::info));
  EXPECT_FALSE(log::enabled(Subsys::kTransport, spdlog::level::debug));
}

TEST_F(LogTest, SubsystemListRestrictsOutput) {
  ::setenv("MERIDIAN_LOG", "debug:transport,bench", 1);
  log::configureFromEnv();
  EXPECT_TRUE(log::enabled(Subsys::kTransport, spdlog::level::debug));
  EXPECT_TRUE(log::enabled(Subsys::kBench, spdlog::level::info));
  EXPECT_FALSE(log::enabled(Subsys::kCollectives, spdlog::level::err));
}

TEST_F(LogTest, BadValuesAreConfigErrors) {
  ::setenv("MERIDIAN_LOG", "loud", 1);
  EXPECT_THROW(log::configureFromEnv(), ConfigError);
  ::setenv("MERIDIAN_LOG", "info:nosuchsubsystem", 1);
  EXPECT_THROW(log::configureFromEnv(), ConfigError);
}

TEST_F(LogTest, DefaultIsWarn) {
  ::unsetenv("MERIDIAN_LOG");
  log::configureFromEnv();
  EXPECT_TRUE(log::enabled(Subsys::kCore, spdlog::level::warn));
  EXPECT_FALSE(log::enabled(Subsys::kCore, spdlog::level::info));
}

TEST(LogRateLimiterTest, LetsAFewLinesAWindowThroughAndCountsTheRest) {
  LogRateLimiter limiter(3, std::chrono::milliseconds(1000));
  const TimePoint t0 = Clock::now();
  std::uint64_t heldBack = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.allow(t0 + std::chrono::milliseconds(i), &heldBack));
    EXPECT_EQ(heldBack, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.allow(t0 + std::chrono::milliseconds(10), &heldBack));
  EXPECT_EQ(limiter.printed(), 3u);
  EXPECT_EQ(limiter.suppressed(), 1000u);
  // The next window's first line says how many were held back.
  ASSERT_TRUE(limiter.allow(t0 + std::chrono::milliseconds(1000), &heldBack));
  EXPECT_EQ(heldBack, 1000u);
  ASSERT_TRUE(limiter.allow(t0 + std::chrono::milliseconds(1001), &heldBack));
  EXPECT_EQ(heldBack, 0u);
}

}  // namespace
}  // namespace meridian
