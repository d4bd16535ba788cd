// The exporter: a live /metrics over real HTTP, address resolution from the environment,
// and failures that are reported, never thrown.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/fd.h"
#include "monitoring/exporter.h"
#include "tests/common/poll.h"

namespace meridian::monitoring {
namespace {

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (value) {
      ::setenv("MERIDIAN_METRICS_ADDR", value, 1);
    } else {
      ::unsetenv("MERIDIAN_METRICS_ADDR");
    }
  }
  ~EnvGuard() { ::unsetenv("MERIDIAN_METRICS_ADDR"); }
};

// A TCP connection to "ip:port"; invalid when it cannot connect.
UniqueFd connectTo(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  if (::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &addr.sin_addr) != 1) return {};
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) return {};
  return fd;
}

bool sendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// GET `path` from "ip:port" over a plain TCP socket (HTTP/1.0: the server closes when
// done); returns the whole response, or "" when the request fails.
std::string httpGet(const std::string& endpoint, const std::string& path) {
  UniqueFd fd = connectTo(endpoint);
  if (!fd.valid()) return "";
  timeval timeout{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string response;
  if (sendAll(fd.get(), "GET " + path + " HTTP/1.0\r\nHost: " + endpoint + "\r\n\r\n")) {
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0) response.append(buf, static_cast<std::size_t>(n));
  }
  return response;
}

// `count` clients that connect and send half a request, then nothing (stalled or hostile
// scrapers); empty when one cannot.
std::vector<UniqueFd> stalledClients(const std::string& endpoint, int count) {
  std::vector<UniqueFd> clients;
  for (int i = 0; i < count; ++i) {
    UniqueFd fd = connectTo(endpoint);
    // No blank line: the request never ends.
    if (!fd.valid() || !sendAll(fd.get(), "GET /metrics HTTP/1.1\r\nHost: " + endpoint + "\r\n")) return {};
    clients.push_back(std::move(fd));
  }
  return clients;
}

// Scrapes until a scrape succeeds or `deadline` passes; true on success.
bool scrapeBy(const std::string& endpoint, TimePoint deadline) {
  return testing::pollUntil([&] { return httpGet(endpoint, "/metrics").rfind("HTTP/1.1 200", 0) == 0; }, deadline,
                            std::chrono::milliseconds(20));
}

TEST(ExporterTest, ServesTheRegistryLiveOnMetrics) {
  MetricsRegistry r;
  r.counter("meridian_test_before_total", "recorded before start").add(5);
  auto exporter = MetricsExporter::start("127.0.0.1:0", r);
  ASSERT_TRUE(exporter.isOk()) << exporter.status().toString();
  const std::string endpoint = exporter.value()->endpoint();
  EXPECT_EQ(endpoint.rfind("127.0.0.1:", 0), 0u) << endpoint;
  EXPECT_NE(endpoint, "127.0.0.1:0");

  r.gauge("meridian_test_after", "recorded after start", {{"path", "1"}}).set(3.5);
  const std::string response = httpGet(endpoint, "/metrics");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("\r\n\r\n# HELP"), std::string::npos) << response;
  EXPECT_NE(response.find("\nmeridian_test_before_total 5\n"), std::string::npos) << response;
  EXPECT_NE(response.find("\nmeridian_test_after{path=\"1\"} 3.5\n"), std::string::npos) << response;

  r.counter("meridian_test_before_total", "recorded before start").add(1);
  EXPECT_NE(httpGet(endpoint, "/metrics").find("\nmeridian_test_before_total 6\n"), std::string::npos);
}

// Regression (issue 26): with two server threads, two half-finished requests stopped every
// scrape until they were closed. Now a stalled client holds a thread for the request timeout
// at most, and there are threads to spare.
TEST(ExporterTest, StalledClientsDoNotStopAScrape) {
  MetricsRegistry r;
  r.counter("meridian_test_total", "scraped").add(1);
  auto exporter = MetricsExporter::start("127.0.0.1:0", r);
  ASSERT_TRUE(exporter.isOk()) << exporter.status().toString();
  const std::string endpoint = exporter.value()->endpoint();
  const std::vector<UniqueFd> stalled = stalledClients(endpoint, kMetricsServerThreads);
  ASSERT_FALSE(stalled.empty());
  // Every thread may be held by a stalled client: the scrape waits one request timeout at most.
  const TimePoint start = Clock::now();
  EXPECT_TRUE(scrapeBy(endpoint, start + kMetricsRequestTimeout + std::chrono::seconds(10)))
      << kMetricsServerThreads << " stalled clients stopped the scrapes";
}

TEST(ExporterTest, MoreStalledClientsThanThreadsDelayAScrapeByTheRequestTimeoutsOnly) {
  MetricsRegistry r;
  constexpr auto kTimeout = std::chrono::milliseconds(300);
  auto exporter = MetricsExporter::start("127.0.0.1:0", r, kTimeout);
  ASSERT_TRUE(exporter.isOk()) << exporter.status().toString();
  const std::string endpoint = exporter.value()->endpoint();
  // Three rounds of them ahead of the scrape.
  const std::vector<UniqueFd> stalled = stalledClients(endpoint, 2 * kMetricsServerThreads + 4);
  ASSERT_FALSE(stalled.empty());
  EXPECT_TRUE(scrapeBy(endpoint, Clock::now() + std::chrono::seconds(10)));
}

