// The exporter: address parsing, the registry as a prometheus Collectable, the exposer.
#include "monitoring/exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include "core/knobs.h"
#include "core/scrape_targets.h"
#include "core/log.h"

namespace meridian::monitoring {

namespace {

sockaddr_in socketAddress(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// Why civetweb could not listen on `where` (its exception does not say): bind the same
// address ourselves and report the errno, e.g. "Address already in use".
std::string bindFailureReason(const std::string& ip, int port, const char* civetwebMessage) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return civetwebMessage;
  const int on = 1;
  // As civetweb does; without it the bind below may name another reason, which is all
  // this diagnosis can lose.
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  const sockaddr_in a = socketAddress(ip, port);
  std::string reason = civetwebMessage;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) reason = errnoText(errno);
  (void)::close(fd);  // a socket nothing went through
  return reason;
}

// Opens and drops a connection to the server: wakes civetweb's accept loop.
void knock(const sockaddr_in& server) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  (void)::connect(fd, reinterpret_cast<const sockaddr*>(&server), sizeof server);
  (void)::close(fd);  // the knock is the connection attempt itself
}

// Every scrape snapshots the registry afresh.
class RegistryCollectable final : public prometheus::Collectable {
 public:
  explicit RegistryCollectable(const MetricsRegistry& registry) : registry_(registry) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    try {
      return toPrometheusFamilies(registry_.snapshot());
    } catch (const std::exception& e) {  // never let an exception into civetweb's thread
      MLOG_WARN(kMonitoring, "metrics scrape failed: {}", e.what());
      return {};
    }
  }

 private:
  const MetricsRegistry& registry_;
};

}  // namespace

Result<std::optional<std::string>> metricsAddressFromEnv(int localRank) {
  MERIDIAN_ASSIGN_OR_RETURN(auto base, parseMetricsAddress(knobString(knobs::kMetricsAddr)));
  if (!base) return std::optional<std::string>();
  const std::int64_t port = base->second + std::int64_t{localRank < 0 ? 0 : localRank};
  if (port > 65535) {
    return invalidArgument("{} port {} plus local rank {} is past 65535: set a lower one", knobs::kMetricsAddr.name,
                           base->second, localRank);
  }
  return std::optional<std::string>(fmt::format("{}:{}", base->first, port));
}

MetricsExporter::MetricsExporter(std::shared_ptr<prometheus::Collectable> collectable,
                                 std::unique_ptr<prometheus::Exposer> exposer, std::string ip, int port)
    : collectable_(std::move(collectable)),
      exposer_(std::move(exposer)),
      endpoint_(fmt::format("{}:{}", ip, port)),
      ip_(std::move(ip)),
      port_(port) {}

// civetweb's accept loop notices a stop only when its poll of the listening socket
// returns, up to 2 s later when nobody connects: knock until the server has stopped.
MetricsExporter::~MetricsExporter() {
  std::atomic<bool> stopped{false};
  std::thread knocker;
  try {
    knocker = std::thread([this, &stopped] {
      const sockaddr_in server = socketAddress(ip_ == "0.0.0.0" ? "127.0.0.1" : ip_, port_);
      while (!stopped.load()) {
        knock(server);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  } catch (const std::exception&) {  // no thread: the stop just takes longer
  }
  exposer_.reset();
  stopped.store(true);
  if (knocker.joinable()) knocker.join();
}

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const std::string& address, MetricsRegistry& registry,
                                                                std::chrono::milliseconds requestTimeout) {
  auto where = parseHostPort(address, /*allowPortZero=*/true);
  if (!where) return invalidArgument("metrics address {}: {}", address, where.status().message());
  const std::string listen = fmt::format("{}:{}", where->first, where->second);
  auto collectable = std::make_shared<RegistryCollectable>(registry);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Options civetweb 1.15 (Debian's, under prometheus-cpp 1.0) takes as given; an unknown
    // one fails the start. request_timeout_ms bounds the wait for a request's headers from
    // when a thread takes the connection, however slowly the bytes trickle in, and each
    // write of the response; keep-alive stays off, so a connection is one request.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", std::to_string(kMetricsServerThreads), "request_timeout_ms",
        std::to_string(requestTimeout.count()), "enable_keep_alive", "no"});
  } catch (const std::exception& e) {  // civetweb's CivetException (a runtime_error) when it cannot bind
    return invalidArgument("metrics address {}: cannot listen: {}", address, bindFailureReason(where->first, where->second, e.what()));
  }
  exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return invalidArgument("metrics address {}: the server reports no listening port", address);
  }
  return std::unique_ptr<MetricsExporter>(
      new MetricsExporter(std::move(collectable), std::move(exposer), where->first, ports.front()));
}

std::unique_ptr<MetricsExporter> startExporterFromEnv(int localRank) {
  try {
    auto address = metricsAddressFromEnv(localRank);
    if (!address) {
      MLOG_WARN(kMonitoring, "metrics off: {}", address.status().message());
      return nullptr;
    }
    if (!address.value()) {
      MLOG_DEBUG(kMonitoring, "metrics off: {}=0", knobs::kMetricsAddr.name);
      return nullptr;
    }
    auto exporter = MetricsExporter::start(*address.value());
    if (!exporter) {
      MLOG_WARN(kMonitoring, "metrics off: {}", exporter.status().message());
      return nullptr;
    }
    MLOG_INFO(kMonitoring, "metrics on http://{}/metrics", exporter.value()->endpoint());
    return std::move(exporter).value();
  } catch (const std::exception& e) {
    MLOG_WARN(kMonitoring, "metrics off: {}", e.what());
    return nullptr;
  }
}

}  // namespace meridian::monitoring
