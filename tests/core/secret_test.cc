// Job secret loading and HMAC-SHA256 (checked against RFC 4231 test case 2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/knobs.h"
#include "core/secret.h"

namespace meridian {
namespace {

class SecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = std::getenv("MERIDIAN_SECRET") ? std::getenv("MERIDIAN_SECRET") : "";
    ::unsetenv("MERIDIAN_SECRET");
    ::unsetenv("MERIDIAN_SECRET_FILE");
  }
  void TearDown() override {
    ::unsetenv("MERIDIAN_SECRET_FILE");
    if (!saved_.empty()) ::setenv("MERIDIAN_SECRET", saved_.c_str(), 1);
  }
  std::string saved_;
};

TEST_F(SecretTest, HmacMatchesRfc4231) {
  std::string key = "Jefe", data = "what do ya want for nothing?";
  auto mac = hmacSha256({reinterpret_cast<const std::uint8_t*>(key.data()), key.size()},
                        {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
  const std::uint8_t expected[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                                     0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                                     0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_EQ(0, std::memcmp(mac.data(), expected, 32));
}

TEST_F(SecretTest, EnvironmentThenFileThenDevelopmentDefault) {
  ::setenv("MERIDIAN_SECRET", "from-env", 1);
  EXPECT_EQ(loadJobSecret(), "from-env");
  ::unsetenv("MERIDIAN_SECRET");
  std::string path = ::testing::TempDir() + "/meridian-secret";
  std::ofstream(path) << "from-file\n";
  ::setenv("MERIDIAN_SECRET_FILE", path.c_str(), 1);
  EXPECT_EQ(loadJobSecret(), "from-file");
  ::unsetenv("MERIDIAN_SECRET_FILE");
}

TEST_F(SecretTest, WithoutASecretAJobOfSeveralRanksIsClosedUnlessToldInsecure) {
  auto closed = readJobSecret(4);
  ASSERT_FALSE(closed.isOk());
  EXPECT_EQ(closed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(closed.status().message().find("MERIDIAN_SECRET"), std::string::npos) << closed.status().toString();
  EXPECT_NE(closed.status().message().find("MERIDIAN_INSECURE=1"), std::string::npos);
  EXPECT_FALSE(readJobSecret().isOk()) << "an unknown world size counts as several ranks";
  // One rank: nobody else to keep out; each process its own random secret.
  auto alone = readJobSecret(1);
  ASSERT_TRUE(alone.isOk());
  EXPECT_EQ(alone->size(), 64u);
  EXPECT_NE(alone.value(), readJobSecret(1).value());
  ::setenv("MERIDIAN_INSECURE", "1", 1);
  auto open = readJobSecret(4);
  ::unsetenv("MERIDIAN_INSECURE");
  ASSERT_TRUE(open.isOk());
  EXPECT_EQ(open.value(), "meridian-insecure-development-secret");
  ::setenv("MERIDIAN_INSECURE", "yes", 1);
  EXPECT_FALSE(readJobSecret(4).isOk()) << "MERIDIAN_INSECURE takes 0 or 1";
  ::unsetenv("MERIDIAN_INSECURE");
}

TEST_F(SecretTest, MissingOrEmptySecretFileIsAConfigError) {
  ::setenv("MERIDIAN_SECRET_FILE", "/nonexistent/secret", 1);
  EXPECT_THROW(loadJobSecret(), ConfigError);
  auto missing = readJobSecret();
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(), "MERIDIAN_SECRET_FILE='/nonexistent/secret': cannot read it");
  std::string path = ::testing::TempDir() + "/meridian-empty-secret";
  std::ofstream(path) << "\n";
  ::setenv("MERIDIAN_SECRET_FILE", path.c_str(), 1);
  EXPECT_THROW(loadJobSecret(), ConfigError);
  EXPECT_EQ(readJobSecret().status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meridian
