// The one host:port splitter every layer uses (store, peers, probe endpoints, metrics).
#include "core/host_port.h"

#include <gtest/gtest.h>

namespace meridian {
namespace {

TEST(HostPortTest, SplitsAtTheLastColonAndKeepsTheHostAsWritten) {
  auto a = splitHostPort("10.0.0.1:29400");
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 29400);
  EXPECT_EQ(a->toString(), "10.0.0.1:29400");
  auto name = splitHostPort("node-7.cluster:0");  // a name and the kernel-chosen port
  ASSERT_TRUE(name.isOk());
  EXPECT_EQ(name->host, "node-7.cluster");
  EXPECT_EQ(name->port, 0);
  EXPECT_EQ(splitHostPort("a:b:65535")->host, "a:b");
}

TEST(HostPortTest, GarbageIsAnInvalidArgumentQuotingTheText) {
  for (const char* bad : {"", "9400", ":80", "host:", "host:8x", "host:-1", "host:65536", "host:99999999999999999999"}) {
    auto r = splitHostPort(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace meridian
