// MERIDIAN_LOG parsing: levels and subsystem filters.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/knobs.h"
#include "core/log.h"

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

}  // namespace
}  // namespace meridian
