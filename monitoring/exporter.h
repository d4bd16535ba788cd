// Every rank serves Meridian's metrics registry on http://<address>/metrics through
// prometheus-cpp's exposer (civetweb); each scrape snapshots the registry afresh.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/metrics.h"
#include "core/status.h"
#include "monitoring/exposition.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace meridian::monitoring {

// MERIDIAN_METRICS_ADDR resolved for local rank r: unset or empty -> 127.0.0.1 and port
// 9400 + r (core/scrape_targets.h, kMetricsBasePort); "host:port" -> that host and port + r
// (host an IPv4 dotted quad, "localhost", "*" or "0.0.0.0"; port 1..65535); "0" ->
// std::nullopt (metrics off); anything else kInvalidArgument naming the variable and value.
Result<std::optional<std::string>> metricsAddressFromEnv(int localRank);

// Server threads: how many clients are served at once. A client that connects and sends
// nothing (or half a request) holds one for at most kMetricsRequestTimeout, so a few slow
// or hostile clients delay a scrape by that much at worst and never stop scrapes.
inline constexpr int kMetricsServerThreads = 8;
// How long the server waits for a whole request, and for a client to take a response
// (civetweb's request_timeout_ms). A scrape's request is one small packet: plenty even
// across regions.
inline constexpr std::chrono::milliseconds kMetricsRequestTimeout{3000};

class MetricsExporter {
 public:
  // Serves `registry` (which must outlive the exporter) on http://address/metrics.
  // address: host:port as for MERIDIAN_METRICS_ADDR, where port 0 lets the kernel choose.
  // A bad address or one that cannot be bound (port in use) -> kInvalidArgument
  // "metrics address <address>: <reason>". requestTimeout: as kMetricsRequestTimeout
  // (tests shorten it).
  static Result<std::unique_ptr<MetricsExporter>> start(const std::string& address,
                                                        MetricsRegistry& registry = MetricsRegistry::global(),
                                                        std::chrono::milliseconds requestTimeout = kMetricsRequestTimeout);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // "ip:port" actually bound (the chosen port when started on port 0).
  std::string endpoint() const { return endpoint_; }

 private:
  MetricsExporter(std::shared_ptr<prometheus::Collectable> collectable, std::unique_ptr<prometheus::Exposer> exposer,
                  std::string ip, int port);

  std::shared_ptr<prometheus::Collectable> collectable_;  // declared first: outlives the server
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string endpoint_;  // ip_:port_
  std::string ip_;
  int port_ = 0;
};

// For executables: resolves MERIDIAN_METRICS_ADDR and starts an exporter of the global
// registry. Any failure logs one WARN "metrics off: <reason>" and returns nullptr (a
// metrics problem never stops training); success logs INFO "metrics on
// http://<endpoint>/metrics". Also nullptr when MERIDIAN_METRICS_ADDR=0.
std::unique_ptr<MetricsExporter> startExporterFromEnv(int localRank);

}  // namespace meridian::monitoring
