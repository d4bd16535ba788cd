// InfiniBand port figures: the decoding on values real ports report (IBTA's tables, as
// ibv_devinfo prints them), and the listing on this host.
#include <gtest/gtest.h>

#include "transport/fabric/ib_ports.h"

namespace meridian::transport::fabric {
namespace {

TEST(IbPortRateTest, DecodesWhatRealPortsReport) {
  struct Case {
    std::uint8_t width, speed;
    int lanes;
    double gbps;
    const char* text;
  };
  const Case cases[] = {
      {2, 128, 4, 400, "4x NDR (400 Gbit/s)"},   // ConnectX-7, NDR
      {2, 64, 4, 200, "4x HDR (200 Gbit/s)"},    // ConnectX-6, HDR
      {16, 64, 2, 100, "2x HDR (100 Gbit/s)"},   // HDR100 split port
      {2, 32, 4, 100, "4x EDR (100 Gbit/s)"},    // ConnectX-5, EDR
      {2, 16, 4, 56, "4x FDR (56 Gbit/s)"},
      {2, 8, 4, 40, "4x FDR10 (40 Gbit/s)"},
      {2, 4, 4, 40, "4x QDR (40 Gbit/s)"},
      {8, 32, 12, 300, "12x EDR (300 Gbit/s)"},
      {1, 1, 1, 2.5, "1x SDR (2.5 Gbit/s)"},
      {4, 2, 8, 40, "8x DDR (40 Gbit/s)"},
  };
  for (const Case& c : cases) {
    const PortRate r = decodePortRate(c.width, c.speed);
    EXPECT_TRUE(r.known());
    EXPECT_EQ(r.lanes, c.lanes);
    EXPECT_DOUBLE_EQ(r.gbps(), c.gbps);
    EXPECT_EQ(r.text(), c.text);
  }
}

TEST(IbPortRateTest, SaysUnknownInsteadOfGuessing) {
  EXPECT_FALSE(decodePortRate(0, 0).known());
  EXPECT_EQ(decodePortRate(0, 0).text(), "unknown (width 0x0, speed 0x0)");
  EXPECT_FALSE(decodePortRate(2, 0).known()) << "no speed bit: XDR on rdma-core 44 reads so";
  EXPECT_FALSE(decodePortRate(32, 128).known()) << "a width bit IBTA does not define";
  // More than one bit set: the lowest counts (what the port runs at, as NCCL reads it).
  EXPECT_EQ(decodePortRate(2 | 1, 128 | 64).lanes, 1);
  EXPECT_DOUBLE_EQ(decodePortRate(2 | 1, 128 | 64).laneGbps, 50);
}

TEST(IbPortsTest, ListsEveryPortOfThisHost) {
  auto ports = listIbPorts();
  ASSERT_TRUE(ports.isOk()) << ports.status().toString();
  if (ports->empty()) GTEST_SKIP() << "no InfiniBand or RoCE device on this host (libibverbs lists none)";
  for (const auto& p : ports.value()) {
    EXPECT_FALSE(p.device.empty());
    EXPECT_GE(p.port, 1);
    if (p.active) {
      EXPECT_TRUE(p.rate.known()) << p.text();
    }
    std::printf("[ ib       ] %s\n", p.text().c_str());
  }
}

}  // namespace
}  // namespace meridian::transport::fabric
