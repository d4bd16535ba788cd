// Plan announcements: round trip (shared plans written once), and every malformed or
// ill-fitting announcement rejected before it could reach an executor.
#include "routing/plan_codec.h"

#include <string>

#include <gtest/gtest.h>

namespace meridian::routing {
namespace {

std::span<const std::uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

PlanAnnouncement sample() {
  PlanAnnouncement a;
  a.epoch = 7;
  a.nextCheckpoint = 1234;
  a.reason = "links changed";
  PlanTable t;
  Plan ring;
  ring.ringOrder = {3, 0, 1, 2};
  Plan hier;
  hier.algorithm = Algorithm::kHierarchical;
  hier.groups = {{0, 1}, {3, 2}};
  hier.crossOrder = {1, 0};
  Plan ps;
  ps.algorithm = Algorithm::kParameterServer;
  ps.root = 2;
  t.classBytes = {1024, 2048, 4096, 8192};
  t.plans = {ring, ring, hier, ps};
  a.table = t;
  return a;
}

TEST(PlanCodecTest, RoundTripsAndWritesSharedPlansOnce) {
  const PlanAnnouncement a = sample();
  const auto bytes = encodeAnnouncement(a);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_EQ(text.find("[3,0,1,2]"), text.rfind("[3,0,1,2]")) << text;
  auto back = decodeAnnouncement(bytes, 4);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value().epoch, 7u);
  EXPECT_EQ(back.value().nextCheckpoint, 1234u);
  EXPECT_EQ(back.value().reason, "links changed");
  ASSERT_TRUE(back.value().table.has_value());
  EXPECT_EQ(back.value().table->classBytes, a.table->classBytes);
  EXPECT_EQ(back.value().table->plans[1].ringOrder, (std::vector<int>{3, 0, 1, 2}));
  EXPECT_EQ(back.value().table->plans[2].groups, a.table->plans[2].groups);
  EXPECT_EQ(back.value().table->plans[3].root, 2);
  // An epoch confirmed without its table, and the built-in epoch 0.
  PlanAnnouncement confirm{7, 2000, std::nullopt, "same"};
  EXPECT_TRUE(decodeAnnouncement(encodeAnnouncement(confirm), 4).isOk());
  PlanAnnouncement builtin{0, 5, std::nullopt, ""};
  EXPECT_TRUE(decodeAnnouncement(encodeAnnouncement(builtin), 4).isOk());
}

TEST(PlanCodecTest, RejectsPlansThatDoNotFitTheCommunicator) {
  const auto bytes = encodeAnnouncement(sample());
  EXPECT_FALSE(decodeAnnouncement(bytes, 3).isOk()) << "rank 3 does not exist";
  EXPECT_FALSE(decodeAnnouncement(bytes, 5).isOk()) << "orders must cover all 5 ranks";
  PlanAnnouncement a = sample();
  a.table->plans[0].ringOrder = {0, 0, 1, 2};
  EXPECT_FALSE(decodeAnnouncement(encodeAnnouncement(a), 4).isOk());
  a = sample();
  a.table->classBytes = {1024, 1024, 4096, 8192};
  EXPECT_FALSE(decodeAnnouncement(encodeAnnouncement(a), 4).isOk()) << "class sizes must increase";
  a = sample();
  a.epoch = 0;
  EXPECT_FALSE(decodeAnnouncement(encodeAnnouncement(a), 4).isOk()) << "a table needs an epoch";
}

TEST(PlanCodecTest, RejectsMalformedText) {
  const char* bad[] = {
      "",
      "null",
      R"({"e":1,"n":2})",
      R"({"e":-1,"n":2,"why":""})",
      R"({"e":1,"n":2,"why":"","t":{"p":[],"c":[]}})",
      R"({"e":1,"n":2,"why":"","t":{"p":[],"c":[[1024,0]]}})",
      R"({"e":1,"n":2,"why":"","t":{"p":[{"a":9,"o":[],"g":[],"x":[],"r":0,"s":0}],"c":[[1024,0]]}})",
      R"({"e":1,"n":2,"why":"","t":{"p":[{"a":0,"o":[],"g":[],"x":[],"r":0}],"c":[[1024,0]]}})",
      R"({"e":1,"n":2,"why":"","t":{"p":[{"a":0,"o":[0,"1"],"g":[],"x":[],"r":0,"s":0}],"c":[[1024,0]]}})",
      R"({"e":1,"n":2,"why":"","t":{"p":[{"a":0,"o":[],"g":[],"x":[],"r":0,"s":0}],"c":[[1024,1]]}})",
  };
  for (const char* text : bad) EXPECT_FALSE(decodeAnnouncement(bytesOf(text), 2).isOk()) << text;
  EXPECT_TRUE(decodeAnnouncement(
                  bytesOf(R"({"e":1,"n":2,"why":"","t":{"p":[{"a":0,"o":[],"g":[],"x":[],"r":0,"s":0}],"c":[[1024,0]]}})"), 2)
                  .isOk());
  EXPECT_FALSE(decodeAnnouncement(std::vector<std::uint8_t>(kMaxAnnouncementBytes + 1, ' '), 2).isOk());
  EXPECT_FALSE(decodeAnnouncement(bytesOf(std::string(300000, '[')), 2).isOk());
}

}  // namespace
}  // namespace meridian::routing
