// meridian-probe: runs on every node of a job (under meridian-lab exec-all, mpirun,
// torchrun or with MERIDIAN_RANK/WORLD_SIZE/STORE) and prints, on rank 0, the live
// region-by-region latency matrix per plane, jitter, loss, the congested paths and the
// allreduce plan those round trips give.
//
//   meridian-lab exec-all -- build/tools/meridian-probe --duration 10s
//
// Every rank probes every path to every peer (routing/prober.h); each report round the
// ranks publish their rows through the bootstrap store and rank 0 prints them.
//
// With --rate-seconds S, after the last round every plane's bulk rate is measured too: per
// plane a communicator on that plane alone (authenticated like any job's), and per ordered
// pair of regions one node pair, alone on the network, streams for S seconds (the first node
// of each region; inside a region its first two). The report gains per plane a `rate_mbps`
// matrix, which the NCCL plugin reports as its devices' speed (MERIDIAN_NCCL_LINKS).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "bootstrap/launch_env.h"
#include "bootstrap/store.h"
#include "core/file_util.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/secret.h"
#include "routing/congestion.h"
#include "routing/link_state.h"
#include "routing/planner.h"
#include "routing/prober.h"
#include "routing/regions.h"
#include "transport/fabric/choose.h"
#include "transport/fabric/ib_ports.h"
#include "transport/fabric/rail.h"

