// Knob parsing, and the README table generated from the declarations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

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

TEST(KnobsTest, ResultFormsReturnTheThrowingFormsMessageAsAStatus) {
  {
    EnvGuard g("MERIDIAN_TCP_STREAMS", "lots");
    Result<std::int64_t> v = internalError("not read");
    EXPECT_NO_THROW(v = readKnobInt(knobs::kTcpStreams, 1, 16));
    ASSERT_FALSE(v.isOk());
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(v.status().message(), "MERIDIAN_TCP_STREAMS='lots': not an integer");
  }
  {
    EnvGuard g("MERIDIAN_TCP_STREAMS", "40");
    auto v = readKnobInt(knobs::kTcpStreams, 1, 16);
    ASSERT_FALSE(v.isOk());
    EXPECT_EQ(v.status().message(), "MERIDIAN_TCP_STREAMS='40': not in [1, 16]");
    try {
      (void)knobInt(knobs::kTcpStreams, 1, 16);
      FAIL() << "knobInt took 40";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), v.status().message());
    }
  }
  {
    EnvGuard g("MERIDIAN_TCP_STREAMS", "4");
    EXPECT_EQ(readKnobInt(knobs::kTcpStreams, 1, 16).value(), 4);
  }
  ::unsetenv("MERIDIAN_TCP_STREAMS");
  EXPECT_EQ(readKnobInt(knobs::kTcpStreams).value(), 2) << "the default";
  EXPECT_EQ(readByteSize("16M", "x").value(), 16 << 20);
  EXPECT_EQ(readByteSize("12q", "--size").status().message(), "--size='12q': not an integer");
}

TEST(KnobsTest, ChoiceTakesAnAllowedValueFromTheEnvironment) {
  EnvGuard g("MERIDIAN_ROUTING", "static");
  auto v = readKnobChoice(knobs::kRouting);
  ASSERT_TRUE(v.isOk()) << v.status().toString();
  EXPECT_EQ(v.value(), "static");
  EXPECT_EQ(knobChoice(knobs::kRouting), "static");
}

TEST(KnobsTest, ChoiceFallsBackToItsDefaultWhenUnsetOrEmpty) {
  ::unsetenv("MERIDIAN_ALGO");
  EXPECT_EQ(readKnobChoice(knobs::kAlgo).value(), "auto");
  EnvGuard g("MERIDIAN_ALGO", "");
  EXPECT_EQ(readKnobChoice(knobs::kAlgo).value(), "auto");
}

TEST(KnobsTest, ChoiceGivenExplicitlyOverridesTheEnvironmentAndIsCheckedTheSame) {
  EnvGuard g("MERIDIAN_ROUTING", "static");
  EXPECT_EQ(readKnobChoice(knobs::kRouting, "adaptive").value(), "adaptive");
  auto bad = readKnobChoice(knobs::kRouting, "adaptve");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "MERIDIAN_ROUTING='adaptve': not one of adaptive, static");
}

TEST(KnobsTest, BadChoiceIsOneMessageNamingTheKnobTheValueAndTheAllowedOnes) {
  EnvGuard g("MERIDIAN_ROUTING", "adaptve");
  auto v = readKnobChoice(knobs::kRouting);
  ASSERT_FALSE(v.isOk());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  const std::string message = "MERIDIAN_ROUTING='adaptve': not one of adaptive, static";
  EXPECT_EQ(v.status().message(), message);
  try {
    (void)knobChoice(knobs::kRouting);
    FAIL() << "knobChoice took a bad value";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), message) << "the throwing form says the same";
  }
}

TEST(KnobsTest, EveryChoiceKnobAllowsItsDefaultAndListsItsValues) {
  int choiceKnobs = 0;
  for (const auto& k : allKnobs()) {
    const auto choices = knobChoices(k);
    if (k.type != KnobType::kChoice) {
      EXPECT_TRUE(choices.empty()) << k.name;
      continue;
    }
    ++choiceKnobs;
    EXPECT_GE(choices.size(), 2u) << k.name;
    EXPECT_NE(std::find(choices.begin(), choices.end(), std::string(k.defaultValue)), choices.end())
        << k.name << "'s default " << k.defaultValue << " is not one of its values";
    EXPECT_NE(knobMarkdownTable().find(fmt::format("| `{}` | {} |", k.name, knobTypeName(k))), std::string::npos)
        << k.name << ": the table lists the allowed values";
  }
  EXPECT_GE(choiceKnobs, 5) << "routing, algo, relay, direct read and NCCL devices are enumerations";
}

