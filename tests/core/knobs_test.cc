// Knob parsing, and the README table generated from the declarations.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "core/knobs.h"

namespace meridian {
namespace {

struct EnvGuard {
  std::string name;
  explicit EnvGuard(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~EnvGuard() { ::unsetenv(name.c_str()); }
};

TEST(KnobsTest, DefaultsApplyWhenUnset) {
  ::unsetenv("MERIDIAN_TCP_STREAMS");
  EXPECT_EQ(knobInt(knobs::kTcpStreams), 2);
  EXPECT_FALSE(knobIsSet(knobs::kTcpStreams));
}

TEST(KnobsTest, ParsesIntegersWithSizeSuffixes) {
  EnvGuard g("MERIDIAN_CHUNK_BYTES", "256k");
  EXPECT_EQ(knobInt(knobs::kChunkBytes), 256 * 1024);
  EXPECT_EQ(parseByteSize("4M", "x"), 4 << 20);
  EXPECT_EQ(parseByteSize("1GiB", "x"), 1 << 30);
  EXPECT_EQ(parseByteSize("-3", "x"), -3);
}

TEST(KnobsTest, GarbageIsAConfigErrorNamingTheVariable) {
  EnvGuard g("MERIDIAN_TCP_STREAMS", "lots");
  try {
    knobInt(knobs::kTcpStreams);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MERIDIAN_TCP_STREAMS"), std::string::npos);
  }
  EXPECT_THROW(parseByteSize("12q", "x"), ConfigError);
  EXPECT_THROW(parseByteSize("99999999999999999999", "x"), ConfigError);
  EXPECT_THROW(parseByteSize("9000000000000G", "x"), ConfigError);
}

TEST(KnobsTest, RangeIsChecked) {
  EnvGuard g("MERIDIAN_TCP_STREAMS", "40");
  EXPECT_THROW(knobInt(knobs::kTcpStreams, 1, 16), ConfigError);
}

TEST(KnobsTest, EveryKnobIsNamedOnceAndDocumented) {
  std::set<std::string> names;
  for (const auto& k : allKnobs()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " declared twice";
    EXPECT_EQ(std::string(k.name).rfind("MERIDIAN_", 0), 0u) << k.name;
    EXPECT_GT(std::string(k.doc).size(), 10u) << k.name;
  }
}

TEST(KnobsTest, ReadmeTableIsTheGeneratedOne) {
  std::ifstream in(std::string(MERIDIAN_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find(knobMarkdownTable()), std::string::npos)
      << "README.md's knob table is stale: run scripts/update-readme-knobs.sh";
}

}  // namespace
}  // namespace meridian