namespace {

using namespace meridian;
using namespace meridian::collectives;
using nlohmann::json;

std::atomic<bool> gStop{false};
void onSignal(int) { gStop = true; }

std::vector<std::uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

struct RankInfo {
  std::string region;
  std::string node;
  std::vector<std::string> addresses;
  std::vector<std::string> endpoints;
};

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The report rank 0 prints: per plane, region x region medians over node pairs.
json buildReport(const std::vector<RankInfo>& ranks, const std::vector<json>& rows,
                 const routing::RegionAssignment& regions) {
  std::size_t planes = 0;
  for (const auto& r : ranks) planes = std::max(planes, r.addresses.size());
  const std::size_t nr = regions.names.size();
  json report;
  report["regions"] = regions.names;
  report["regions_inferred"] = regions.inferred;
  report["planes"] = json::array();
  for (std::size_t p = 0; p < planes; ++p) {
    std::vector<std::vector<double>> rtt(nr * nr), minRtt(nr * nr), jitter(nr * nr), loss(nr * nr);
    for (std::size_t src = 0; src < rows.size(); ++src) {
      for (const auto& row : rows[src]) {
        if (row.value("path", -1) != static_cast<int>(p) || !row.value("valid", false)) continue;
        const int dst = row.value("peer", -1);
        if (dst < 0 || dst >= static_cast<int>(ranks.size())) continue;
        const std::size_t cell = static_cast<std::size_t>(regions.regionOf[src]) * nr +
                                 static_cast<std::size_t>(regions.regionOf[static_cast<std::size_t>(dst)]);
        rtt[cell].push_back(row.value("srtt_ms", 0.0));
        minRtt[cell].push_back(row.value("min_rtt_ms", 0.0));
        jitter[cell].push_back(row.value("jitter_ms", 0.0));
        loss[cell].push_back(row.value("loss", 0.0));
      }
    }
    json plane;
    plane["index"] = p;
    plane["rtt_ms"] = json::array();
    plane["min_rtt_ms"] = json::array();
    plane["jitter_ms"] = json::array();
    plane["loss"] = json::array();
    for (std::size_t c = 0; c < nr * nr; ++c) {
      double r = median(rtt[c]);
      plane["rtt_ms"].push_back(std::isnan(r) ? json(nullptr) : json(r));
      double m = median(minRtt[c]);
      plane["min_rtt_ms"].push_back(std::isnan(m) ? json(nullptr) : json(m));
      double j = median(jitter[c]);
      plane["jitter_ms"].push_back(std::isnan(j) ? json(nullptr) : json(j));
      double l = loss[c].empty() ? std::nan("") : *std::max_element(loss[c].begin(), loss[c].end());
      plane["loss"].push_back(std::isnan(l) ? json(nullptr) : json(l));
    }
    report["planes"].push_back(plane);
  }
  report["congested"] = json::array();
  for (std::size_t src = 0; src < rows.size(); ++src) {
    for (const auto& row : rows[src]) {
      if (!row.value("congested", false)) continue;
      report["congested"].push_back({{"from", ranks[src].node},
                                     {"to", ranks[static_cast<std::size_t>(row.value("peer", 0))].node},
                                     {"path", row.value("path", 0)},
                                     {"reason", row.value("reason", "")}});
    }
  }
  // The plan these links would give (probes only: no data flows here, so rates are the
  // link-state table's window/RTT prior; a job's communicator adds measured delivery rates).
  routing::LinkStateTable table(static_cast<int>(ranks.size()));
  for (std::size_t src = 0; src < rows.size(); ++src) {
    routing::LinkRow row{static_cast<int>(src), 0, {}};
    for (const auto& r : rows[src]) {
      routing::LinkFigures f;
      f.peer = r.value("peer", -1);
      f.path = r.value("path", -1);
      if (f.peer < 0 || f.peer >= static_cast<int>(ranks.size()) || f.peer == static_cast<int>(src) || f.path < 0) continue;
      if (r.value("valid", false)) {
        f.srttUs = r.value("srtt_ms", 0.0) * 1000;
        f.minRttUs = r.value("min_rtt_ms", 0.0) * 1000;
      }
      f.congested = r.value("congested", false);
      row.links.push_back(f);
    }
    (void)table.update(std::move(row));
  }
  report["plan"] = json::array();
  if (table.complete()) {
    const routing::PlanTable plans =
        routing::planAll(table.view(regions.regionOf, static_cast<int>(std::max<std::size_t>(1, nr))));
    for (std::size_t bytes : {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{256} << 20}) {
      const routing::Plan& plan = plans.forBytes(bytes);
      report["plan"].push_back({{"bytes", bytes},
                                {"algorithm", routing::algorithmName(plan.algorithm)},
                                {"predicted_s", plan.predictedSec},
                                {"reason", plan.reason}});
    }
  }
  return report;
}

// ---------------------------------------------------------------- bulk rates

// The node pairs the rate phase measures: for each ordered pair of regions (a, b), a's first
// rank to b's first (inside a region: its first rank to its second, when it has two).
struct RatePair {
  std::size_t fromRegion = 0, toRegion = 0;
  int sender = 0, receiver = 0;
};

std::vector<RatePair> ratePairs(const routing::RegionAssignment& regions) {
  const std::size_t nr = regions.names.size();
  std::vector<std::vector<int>> members(nr);
  for (std::size_t r = 0; r < regions.regionOf.size(); ++r) {
    members[static_cast<std::size_t>(regions.regionOf[r])].push_back(static_cast<int>(r));
  }
  std::vector<RatePair> out;
  for (std::size_t a = 0; a < nr; ++a) {
    for (std::size_t b = 0; b < nr; ++b) {
      if (members[a].empty() || members[b].empty()) continue;
      if (a == b && members[a].size() < 2) continue;
      out.push_back({a, b, members[a][0], a == b ? members[a][1] : members[b][0]});
    }
  }
  return out;
}

// Streams from `sender` to `receiver` for `seconds` (messages of kRateMessageBytes, eight in
// flight; the first byte of the last one is 1) and returns, on the receiver, the rate it
// received at in Mbit/s, from its first message's arrival to its last's; 0 on other ranks.
constexpr std::size_t kRateMessageBytes = 128 << 10;
constexpr std::size_t kRateWindow = 8;
constexpr long kRateTimeoutMs = 30'000;

double streamRate(Communicator& comm, int sender, int receiver, double seconds, TimePoint deadline) {
  using DT = Communicator::DataType;
  const std::size_t count = kRateMessageBytes / 4;  // as f32: the data is not looked at
  if (comm.rank() == sender) {
    std::vector<std::vector<std::uint8_t>> bufs(kRateWindow, std::vector<std::uint8_t>(kRateMessageBytes, 0));
    std::vector<Communicator::WorkPtr> inFlight(kRateWindow);
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0;; ++i) {
      auto& slot = inFlight[i % kRateWindow];
      if (slot) {
        Status st = slot->wait(deadline);
        if (!st.isOk()) throw std::runtime_error("rate test send: " + st.toString());
      }
      const bool last = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds;
      auto& buf = bufs[i % kRateWindow];
      buf[0] = last ? 1 : 0;
      slot = comm.sendAsync(buf.data(), count, DT::kF32, receiver, 1);
      if (last) break;
    }
    for (auto& w : inFlight) {
      if (!w) continue;
      Status st = w->wait(deadline);
      if (!st.isOk()) throw std::runtime_error("rate test send: " + st.toString());
    }
    return 0;
  }
  if (comm.rank() != receiver) return 0;
  // One receive at a time: messages that arrive before theirs is posted wait in the channel.
  std::vector<std::uint8_t> buf(kRateMessageBytes);
  std::size_t received = 0;
  std::chrono::steady_clock::time_point first, lastAt;
  for (;;) {
    Status st = comm.recv(buf.data(), count, DT::kF32, sender, 1);
    if (!st.isOk()) throw std::runtime_error("rate test receive: " + st.toString());
    lastAt = std::chrono::steady_clock::now();
    if (received++ == 0) first = lastAt;
    if (buf[0] == 1) break;
  }
  const double sec = std::chrono::duration<double>(lastAt - first).count();
  if (received < 2 || sec <= 0) return -1;  // too little to time
  return static_cast<double>((received - 1) * kRateMessageBytes) * 8 / sec / 1e6;
}