TEST(ExporterTest, TheServerDropsARequestThatNeverEnds) {
  MetricsRegistry r;
  auto exporter = MetricsExporter::start("127.0.0.1:0", r, std::chrono::milliseconds(300));
  ASSERT_TRUE(exporter.isOk()) << exporter.status().toString();
  const std::vector<UniqueFd> stalled = stalledClients(exporter.value()->endpoint(), 1);
  ASSERT_EQ(stalled.size(), 1u);
  const UniqueFd& client = stalled.front();
  timeval wait{0, 50'000};
  ASSERT_EQ(::setsockopt(client.get(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait), 0);
  // The server answers an error or nothing, then closes: recv reaches end of stream.
  EXPECT_TRUE(testing::pollUntil(
      [&] {
        char buf[512];
        const ssize_t n = ::recv(client.get(), buf, sizeof buf, 0);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      },
      std::chrono::seconds(10), std::chrono::milliseconds(0)))
      << "a half request held its connection open";
}

TEST(ExporterTest, ABusyPortIsAnInvalidArgumentNamingTheAddress) {
  MetricsRegistry r;
  auto first = MetricsExporter::start("127.0.0.1:0", r);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  const std::string taken = first.value()->endpoint();
  auto second = MetricsExporter::start(taken, r);
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("metrics address " + taken + ": "), std::string::npos)
      << second.status().toString();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().toString();
}

TEST(ExporterTest, StartRefusesBadAddresses) {
  MetricsRegistry r;
  for (const char* bad : {"1.2.3", "host:99999", ":", "1.2.3.4:65536", "1.2.3.4:-1", "example.com:80"}) {
    auto e = MetricsExporter::start(bad, r);
    ASSERT_FALSE(e.isOk()) << bad;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e.status().message().rfind(std::string("metrics address ") + bad + ": ", 0), 0u) << e.status().toString();
  }
}

TEST(ExporterTest, AddressDefaultsToLoopbackAndTheLocalRank) {
  EnvGuard env(nullptr);
  auto a = metricsAddressFromEnv(-1);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  EXPECT_EQ(a.value(), "127.0.0.1:9400");
  EXPECT_EQ(metricsAddressFromEnv(3).value(), "127.0.0.1:9403");
  EnvGuard empty("");
  EXPECT_EQ(metricsAddressFromEnv(0).value(), "127.0.0.1:9400");
  EXPECT_FALSE(metricsAddressFromEnv(60000).isOk());  // past 65535: a clear error, not a wrap
}

TEST(ExporterTest, AddressFromTheEnvironment) {
  {
    EnvGuard env("0");
    auto a = metricsAddressFromEnv(2);
    ASSERT_TRUE(a.isOk()) << a.status().toString();
    EXPECT_FALSE(a.value().has_value());
  }
  const std::pair<const char*, const char*> good[] = {
      {"10.1.2.3:9500", "10.1.2.3:9500"}, {"localhost:1", "127.0.0.1:1"}, {"*:9400", "0.0.0.0:9400"},
      {"0.0.0.0:65535", "0.0.0.0:65535"}};
  for (const auto& [given, resolved] : good) {
    EnvGuard env(given);
    auto a = metricsAddressFromEnv(0);
    ASSERT_TRUE(a.isOk()) << given << ": " << a.status().toString();
    EXPECT_EQ(a.value(), resolved);
  }
  {
    // A given address is local rank 0's; the others count up from its port.
    EnvGuard env("10.1.2.3:9500");
    EXPECT_EQ(metricsAddressFromEnv(2).value(), "10.1.2.3:9502");
    EnvGuard top("10.1.2.3:65535");
    EXPECT_FALSE(metricsAddressFromEnv(1).isOk());
  }
  for (const char* bad : {"1.2.3", "host:99999", ":", "1.2.3.4:0", "1.2.3.4:", "256.1.1.1:80", "1.2.3.4:80x",
                          " 1.2.3.4:80", "9400"}) {
    EnvGuard env(bad);
    auto a = metricsAddressFromEnv(0);
    ASSERT_FALSE(a.isOk()) << bad;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(std::string("MERIDIAN_METRICS_ADDR='") + bad + "'"), std::string::npos)
        << a.status().toString();
  }
}

TEST(ExporterTest, FromEnvNeverThrowsAndReturnsNullOnFailure) {
  auto busy = MetricsExporter::start("127.0.0.1:0", MetricsRegistry::global());
  ASSERT_TRUE(busy.isOk()) << busy.status().toString();
  {
    EnvGuard env(busy.value()->endpoint().c_str());
    std::unique_ptr<MetricsExporter> e;
    EXPECT_NO_THROW(e = startExporterFromEnv(0));
    EXPECT_TRUE(e == nullptr);
  }
  {
    EnvGuard env("not-an-address");
    EXPECT_TRUE(startExporterFromEnv(0) == nullptr);
  }
  {
    EnvGuard env("0");
    EXPECT_TRUE(startExporterFromEnv(0) == nullptr);
  }
}

TEST(ExporterTest, FromEnvStartsOnAFreeAddress) {
  // Find a free port by starting on 0 and stopping again, then ask for it by name.
  std::string endpoint;
  {
    auto probe = MetricsExporter::start("127.0.0.1:0", MetricsRegistry::global());
    ASSERT_TRUE(probe.isOk()) << probe.status().toString();
    endpoint = probe.value()->endpoint();
  }
  EnvGuard env(endpoint.c_str());
  auto e = startExporterFromEnv(0);
  ASSERT_TRUE(e != nullptr);
  EXPECT_EQ(e->endpoint(), endpoint);
  EXPECT_NE(httpGet(endpoint, "/metrics").find("HTTP/1.1 200"), std::string::npos);
}

}  // namespace
}  // namespace meridian::monitoring
