#include "core/scrape_targets.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/knobs.h"
#include "core/host_port.h"
#include "core/log.h"

namespace meridian {
namespace {

bool validJob(const std::string& job) {
  if (job.empty() || job.size() > 128) return false;
  for (char c : job)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  return job.front() != '.';
}

}  // namespace

Result<std::pair<std::string, int>> parseHostPort(const std::string& text, bool allowPortZero) {
  MERIDIAN_ASSIGN_OR_RETURN(const HostPort hp, splitHostPort(text));
  const std::string& host = hp.host;
  std::string ip;
  if (host == "localhost") {
    ip = "127.0.0.1";
  } else if (host == "*" || host == "0.0.0.0") {
    ip = "0.0.0.0";
  } else {
    in_addr parsed{};
    if (host.empty() || ::inet_pton(AF_INET, host.c_str(), &parsed) != 1)
      return invalidArgument("host '{}' is not an IPv4 address, localhost or *", host);
    ip = host;
  }
  if (hp.port == 0 && !allowPortZero) return invalidArgument("port 0 is out of range 1..65535");
  return std::make_pair(ip, static_cast<int>(hp.port));
}

Result<std::optional<std::pair<std::string, int>>> parseMetricsAddress(const std::string& value) {
  using Address = std::optional<std::pair<std::string, int>>;
  if (value.empty()) return Address(std::make_pair(std::string("127.0.0.1"), kMetricsBasePort));
  if (value == "0") return Address();
  auto parsed = parseHostPort(value, /*allowPortZero=*/false);
  if (!parsed.isOk())
    return invalidArgument("MERIDIAN_METRICS_ADDR='{}': {} (want host:port, or 0 for no metrics)", value,
                           parsed.status().message());
  return Address(*parsed);
}

std::optional<std::pair<std::string, int>> metricsBaseAddress() {
  auto parsed = parseMetricsAddress(knobString(knobs::kMetricsAddr));
  return parsed.isOk() ? *parsed : std::nullopt;
}

Result<std::string> scrapeTargetsDir(const PrivateDirRoots& roots) {
  if (knobIsSet(knobs::kPrometheusSdDir)) {
    // Chosen by hand, perhaps for a Prometheus of another user to read: nobody else may
    // write in it, so nobody can plant a file or a link there.
    const std::string dir = knobString(knobs::kPrometheusSdDir);
    MERIDIAN_RETURN_IF_ERROR(ensurePrivateDirectory(dir, 022).withContext(knobs::kPrometheusSdDir.name));
    return dir;
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::string base, privateRuntimeDir(roots));
  const std::string dir = base + "/prometheus-sd";
  MERIDIAN_RETURN_IF_ERROR(ensurePrivateDirectory(dir));
  return dir;
}

Status writeScrapeTargets(const std::string& job, const std::vector<ScrapeTarget>& targets) {
  if (!validJob(job)) return invalidArgument("scrape targets: bad job name '{}'", job);
  auto dir = scrapeTargetsDir();
  if (!dir) return dir.status().withContext("scrape targets");
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& t : targets) {
    nlohmann::json labels = nlohmann::json::object();
    for (const auto& [k, v] : t.labels) labels[k] = v;
    entries.push_back({{"targets", {t.address}}, {"labels", labels}});
  }
  // The temporary name does not end in .json, so Prometheus never reads a half-written file.
  return writeFileAtomically(*dir + "/" + job + ".json", entries.dump(2) + "\n").withContext("scrape targets");
}

void removeScrapeTargets(const std::string& job) {
  if (!validJob(job)) return;
  auto dir = scrapeTargetsDir();
  if (!dir) return;  // nothing was written there either
  std::error_code ec;
  std::filesystem::remove(*dir + "/" + job + ".json", ec);
}

ScrapeTargetsFile::ScrapeTargetsFile(std::string job, const std::vector<ScrapeTarget>& targets) : job_(std::move(job)) {
  Status st = writeScrapeTargets(job_, targets);
  if (!st.isOk()) {
    MLOG_WARN(kMonitoring, "Prometheus will not find these ranks: {}", st.message());
    job_.clear();
  }
}

ScrapeTargetsFile::~ScrapeTargetsFile() {
  if (!job_.empty()) removeScrapeTargets(job_);
}

}  // namespace meridian