// Every rank calls this with the same arguments; returns, on rank 0, per plane the rate of
// each pair (Mbit/s, -1 where it could not be timed), in ratePairs' order.
std::vector<std::vector<double>> measureRates(bootstrap::Store& st, int rank, int world, const std::vector<std::string>& planes,
                                              const std::vector<RatePair>& pairs, double seconds,
                                              const std::string& secret, std::chrono::milliseconds timeout) {
  std::vector<std::vector<double>> rates;
  for (std::size_t p = 0; p < planes.size(); ++p) {
    CommOptions o;
    o.localAddresses = {planes[p]};
    o.probe = false;
    o.secret = secret;
    // A plane that is down fails the set-up within this, not MERIDIAN_TIMEOUT_MS (minutes).
    o.timeout = std::min(timeout, std::chrono::milliseconds(kRateTimeoutMs));
    o.storePrefix = fmt::format("probe/rate/{}", p);
    o.name = fmt::format("rate{}", p);
    auto comm = Communicator::create(st, rank, world, o);
    if (!comm.isOk()) throw std::runtime_error(fmt::format("plane {}: {}", p, comm.status().message()));
    std::vector<double> mine;
    for (const RatePair& pair : pairs) {
      const auto streaming = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
      mine.push_back(streamRate(*comm.value(), pair.sender, pair.receiver, seconds, Clock::now() + o.timeout + streaming));
      Status b = comm.value()->barrier();  // one pair at a time: nothing else on the network
      if (!b.isOk()) throw std::runtime_error("rate test barrier: " + b.toString());
    }
    // Each pair's figure is on its receiver; a sum brings them to rank 0 (others add 0).
    std::vector<double> sum = mine;
    Status r = comm.value()->allreduce(mine.data(), sum.data(), mine.size(), Communicator::DataType::kF64,
                                       Communicator::ReduceOp::kSum);
    if (!r.isOk()) throw std::runtime_error("rate test gather: " + r.toString());
    rates.push_back(std::move(sum));
  }
  return rates;
}

// Adds the measured rates to the report: per plane, rate_mbps[from region * n + to region].
void addRates(json& report, const std::vector<RatePair>& pairs, const std::vector<std::vector<double>>& rates) {
  const std::size_t nr = report["regions"].size();
  for (auto& plane : report["planes"]) {
    const std::size_t p = plane["index"];
    json cells = json::array();
    for (std::size_t c = 0; c < nr * nr; ++c) cells.push_back(nullptr);
    for (std::size_t i = 0; p < rates.size() && i < pairs.size(); ++i) {
      if (rates[p][i] > 0) cells[pairs[i].fromRegion * nr + pairs[i].toRegion] = rates[p][i];
    }
    plane["rate_mbps"] = cells;
  }
}

