// The rail names two ranks swap to pair their fabric rails, and the tags of the paths
// between them: round trips, every malformed list refused with the reason, tags apart.
#include <gtest/gtest.h>

#include <set>

#include "transport/fabric/choose.h"
#include "transport/fabric/link.h"

namespace meridian::transport::fabric {
namespace {

RailName name(std::size_t bytes, std::uint8_t fill) { return RailName(bytes, fill); }

TEST(RailNamesTest, RoundTripsUpToTheBound) {
  std::vector<RailName> names;
  for (std::size_t i = 0; i < kMaxRails; ++i) names.push_back(name(i == 0 ? 1 : kMaxRailNameBytes - i, static_cast<std::uint8_t>(i)));
  auto bytes = encodeRailNames(names);
  ASSERT_TRUE(bytes.isOk()) << bytes.status().toString();
  EXPECT_LE(bytes->size(), kMaxPathNamesBytes);
  auto back = decodeRailNames(bytes.value());
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value(), names);
  auto none = encodeRailNames({});
  ASSERT_TRUE(none.isOk());
  EXPECT_TRUE(decodeRailNames(none.value())->empty());
}

TEST(RailNamesTest, RefusesWhatItCannotSend) {
  std::vector<RailName> tooMany(kMaxRails + 1, name(16, 1));
  EXPECT_EQ(encodeRailNames(tooMany).status().code(), StatusCode::kInvalidArgument);
  std::vector<RailName> empty{RailName{}};
  EXPECT_EQ(encodeRailNames(empty).status().code(), StatusCode::kInvalidArgument);
  std::vector<RailName> tooLong{name(kMaxRailNameBytes + 1, 2)};
  EXPECT_EQ(encodeRailNames(tooLong).status().code(), StatusCode::kInvalidArgument);
}

TEST(RailNamesTest, RefusesMalformedListsWithThePeerToBlame) {
  std::vector<RailName> two{name(16, 1), name(28, 2)};
  const auto good = encodeRailNames(two).value();
  auto expectRefused = [](std::vector<std::uint8_t> bytes, const char* what) {
    auto r = decodeRailNames(bytes);
    ASSERT_FALSE(r.isOk()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kPeerError) << what;
    EXPECT_NE(r.status().message().find("fabric rail name"), std::string::npos) << r.status().message();
  };
  expectRefused({}, "empty");
  expectRefused({static_cast<std::uint8_t>(kMaxRails + 1)}, "count over the bound");
  auto truncated = good;
  truncated.pop_back();
  expectRefused(truncated, "a name cut short");
  auto trailing = good;
  trailing.push_back(0);
  expectRefused(trailing, "bytes after the last name");
  auto zeroLength = good;
  zeroLength[1] = 0;
  zeroLength[2] = 0;
  expectRefused(zeroLength, "a name of length 0");
  auto hugeLength = good;
  hugeLength[1] = 0xff;
  hugeLength[2] = 0xff;
  expectRefused(hugeLength, "a length over the bound");
  auto noLength = std::vector<std::uint8_t>{1, 16};
  expectRefused(noLength, "a length cut short");
}

TEST(FabricPathTagTest, TagsDifferByDirectionPathSessionInitiatorAndSecretAndFitTheTagBits) {
  const RailName a = name(16, 0xa), b = name(16, 0xb);
  std::set<std::uint64_t> tags;
  const std::uint64_t base = fabricPathTag("s", 1, 0, 0, a, b);
  for (std::uint64_t t : {base, fabricPathTag("s", 1, 0, 0, b, a), fabricPathTag("s", 1, 0, 1, a, b),
                          fabricPathTag("s", 2, 0, 0, a, b), fabricPathTag("s", 1, 3, 0, a, b),
                          fabricPathTag("t", 1, 0, 0, a, b)}) {
    EXPECT_LT(t, std::uint64_t{1} << kMinTagBits);
    tags.insert(t);
  }
  EXPECT_EQ(tags.size(), 6u) << "two paths share a tag";
  EXPECT_EQ(base, fabricPathTag("s", 1, 0, 0, a, b)) << "both ends must compute the same tag";
}

TEST(ChooseFabricProviderTest, AutoTakesRdmaOnlyAndOnTakesTheBestPresent) {
  const std::vector<std::string> here{"shm", "tcp;ofi_rxm"};  // this machine
  const std::vector<std::string> ib{"shm", "tcp;ofi_rxm", "verbs;ofi_rxm"};
  auto pick = [](std::string_view mode, std::string_view named, const std::vector<std::string>& present) {
    auto c = chooseFabricProvider(mode, named, present);
    EXPECT_TRUE(c.isOk()) << c.status().toString();
    return c.isOk() ? c->provider : std::string("<error>");
  };
  EXPECT_EQ(pick("auto", "", here), "") << "no RDMA here: TCP only";
  EXPECT_EQ(pick("auto", "", ib), "verbs;ofi_rxm");
  EXPECT_EQ(pick("auto", "", {"efa", "shm"}), "efa");
  EXPECT_EQ(pick("auto", "tcp;ofi_rxm", here), "") << "auto leaves a named non-RDMA provider alone";
  EXPECT_EQ(pick("auto", "efa", here), "efa") << "a named RDMA provider is tried (opening it says it is absent)";
  EXPECT_EQ(pick("on", "", here), "tcp;ofi_rxm");
  EXPECT_EQ(pick("on", "", ib), "verbs;ofi_rxm");
  EXPECT_EQ(pick("on", "", {"shm"}), "shm");
  EXPECT_EQ(pick("on", "shm", ib), "shm");
  EXPECT_EQ(pick("off", "verbs;ofi_rxm", ib), "");
  auto why = chooseFabricProvider("auto", "", here);
  ASSERT_TRUE(why.isOk());
  EXPECT_NE(why->why.find("offers: shm,tcp;ofi_rxm"), std::string::npos) << "say what is there: " << why->why;
}

TEST(ChooseFabricProviderTest, OnWithNothingPresentAndAnUnknownModeAreErrors) {
  auto none = chooseFabricProvider("on", "", {});
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  auto bad = chooseFabricProvider("yes", "", {"shm"});
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("auto, on, off"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace meridian::transport::fabric