// Regression (issue 26): MERIDIAN_TCP_SOCKBUF_BYTES=1 was taken, and every reader had a
// range of its own. Now the declaration carries the range, and every reader checks it.
TEST(KnobsTest, AValueOutsideTheDeclaredRangeIsRefusedNamingTheRange) {
  {
    EnvGuard g("MERIDIAN_TCP_SOCKBUF_BYTES", "1");
    auto v = readKnobInt(knobs::kTcpSockBufBytes);
    ASSERT_FALSE(v.isOk());
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(v.status().message(), "MERIDIAN_TCP_SOCKBUF_BYTES='1': not 0 or in [64k, 1g]");
    EXPECT_THROW(knobInt(knobs::kTcpSockBufBytes), ConfigError);
  }
  for (const char* ok : {"0", "64k", "4M", "1g"}) {
    EnvGuard g("MERIDIAN_TCP_SOCKBUF_BYTES", ok);
    EXPECT_TRUE(readKnobInt(knobs::kTcpSockBufBytes).isOk()) << ok;
  }
  for (const char* bad : {"-1", "65535", "2g"}) {
    EnvGuard g("MERIDIAN_TCP_SOCKBUF_BYTES", bad);
    EXPECT_FALSE(readKnobInt(knobs::kTcpSockBufBytes).isOk()) << bad;
  }
  const std::pair<const char*, const char*> refused[] = {
      {"MERIDIAN_TIMEOUT_MS", "0"},          {"MERIDIAN_PATH_STALL_MS", "1"},
      {"MERIDIAN_PROBE_INTERVAL_MS", "0"},   {"MERIDIAN_TCP_STREAMS", "0"},
      {"MERIDIAN_CHUNK_BYTES", "100"},       {"MERIDIAN_CHUNK_BYTES", "65m"},
      {"MERIDIAN_RING_SEGMENT_BYTES", "1"},  {"MERIDIAN_MAX_UNEXPECTED_BYTES", "0"},
      {"MERIDIAN_TCP_NOTSENT_LOWAT_BYTES", "1"}, {"MERIDIAN_LINK_STATE_INTERVAL_MS", "-5"},
  };
  for (const auto& [name, value] : refused) {
    EnvGuard g(name, value);
    const KnobInfo* knob = nullptr;
    for (const auto& k : allKnobs())
      if (std::string(k.name) == name) knob = &k;
    ASSERT_NE(knob, nullptr) << name;
    auto v = readKnobInt(*knob);
    ASSERT_FALSE(v.isOk()) << name << "=" << value;
    EXPECT_EQ(v.status().message(), fmt::format("{}='{}': not {}", name, value, knobRangeText(*knob)));
  }
}

TEST(KnobsTest, ACallersRangeNarrowsTheDeclaredOneAndNeverWidensIt) {
  EnvGuard g("MERIDIAN_TCP_STREAMS", "12");
  EXPECT_EQ(readKnobInt(knobs::kTcpStreams, 1, 8).status().message(), "MERIDIAN_TCP_STREAMS='12': not in [1, 8]");
  EnvGuard wide("MERIDIAN_TCP_STREAMS", "40");
  EXPECT_EQ(readKnobInt(knobs::kTcpStreams, 0, 100).status().message(), "MERIDIAN_TCP_STREAMS='40': not in [1, 16]");
  EnvGuard zero("MERIDIAN_TCP_SOCKBUF_BYTES", "0");
  EXPECT_FALSE(readKnobInt(knobs::kTcpSockBufBytes, 1, INT64_MAX).isOk()) << "a caller may rule out 0";
}

TEST(KnobsTest, EveryIntKnobHasARangeHoldingItsDefault) {
  for (const auto& k : allKnobs()) {
    if (k.type != KnobType::kInt) continue;
    EXPECT_LE(k.minValue, k.maxValue) << k.name;
    ::unsetenv(k.name);
    EXPECT_TRUE(readKnobInt(k).isOk()) << k.name << "'s default " << k.defaultValue << " is outside its range";
    EXPECT_NE(knobMarkdownTable().find(fmt::format("| `{}` | {} |", k.name, knobTypeName(k))), std::string::npos)
        << k.name << ": the table shows the range";
    const std::string_view name = k.name;
    if (name.ends_with("_TIMEOUT_MS") || name == "MERIDIAN_TIMEOUT_MS" || name.ends_with("_STALL_MS")) {
      EXPECT_GT(k.minValue, 0) << k.name << ": a timeout of 0 means nothing";
    }
  }
  EXPECT_EQ(knobTypeName(knobs::kTcpStreams), "int in [1, 16]");
  EXPECT_EQ(knobTypeName(knobs::kTcpSockBufBytes), "int, 0 or in [64k, 1g]");
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
