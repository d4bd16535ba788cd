// Prometheus file-based service discovery: launchers that know where ranks serve their
// metrics (meridian-lab, `--ranks N`) write one JSON file per job into
// MERIDIAN_PROMETHEUS_SD_DIR (unset: prometheus-sd in this user's private directory,
// core/file_util.h), which the Prometheus that scripts/prometheus.sh starts watches
// (file_sd_configs). A file lives as long as its job and is removed when it ends.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "core/metrics.h"
#include "core/status.h"

namespace meridian {

// Ranks serve /metrics on host:port+localRank, where host:port is MERIDIAN_METRICS_ADDR or
// 127.0.0.1:kMetricsBasePort (monitoring/exporter.h serves it).
inline constexpr int kMetricsBasePort = 9400;

// "host:port" -> (IPv4 dotted quad, port): host an IPv4 address, "localhost" (127.0.0.1),
// "*" or "0.0.0.0" (0.0.0.0); port 1..65535, or 0 when allowPortZero. The error says what is
// wrong without repeating the text.
Result<std::pair<std::string, int>> parseHostPort(const std::string& text, bool allowPortZero);

// MERIDIAN_METRICS_ADDR as (host, base port): unset or empty -> 127.0.0.1 and the base
// port; "0" -> nullopt (metrics off); "host:port" as parseHostPort takes it (port >= 1);
// anything else -> kInvalidArgument naming the variable and the value.
Result<std::optional<std::pair<std::string, int>>> parseMetricsAddress(const std::string& value);
// The same for the environment, with a malformed value treated as off (the rank reports it).
std::optional<std::pair<std::string, int>> metricsBaseAddress();

struct ScrapeTarget {
  std::string address;  // host:port serving /metrics
  MetricLabels labels;  // e.g. rank, region, node
};

// The discovery directory, created when missing: MERIDIAN_PROMETHEUS_SD_DIR when set (a
// directory of this user's that nobody else may write), else <privateRuntimeDir>/prometheus-sd
// (0700). kInvalidArgument saying why a directory is refused (another owner, a symlink, a
// mode that lets others write).
Result<std::string> scrapeTargetsDir(const PrivateDirRoots& roots = defaultPrivateDirRoots());
// Writes <dir>/<job>.json atomically in Prometheus' file_sd format (one entry per target),
// creating the directory. `job`: letters, digits, '-', '_' and '.'.
Status writeScrapeTargets(const std::string& job, const std::vector<ScrapeTarget>& targets);
// Removes <dir>/<job>.json if present (never fails: it is only bookkeeping).
void removeScrapeTargets(const std::string& job);

// Writes the targets on construction (a failure is logged, never fatal) and removes them on
// destruction: a launcher holds one for the life of its job.
class ScrapeTargetsFile {
 public:
  ScrapeTargetsFile(std::string job, const std::vector<ScrapeTarget>& targets);
  ~ScrapeTargetsFile();
  ScrapeTargetsFile(const ScrapeTargetsFile&) = delete;
  ScrapeTargetsFile& operator=(const ScrapeTargetsFile&) = delete;

 private:
  std::string job_;
};

}  // namespace meridian
