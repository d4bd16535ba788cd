// The exporter: address parsing, the registry as a prometheus Collectable, the exposer.
#include "monitoring/exporter.h"

#include <arpa/inet.h>

#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include "core/knobs.h"
#include "core/scrape_targets.h"
#include "core/log.h"

namespace meridian::monitoring {

namespace {

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
                                 std::unique_ptr<prometheus::Exposer> exposer, std::string endpoint)
    : collectable_(std::move(collectable)), exposer_(std::move(exposer)), endpoint_(std::move(endpoint)) {}

MetricsExporter::~MetricsExporter() = default;  // stops the server (joining its threads) first

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const std::string& address, MetricsRegistry& registry) {
  auto where = parseHostPort(address, /*allowPortZero=*/true);
  if (!where) return invalidArgument("metrics address {}: {}", address, where.status().message());
  const std::string listen = fmt::format("{}:{}", where->first, where->second);
  auto collectable = std::make_shared<RegistryCollectable>(registry);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listen, "num_threads", "2"});
  } catch (const std::exception& e) {  // civetweb's CivetException (a runtime_error) when it cannot bind
    return invalidArgument("metrics address {}: cannot listen ({})", address, e.what());
  }
  exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return invalidArgument("metrics address {}: the server reports no listening port", address);
  }
  std::string endpoint = fmt::format("{}:{}", where->first, ports.front());
  return std::unique_ptr<MetricsExporter>(new MetricsExporter(std::move(collectable), std::move(exposer), std::move(endpoint)));
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
