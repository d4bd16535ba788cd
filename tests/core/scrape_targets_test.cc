// Prometheus file discovery: MERIDIAN_METRICS_ADDR parsing, the file_sd JSON a launcher
// writes, and its removal when the job ends.
#include "core/scrape_targets.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace meridian {
namespace {

TEST(ScrapeTargetsTest, MetricsAddressParsing) {
  auto unset = parseMetricsAddress("");
  ASSERT_TRUE(unset.isOk());
  EXPECT_EQ(unset->value(), (std::pair<std::string, int>{"127.0.0.1", kMetricsBasePort}));
  auto off = parseMetricsAddress("0");
  ASSERT_TRUE(off.isOk());
  EXPECT_FALSE(off->has_value());
  auto given = parseMetricsAddress("198.19.3.4:9500");
  ASSERT_TRUE(given.isOk());
  EXPECT_EQ(given->value(), (std::pair<std::string, int>{"198.19.3.4", 9500}));
  EXPECT_EQ(parseMetricsAddress("localhost:80")->value().first, "127.0.0.1");
  for (const char* bad : {"9400", "host:80", "1.2.3.4:0", "1.2.3.4:65536", ":80", "1.2.3.4:8x"}) {
    auto r = parseMetricsAddress(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_NE(r.status().message().find("MERIDIAN_METRICS_ADDR"), std::string::npos) << r.status().message();
  }
}

TEST(ScrapeTargetsTest, AFileLivesAsLongAsItsJob) {
  const std::string dir = std::filesystem::temp_directory_path() / ("meridian-sd-test-" + std::to_string(::getpid()));
  ::setenv("MERIDIAN_PROMETHEUS_SD_DIR", dir.c_str(), 1);
  {
    ScrapeTargetsFile file("job-1", {{"127.0.0.1:9400", {{"rank", "0"}}}, {"127.0.0.1:9401", {{"rank", "1"}, {"region", "eu"}}}});
    std::ifstream in(dir + "/job-1.json");
    ASSERT_TRUE(in.good());
    auto j = nlohmann::json::parse(in);
    ASSERT_EQ(j.size(), 2u);
    EXPECT_EQ(j[1]["targets"][0], "127.0.0.1:9401");
    EXPECT_EQ(j[1]["labels"]["region"], "eu");
    EXPECT_EQ(j[0]["labels"]["rank"], "0");
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-1.json")) << "removed when its job ended";
  EXPECT_FALSE(writeScrapeTargets("../escape", {}).isOk());
  ::unsetenv("MERIDIAN_PROMETHEUS_SD_DIR");
  std::filesystem::remove_all(dir);
}

// Regression (issue 26): the files went into a fixed directory in /tmp, made by whoever came
// first, through a predictable temporary name; a symlink planted there made root overwrite
// another file.
TEST(ScrapeTargetsTest, ADirectoryOthersCanWriteIsRefusedAndNothingIsWritten) {
  const std::string dir = std::filesystem::temp_directory_path() / ("meridian-sd-open-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::all);  // 0777, as a shared /tmp directory
  ::setenv("MERIDIAN_PROMETHEUS_SD_DIR", dir.c_str(), 1);
  Status st = writeScrapeTargets("job-2", {{"127.0.0.1:9400", {}}});
  ::unsetenv("MERIDIAN_PROMETHEUS_SD_DIR");
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("MERIDIAN_PROMETHEUS_SD_DIR"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("refusing directory " + dir), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/job-2.json"));
  std::filesystem::remove_all(dir);
}

TEST(ScrapeTargetsTest, UnsetTheyGoToThisUsersPrivateDirectory) {
  ::unsetenv("MERIDIAN_PROMETHEUS_SD_DIR");
  const std::string tmp = std::filesystem::temp_directory_path() / ("meridian-sd-roots-" + std::to_string(::getpid()));
  std::filesystem::remove_all(tmp);
  std::filesystem::create_directories(tmp);
  auto dir = scrapeTargetsDir({"", "", tmp});
  ASSERT_TRUE(dir.isOk()) << dir.status().toString();
  EXPECT_EQ(dir.value(), tmp + "/meridian-" + std::to_string(::geteuid()) + "/prometheus-sd");
  EXPECT_EQ(std::filesystem::status(dir.value()).permissions(), std::filesystem::perms::owner_all);
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace meridian
