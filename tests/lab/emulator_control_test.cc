// The emulator's control requests (status, set, restore and their errors), without TUN
// devices: the same handler serves the control socket.
#include <gtest/gtest.h>

#include "lab/emulator.h"

namespace meridian::lab {
namespace {

Topology twoRegions() {
  auto t = parseTopology(R"(
name: t
regions:
  - {name: east, nodes: 1}
  - {name: west, nodes: 1}
planes:
  - name: wan-a
    default: {rate: 100Mbit}
    intra: {delay: 500us}
    links:
      - {between: [east, west], delay: 20ms}
)",
                         "inline.yaml");
  EXPECT_TRUE(t.isOk()) << t.status().message();
  return t.value();
}

const nlohmann::json* findLink(const nlohmann::json& status, const std::string& src, const std::string& dst) {
  for (const auto& l : status["links"]) {
    if (l["src"] == src && l["dst"] == dst) return &l;
  }
  return nullptr;
}

TEST(EmulatorControlTest, StatusListsEveryLinkWithItsParameters) {
  Emulator emu(twoRegions(), {}, UniqueFd());
  auto s = emu.handle({{"cmd", "status"}});
  ASSERT_TRUE(s.value("ok", false)) << s.dump();
  EXPECT_EQ(s["links"].size(), 4u);  // one plane, 2 x 2 region pairs
  const auto* ew = findLink(s, "east", "west");
  ASSERT_NE(ew, nullptr);
  EXPECT_DOUBLE_EQ((*ew)["delay_us"].get<double>(), 20'000);
  EXPECT_DOUBLE_EQ((*ew)["rate_bps"].get<double>(), 100e6);
  const auto* ee = findLink(s, "east", "east");
  ASSERT_NE(ee, nullptr);
  EXPECT_DOUBLE_EQ((*ee)["delay_us"].get<double>(), 500);
}

TEST(EmulatorControlTest, SetChangesBothDirectionsOrOneAndRestoreUndoes) {
  Emulator emu(twoRegions(), {}, UniqueFd());
  auto r = emu.handle({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"},
                       {"change", {{"delay_us", 80'000}, {"loss", 0.01}}}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  auto s = emu.handle({{"cmd", "status"}});
  EXPECT_DOUBLE_EQ((*findLink(s, "east", "west"))["delay_us"].get<double>(), 80'000);
  EXPECT_DOUBLE_EQ((*findLink(s, "west", "east"))["delay_us"].get<double>(), 80'000);
  EXPECT_DOUBLE_EQ((*findLink(s, "west", "east"))["loss"].get<double>(), 0.01);
  EXPECT_DOUBLE_EQ((*findLink(s, "west", "east"))["rate_bps"].get<double>(), 100e6) << "untouched fields stay";

  r = emu.handle({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "west"}, {"dst", "east"}, {"both", false},
                  {"change", {{"cut", true}}}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  s = emu.handle({{"cmd", "status"}});
  EXPECT_TRUE((*findLink(s, "west", "east"))["cut"].get<bool>());
  EXPECT_FALSE((*findLink(s, "east", "west"))["cut"].get<bool>());

  r = emu.handle({{"cmd", "restore"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}});
  ASSERT_TRUE(r.value("ok", false)) << r.dump();
  s = emu.handle({{"cmd", "status"}});
  for (const char* dir : {"east", "west"}) {
    const auto& l = *findLink(s, dir, dir[0] == 'e' ? "west" : "east");
    EXPECT_DOUBLE_EQ(l["delay_us"].get<double>(), 20'000);
    EXPECT_FALSE(l["cut"].get<bool>());
    EXPECT_DOUBLE_EQ(l["loss"].get<double>(), 0);
  }
}

TEST(EmulatorControlTest, BadRequestsAreRefusedWithAReason) {
  Emulator emu(twoRegions(), {}, UniqueFd());
  auto expectError = [&](const nlohmann::json& req, const std::string& needle) {
    auto r = emu.handle(req);
    EXPECT_FALSE(r.value("ok", true)) << req.dump();
    EXPECT_NE(r.value("error", "").find(needle), std::string::npos) << r.dump();
  };
  expectError({{"cmd", "fly"}}, "unknown command");
  expectError({{"cmd", "set"}, {"plane", "wan-z"}, {"src", "east"}, {"dst", "west"}, {"change", {{"delay_us", 1}}}},
              "wan-z");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "paris"}, {"dst", "west"}, {"change", {{"delay_us", 1}}}},
              "paris");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}}, "change");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"speed", 1}}}},
              "speed");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"loss", 2}}}},
              "loss");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"delay_us", -5}}}},
              "delay_us");
  expectError({{"cmd", "restore"}, {"plane", "wan-a"}}, "src");
  expectError({{"cmd", 1}}, "cmd");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"both", "no"},
               {"change", {{"delay_us", 1}}}},
              "both");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"delay_us", 1e17}}}},
              "at most");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"queue_bytes", 1e20}}}},
              "at most");
  expectError({{"cmd", "set"}, {"plane", "wan-a"}, {"src", "east"}, {"dst", "west"}, {"change", {{"rate_bps", 1e-9}}}},
              "rate_bps");
  // Nothing above changed a link.
  auto s = emu.handle({{"cmd", "status"}});
  EXPECT_DOUBLE_EQ((*findLink(s, "east", "west"))["delay_us"].get<double>(), 20'000);
}

}  // namespace
}  // namespace meridian::lab