// A region x region table: a header of region names, then one row per source region;
// cell(from * n + to) gives each cell's text, `width` characters wide.
void printMatrix(const json& names, int width, const std::function<std::string(std::size_t)>& cell) {
  const std::size_t nr = names.size();
  std::printf("  %-12s", "from \\ to");
  for (const auto& n : names) std::printf(" %-*s", width, n.get<std::string>().c_str());
  std::printf("\n");
  for (std::size_t s = 0; s < nr; ++s) {
    std::printf("  %-12s", names[s].get<std::string>().c_str());
    for (std::size_t d = 0; d < nr; ++d) std::printf(" %-*s", width, cell(s * nr + d).c_str());
    std::printf("\n");
  }
}

void printReport(const json& report, const std::vector<RankInfo>& ranks, double elapsedSec) {
  const auto& names = report["regions"];
  std::printf("\n== t=%.1fs: %zu ranks, regions %s ==\n", elapsedSec, ranks.size(),
              report.value("regions_inferred", false) ? "(inferred from round trips)" : "(MERIDIAN_REGION)");
  for (const auto& plane : report["planes"]) {
    const std::size_t p = plane["index"];
    std::string example = p < ranks[0].addresses.size() ? ranks[0].addresses[p] : "";
    std::printf("plane %zu (rank 0: %s): round trip ms [jitter ms] (loss), median over node pairs\n", p,
                example.c_str());
    printMatrix(names, 24, [&](std::size_t c) {
      const auto& r = plane["rtt_ms"][c];
      if (r.is_null()) return std::string("-");
      std::string cell = fmt::format("{:.2f} [{:.2f}]", r.get<double>(), plane["jitter_ms"][c].get<double>());
      double loss = plane["loss"][c].get<double>();
      if (loss > 0) cell += fmt::format(" ({:.1f}%)", 100 * loss);
      return cell;
    });
  }
  for (const auto& plane : report["planes"]) {
    if (!plane.contains("rate_mbps")) continue;
    std::printf("plane %zu: bulk rate Mbit/s, one node pair at a time\n", plane["index"].get<std::size_t>());
    printMatrix(names, 12, [&](std::size_t c) {
      const auto& r = plane["rate_mbps"][c];
      return r.is_null() ? std::string("-") : fmt::format("{:.1f}", r.get<double>());
    });
  }
  if (!report["plan"].empty()) {
    std::printf("allreduce plan from these round trips (rates from a 4 MiB-window prior, not the bulk rates):\n");
    for (const auto& p : report["plan"]) {
      std::printf("  %9s  %s\n", fmt::format("{} KiB", p["bytes"].get<std::size_t>() >> 10).c_str(),
                  p["reason"].get<std::string>().c_str());
    }
  }
  if (report["congested"].empty()) {
    std::printf("congested paths: none\n");
  } else {
    std::printf("congested paths:\n");
    for (const auto& c : report["congested"]) {
      std::printf("  %s -> %s plane %d: %s\n", c.value("from", "").c_str(), c.value("to", "").c_str(),
                  c.value("path", 0), c.value("reason", "").c_str());
    }
  }
  std::fflush(stdout);
}

// --fabric: what this host offers for fabric paths, and what MERIDIAN_FABRIC would take.
int printFabric() {
  namespace fabric = meridian::transport::fabric;
  const std::vector<std::string> providers = fabric::Rail::providers();
  std::printf("libfabric providers for fabric paths (RDM, tagged): %s\n",
              providers.empty() ? "none" : joinCommaList(providers).c_str());
  auto ports = fabric::listIbPorts();
  if (!ports.isOk()) {
    std::printf("InfiniBand ports: cannot list them: %s\n", ports.status().message().c_str());
  } else if (ports->empty()) {
    std::printf("InfiniBand ports: none (libibverbs lists no HCA on this host)\n");
  } else {
    std::printf("InfiniBand ports:\n");
    for (const auto& p : ports.value()) std::printf("  %s\n", p.text().c_str());
  }
  auto mode = readKnobChoice(knobs::kFabric);
  if (!mode.isOk()) throw std::runtime_error(mode.status().message());
  auto choice = fabric::chooseFabricProvider(mode.value(), knobString(knobs::kFabricProvider), providers);
  if (!choice.isOk()) {
    std::printf("MERIDIAN_FABRIC=%s: %s\n", mode->c_str(), choice.status().message().c_str());
    return 1;
  }
  std::printf("MERIDIAN_FABRIC=%s: %s\n", mode->c_str(), choice->why.c_str());
  if (choice->provider.empty()) return 0;
  fabric::RailOptions ro;
  ro.provider = choice->provider;
  ro.domain = knobString(knobs::kFabricDomain);
  auto rail = fabric::Rail::open(ro);
  if (!rail.isOk()) {
    std::printf("  opening a rail: %s\n", rail.status().message().c_str());
    return 1;
  }
  std::printf("  a rail opens: %s\n", rail.value()->describe().c_str());
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"meridian-probe: live latency matrix between the ranks of a job, per plane"};
  bool fabricOnly = false;
  app.add_flag("--fabric", fabricOnly,
               "Print this host's libfabric providers and InfiniBand ports, and what MERIDIAN_FABRIC would use; no job");
  double durationSec = 0, everySec = 2;
  std::string jsonPath;
  app.add_option("--duration", durationSec, "Stop after this many seconds (default: until Ctrl-C)");
  app.add_option("--every", everySec, "Seconds between reports")->check(CLI::PositiveNumber);
  app.add_option("--json", jsonPath, "Rank 0 also writes the last report here as JSON");
  double rateSeconds = 0;
  app.add_option("--rate-seconds", rateSeconds,
                 "After the last report, measure each plane's bulk rate between every pair of regions, this long per "
                 "pair (0: not measured)")
      ->check(CLI::Range(0.0, 60.0));
  CLI11_PARSE(app, argc, argv);
  if (fabricOnly) return printFabric();

  auto info = bootstrap::detectLaunch();
  if (!info.isOk()) throw std::runtime_error(info.status().message());
  log::setRank(info->rank);
  const std::string secret = loadJobSecret(info->worldSize);
  const auto timeout = std::chrono::milliseconds(knobInt(knobs::kTimeoutMs));
  std::unique_ptr<bootstrap::StoreServer> server;
  auto store = bootstrap::rendezvous(info.value(), secret, Clock::now() + timeout, &server);
  if (!store.isOk()) throw std::runtime_error(store.status().message());
  bootstrap::Store& st = *store.value();
  const int rank = info->rank, world = info->worldSize;

  // One session id for the job: probes of another job on the same network are refused.
  std::uint64_t session = 0;
  if (rank == 0) {
    randomBytes(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(&session), sizeof(session)));
    auto s = st.set("probe/session", bytesOf(std::to_string(session)));
    if (!s.isOk()) throw std::runtime_error(s.message());
  }
  auto sessionBytes = st.get("probe/session", Clock::now() + timeout);
  if (!sessionBytes.isOk()) throw std::runtime_error(sessionBytes.status().message());
  session = std::stoull(std::string(sessionBytes->begin(), sessionBytes->end()));

  routing::ProberOptions po;
  po.localAddresses = bootstrap::withoutPorts(bootstrap::localPathAddresses(info.value()));  // a port there is a data port
  po.interval = std::chrono::milliseconds(knobInt(knobs::kProbeIntervalMs));
  po.secret = secret;
  po.sessionId = session;
  po.selfRank = rank;
  auto prober = routing::Prober::create(po);
  if (!prober.isOk()) throw std::runtime_error(prober.status().message());

  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const char* labNode = std::getenv("MERIDIAN_LAB_NODE");
  json mine{{"region", knobString(knobs::kRegion)},
            {"node", labNode != nullptr ? std::string(labNode) : fmt::format("{}/{}", host, rank)},
            {"addresses", po.localAddresses},
            {"endpoints", prober.value()->endpoints()}};
  auto all = bootstrap::storeAllGather(st, "probe/hello", rank, world, bytesOf(mine.dump()), Clock::now() + timeout);
  if (!all.isOk()) throw std::runtime_error(all.status().message());
  std::vector<RankInfo> ranks;
  for (int r = 0; r < world; ++r) {
    auto j = json::parse(std::string(all.value()[r].begin(), all.value()[r].end()), nullptr, false);
    if (j.is_discarded()) throw std::runtime_error(fmt::format("rank {} published a malformed hello", r));
    ranks.push_back({j.value("region", ""), j.value("node", ""), j.value("addresses", std::vector<std::string>{}),
                     j.value("endpoints", std::vector<std::string>{})});
    if (r != rank) {
      Status s = prober.value()->setPeer(r, ranks.back().endpoints);
      if (!s.isOk()) throw std::runtime_error(s.message());
    }
  }

  if (::signal(SIGINT, onSignal) == SIG_ERR || ::signal(SIGTERM, onSignal) == SIG_ERR) {
    throw std::runtime_error(fmt::format("cannot handle SIGINT/SIGTERM: {}", std::strerror(errno)));
  }
  std::map<std::pair<int, int>, routing::CongestionDetector> detectors;
  const auto start = std::chrono::steady_clock::now();
  json lastReport;
  routing::RegionAssignment lastRegions;  // rank 0: the regions of lastReport
  for (int round = 0;; ++round) {
    // Every rank decides the same way when to stop: by the round count.
    const bool last = durationSec > 0 && (round + 1) * everySec >= durationSec;
    std::this_thread::sleep_until(start + std::chrono::milliseconds(static_cast<long>((round + 1) * everySec * 1000)));
    const std::int64_t now = nowUs();
    json rows = json::array();
    for (const auto& row : prober.value()->snapshot()) {
      auto& det = detectors[{row.peer, row.path}];
      routing::CongestionSample sample;
      sample.nowUs = now;
      sample.figures = row.figures;
      if (row.figures.valid) det.update(sample);
      const bool congested = det.state() == routing::CongestionState::kCongested;
      rows.push_back({{"peer", row.peer},
                      {"path", row.path},
                      {"valid", row.figures.valid},
                      {"srtt_ms", row.figures.srttUs / 1000},
                      {"min_rtt_ms", row.figures.minRttUs / 1000},
                      {"jitter_ms", row.figures.jitterUs / 1000},
                      {"loss", row.figures.loss},
                      {"congested", congested},
                      {"reason", congested ? det.reason() : std::string()}});
    }
    // A stop request on rank 0 (Ctrl-C) ends everyone at the next round.
    json msg{{"rows", rows}, {"stop", gStop.load() || last}};
    auto gathered = bootstrap::storeAllGather(st, fmt::format("probe/round{}", round), rank, world, bytesOf(msg.dump()),
                                   Clock::now() + timeout);
    if (!gathered.isOk()) throw std::runtime_error(gathered.status().message());
    std::vector<json> allRows;
    bool stop = false;
    for (const auto& blob : gathered.value()) {
      auto j = json::parse(std::string(blob.begin(), blob.end()), nullptr, false);
      allRows.push_back(j.is_discarded() ? json::array() : j.value("rows", json::array()));
      stop = stop || (!j.is_discarded() && j.value("stop", false));
    }
    if (rank == 0) {
      std::vector<std::string> names;
      for (const auto& r : ranks) names.push_back(r.region);
      auto regions = routing::regionsFromNames(names);
      if (!regions.isOk()) {
        // No names: cluster the measured round trips (plane 0).
        std::vector<double> rtt(static_cast<std::size_t>(world * world), -1.0);
        for (int s = 0; s < world; ++s) {
          rtt[static_cast<std::size_t>(s * world + s)] = 0;
          for (const auto& row : allRows[static_cast<std::size_t>(s)]) {
            if (row.value("path", -1) == 0 && row.value("valid", false)) {
              rtt[static_cast<std::size_t>(s * world + row.value("peer", 0))] = row.value("min_rtt_ms", 0.0) * 1000;
            }
          }
        }
        regions = routing::inferRegions(rtt, world);
      }
      if (regions.isOk()) {
        lastRegions = regions.value();
        lastReport = buildReport(ranks, allRows, regions.value());
        printReport(lastReport, ranks, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      } else {
        std::printf("regions unknown yet: %s\n", regions.status().message().c_str());
      }
    }
    if (stop) break;
  }
  // Atomically: a plugin reading the report at its init never sees half of one. Written once
  // the rounds are over and again with the rates, so a rate phase that fails (a plane that
  // is down) still leaves the round trips.
  auto writeJson = [&] {
    if (rank != 0 || jsonPath.empty() || lastReport.is_null()) return;
    Status w = writeFileAtomically(jsonPath, lastReport.dump(2));
    if (!w.isOk()) throw std::runtime_error(fmt::format("cannot write {}: {}", jsonPath, w.message()));
  };
  if (rateSeconds > 0 && world > 1) {
    writeJson();
    // Rank 0 picks the node pairs from the regions it knows; every rank measures them.
    std::vector<RatePair> pairs;
    if (rank == 0) {
      if (!lastReport.is_null()) pairs = ratePairs(lastRegions);
      json list = json::array();
      for (const auto& pr : pairs) list.push_back({pr.fromRegion, pr.toRegion, pr.sender, pr.receiver});
      Status s = st.set("probe/rate/pairs", bytesOf(list.dump()));
      if (!s.isOk()) throw std::runtime_error(s.message());
    } else {
      auto got = st.get("probe/rate/pairs", Clock::now() + timeout);
      if (!got.isOk()) throw std::runtime_error(got.status().message());
      const json list = json::parse(std::string(got->begin(), got->end()), nullptr, false);
      if (!list.is_array()) throw std::runtime_error("rank 0 published malformed rate pairs");
      for (const auto& e : list) {
        if (!e.is_array() || e.size() != 4) throw std::runtime_error("rank 0 published malformed rate pairs");
        RatePair pr{e[0].get<std::size_t>(), e[1].get<std::size_t>(), e[2].get<int>(), e[3].get<int>()};
        if (pr.sender < 0 || pr.sender >= world || pr.receiver < 0 || pr.receiver >= world || pr.sender == pr.receiver) {
          throw std::runtime_error("rank 0 published a rate pair outside the job");
        }
        pairs.push_back(pr);
      }
    }
    if (!pairs.empty()) {
      std::size_t planes = ranks[0].addresses.size();
      for (const auto& r : ranks) planes = std::min(planes, r.addresses.size());
      std::vector<std::string> addrs = bootstrap::localPathAddresses(info.value());
      addrs.resize(std::min(addrs.size(), planes));
      if (rank == 0) {
        std::printf("\nmeasuring bulk rates: %zu node pair(s) x %zu plane(s), %.1f s each\n", pairs.size(), addrs.size(),
                    rateSeconds);
        std::fflush(stdout);
      }
      auto rates = measureRates(st, rank, world, addrs, pairs, rateSeconds, secret, timeout);
      if (rank == 0) {
        addRates(lastReport, pairs, rates);
        printReport(lastReport, ranks, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
  }
  writeJson();
  // Rank 0 hosts the store, so it leaves last: once every other rank has said it is done
  // with the store.
  if (rank != 0) {
    Status s = st.set(fmt::format("probe/done/{}", rank), bytesOf("1"));
    if (!s.isOk()) throw std::runtime_error(s.message());
    return 0;
  }
  std::vector<std::string> done;
  for (int r = 1; r < world; ++r) done.push_back(fmt::format("probe/done/{}", r));
  Status s = done.empty() ? Status::ok() : st.wait(done, Clock::now() + timeout);
  if (!s.isOk()) throw std::runtime_error(s.message());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meridian-probe: %s\n", e.what());
    return 1;
  }
}
