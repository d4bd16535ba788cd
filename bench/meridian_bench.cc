// meridian-bench: nccl-tests-style tables for every collective over a size sweep, run
// as N local ranks it launches itself (--ranks N) or as one rank of a job started by
// mpirun, Slurm, torchrun or meridian-lab (rank and store from the environment).
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/bench_ops.h"
#include "bench/sweep.h"
#include "collectives/communicator.h"
#include "bootstrap/launch_env.h"
#include "core/knobs.h"
#include "core/local_launch.h"
#include "core/log.h"
#include "core/metrics.h"
#include "monitoring/exporter.h"

namespace meridian::bench {
namespace {

struct Args {
  int ranks = 0;
  std::string ops = "all";
  std::string minBytesText = "8";
  std::string maxBytesText = "64M";
  int factor = 2;
  int iters = 20;
  int warmup = 5;
  std::string dtypeText = "f32";
  std::string redopText = "sum";
  int root = 0;
  bool check = true;
  std::string jsonPath;
  bool transportStats = false;
  double durationSec = 0;   // > 0: timeline mode
  long long minOps = 0;     // timeline mode: go on past the duration until this many ops ran
  double intervalSec = 1.0;
};

constexpr std::size_t kTimelinePaths = 8;  // paths reported per interval (more are summed into the last)

// Bytes this rank has sent to ranks of other regions, per path index.
std::array<double, kTimelinePaths> crossRegionBytes(const collectives::Communicator& comm) {
  std::array<double, kTimelinePaths> out{};
  const auto& regions = comm.regionNames();
  for (int peer = 0; peer < comm.size(); ++peer) {
    if (peer == comm.rank()) continue;
    const bool cross = regions[static_cast<std::size_t>(peer)] != regions[static_cast<std::size_t>(comm.rank())] ||
                       regions[static_cast<std::size_t>(peer)].empty();
    if (!cross) continue;
    auto stats = comm.peerPathStats(peer);
    for (std::size_t p = 0; p < stats.size(); ++p) {
      out[std::min(p, kTimelinePaths - 1)] += static_cast<double>(stats[p].bytesSent);
    }
  }
  return out;
}

// Timeline mode: one op at one size, over and over for --duration seconds; every
// --interval, rank 0 prints the busbw of that interval and how the bytes crossing regions
// (all ranks together) were spread over the paths. Shows routing reacting to a link that
// changes under load (meridian-lab set / scenario).
int runTimeline(const Args& a, const std::string& cmd, collectives::Communicator& comm, BenchOp op,
                std::size_t bytes, kernels::DataType dtype, kernels::ReduceOp redop) {
  const std::size_t esize = kernels::dataTypeSize(dtype);
  const std::size_t n = static_cast<std::size_t>(comm.size());
  std::size_t count = bytes / esize;
  if (op == BenchOp::kAllgather || op == BenchOp::kReduceScatter) count -= count % n;
  std::vector<std::uint8_t> send((count + n) * esize, 1), recv((count + n) * esize, 1);
  const bool print = comm.rank() == 0;
  if (print) {
    std::printf("# meridian-bench timeline: %s of %zu bytes on %d ranks, routing %s\n# command: %s\n", opName(op),
                count * esize, comm.size(), comm.adaptiveRouting() ? "adaptive" : "static", cmd.c_str());
    std::printf("# %7s %5s %12s   cross-region bytes per path (all ranks)\n", "t(s)", "ops", "busbw(GB/s)");
  }
  nlohmann::json rows = nlohmann::json::array();
  auto start = std::chrono::steady_clock::now();
  // The same instant on the wall clock, so a harness can place its own events on the timeline.
  const double startUnixSec =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto intervalStart = start;
  auto lastBytes = crossRegionBytes(comm);
  int ops = 0;
  long long opsTotal = 0;
  std::size_t wrongTotal = 0;
  bool anyWrong = false;
  for (;;) {
    // With --check every op's result is verified (the fill and check are outside no timing
    // that matters here: the timeline measures whole intervals, so they lower busbw a little).
    if (a.check) fillInput(comm, op, send.data(), recv.data(), count, dtype);
    Status st = runOnce(comm, op, send.data(), recv.data(), count, dtype, redop, a.root);
    if (!st.isOk()) {
      std::fprintf(stderr, "meridian-bench: rank %d: %s\n", comm.rank(), st.toString().c_str());
      return 1;
    }
    if (a.check) wrongTotal += countWrong(comm, op, recv.data(), count, dtype, redop, a.root);
    ++ops;
    ++opsTotal;
    // Rank 0's clock decides when an interval ends and when to stop; everyone follows.
    auto now = std::chrono::steady_clock::now();
    double decide[2] = {0, 0};
    if (comm.rank() == 0) {
      decide[0] = std::chrono::duration<double>(now - intervalStart).count() >= a.intervalSec ? 1 : 0;
      decide[1] = std::chrono::duration<double>(now - start).count() >= a.durationSec && opsTotal >= a.minOps ? 1 : 0;
    }
    if (!comm.broadcast(decide, decide, 2, kernels::DataType::kF64, 0).isOk()) return 1;
    if (decide[0] == 0 && decide[1] == 0) continue;
    auto bytesNow = crossRegionBytes(comm);
    std::array<double, kTimelinePaths + 2> local{}, total{};
    for (std::size_t p = 0; p < kTimelinePaths; ++p) local[p] = bytesNow[p] - lastBytes[p];
    lastBytes = bytesNow;
    local[kTimelinePaths] = static_cast<double>(ops);
    local[kTimelinePaths + 1] = static_cast<double>(wrongTotal);
    wrongTotal = 0;
    if (!comm.allreduce(local.data(), total.data(), local.size(), kernels::DataType::kF64, kernels::ReduceOp::kSum)
             .isOk()) {
      return 1;
    }
    const double secs = std::chrono::duration<double>(now - intervalStart).count();
    const double t = std::chrono::duration<double>(now - start).count();
    const double algbw = static_cast<double>(count * esize) * static_cast<double>(ops) / secs / 1e9;
    const double busbw = algbw * busBandwidthFactor(op, comm.size());
    if (print) {
      double all = 0;
      for (std::size_t p = 0; p < kTimelinePaths; ++p) all += total[p];
      std::string shares;
      nlohmann::json perPath = nlohmann::json::array();
      // Every path up to the last that carried bytes, so indices stay path indices (the
      // relay slot comes after the planes).
      std::size_t used = 1;
      for (std::size_t p = 0; p < kTimelinePaths; ++p) {
        if (total[p] > 0) used = p + 1;
      }
      for (std::size_t p = 0; p < used; ++p) {
        shares += fmt::format("  p{} {:5.1f}%", p, all > 0 ? 100 * total[p] / all : 0.0);
        perPath.push_back(total[p]);
      }
      const auto wrong = static_cast<std::uint64_t>(total[kTimelinePaths + 1]);
      // The plan in force for this size (allreduce only follows plans).
      const collectives::PlanInForce plan = comm.plan();
      const std::string algo = op != BenchOp::kAllreduce                ? "-"
                               : comm.allreduceAlgorithm() != "auto" ? "pinned " + comm.allreduceAlgorithm()
                               : plan.table ? routing::algorithmName(plan.table->forBytes(count * esize).algorithm)
                                            : "built-in";
      std::printf("  %7.2f %5d %12.4f %s  plan %s (epoch %llu)%s\n", t, ops, busbw, shares.c_str(), algo.c_str(),
                  static_cast<unsigned long long>(plan.epoch), wrong > 0 ? fmt::format("  WRONG {}", wrong).c_str() : "");
      std::fflush(stdout);
      rows.push_back({{"t", t},
                      {"t_start", t - secs},
                      {"ops", ops},
                      {"busbw_gbps", busbw},
                      {"cross_region_bytes", perPath},
                      {"plan_epoch", plan.epoch},
                      {"algorithm", algo},
                      {"wrong", wrong}});
      anyWrong = anyWrong || wrong > 0;
    }
    ops = 0;
    intervalStart = now;
    if (decide[1] != 0) break;
  }
  if (print && !a.jsonPath.empty()) {
    nlohmann::json j{{"command", cmd},        {"ranks", comm.size()}, {"op", opName(op)},
                     {"bytes", count * esize}, {"routing", comm.adaptiveRouting() ? "adaptive" : "static"},
                     {"start_unix_s", startUnixSec}, {"timeline", rows}};
    std::ofstream(a.jsonPath) << j.dump(2) << "\n";
  }
  if (print && anyWrong) std::printf("# INCORRECT results in the timeline\n");
  return anyWrong ? 3 : 0;
}

// Sum of every sample of one metric family in this process.
double familyTotal(const std::string& name) {
  double total = 0;
  for (const auto& family : MetricsRegistry::global().snapshot()) {
    if (family.name != name) continue;
    for (const auto& sample : family.samples) total += sample.value;
  }
  return total;
}

struct Row {
  std::string op;
  std::size_t bytes;
  std::size_t count;
  int iters;
  double timeUs;
  double algbw;
  double busbw;
  std::size_t wrong;
};

std::string commandLine(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

int runRank(const Args& a, const std::string& cmd) {
  auto dtype = kernels::parseDataType(a.dtypeText);
  auto redop = kernels::parseReduceOp(a.redopText);
  if (!dtype || !redop) {
    std::fprintf(stderr, "meridian-bench: unknown --dtype '%s' or --op '%s'\n", a.dtypeText.c_str(), a.redopText.c_str());
    return 2;
  }
  std::vector<BenchOp> ops;
  std::size_t minBytes = 0, maxBytes = 0;
  try {
    ops = parseOps(a.ops);
    minBytes = static_cast<std::size_t>(parseByteSize(a.minBytesText, "--min-bytes"));
    maxBytes = static_cast<std::size_t>(parseByteSize(a.maxBytesText, "--max-bytes"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meridian-bench: %s\n", e.what());
    return 2;
  }
  if (minBytes > maxBytes || a.factor < 2 || a.iters < 1 || a.warmup < 0) {
    std::fprintf(stderr, "meridian-bench: need min-bytes <= max-bytes, factor >= 2, iters >= 1\n");
    return 2;
  }
  auto commOr = collectives::Communicator::createFromEnvironment();
  if (!commOr) {
    std::fprintf(stderr, "meridian-bench: %s\n", commOr.status().toString().c_str());
    return 1;
  }
  commOr.value()->labelMetrics();
  const auto launch = bootstrap::detectLaunch();
  const auto exporter = monitoring::startExporterFromEnv(launch.isOk() ? launch->localRank : 0);
  if (a.durationSec > 0) {
    if (ops.size() != 1 || minBytes != maxBytes) {
      std::fprintf(stderr, "meridian-bench: --duration needs one op and one size (-b = -e)\n");
      return 2;
    }
    return runTimeline(a, cmd, *commOr.value(), ops[0], minBytes, *dtype, *redop);
  }
  auto& comm = *commOr.value();
  const int n = comm.size();
  if (a.root < 0 || a.root >= n) {
    std::fprintf(stderr, "meridian-bench: --root %d is not a rank of %d\n", a.root, n);
    return 2;
  }
  const std::size_t esize = kernels::dataTypeSize(*dtype);
  // Buffers allocated once for the largest size and touched before timing.
  std::size_t maxCount = maxBytes / esize + static_cast<std::size_t>(n);
  std::vector<std::uint8_t> send(maxCount * esize, 1), recv(maxCount * esize, 1);

  bool print = comm.rank() == 0;
  if (print) {
    std::printf("# meridian-bench: %d ranks, dtype %s, op %s, root %d, TCP streams per path %lld, paths %s\n", n,
                a.dtypeText.c_str(), a.redopText.c_str(), a.root,
                static_cast<long long>(knobInt(knobs::kTcpStreams)),
                knobString(knobs::kPaths).empty() ? "127.0.0.1" : knobString(knobs::kPaths).c_str());
    std::printf("# command: %s\n#\n", cmd.c_str());
    std::printf("# %-14s %12s %12s %5s %6s %6s %11s %12s %12s %7s%s\n", "op", "size(B)", "count", "type", "redop",
                "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", a.transportStats ? "  unexpected%" : "");
  }
  std::vector<Row> rows;
  std::size_t totalWrong = 0;
  for (BenchOp op : ops) {
    for (std::size_t bytes = minBytes;; bytes = bytes == 0 ? 1 : bytes * static_cast<std::size_t>(a.factor)) {
      if (bytes > maxBytes) break;
      std::size_t count = bytes / esize;
      if (op == BenchOp::kAllgather || op == BenchOp::kReduceScatter) count -= count % static_cast<std::size_t>(n);
      std::size_t realBytes = count * esize;
      int iters = meridian::bench::itersFor(realBytes, a.iters);
      std::size_t wrong = 0;
      Status st;
      if (a.check) {
        fillInput(comm, op, send.data(), recv.data(), count, *dtype);
        st = runOnce(comm, op, send.data(), recv.data(), count, *dtype, *redop, a.root);
        if (st.isOk()) wrong = countWrong(comm, op, recv.data(), count, *dtype, *redop, a.root);
      }
      for (int i = 0; i < a.warmup && st.isOk(); ++i) {
        st = runOnce(comm, op, send.data(), recv.data(), count, *dtype, *redop, a.root);
      }
      if (st.isOk()) st = comm.barrier();
      const double unexpected0 = a.transportStats ? familyTotal("meridian_transport_unexpected_bytes_total") : 0;
      const double received0 = a.transportStats ? familyTotal("meridian_transport_path_received_bytes_total") : 0;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters && st.isOk(); ++i) {
        st = runOnce(comm, op, send.data(), recv.data(), count, *dtype, *redop, a.root);
      }
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      // Share of the bytes this rank received that arrived before their receive was posted.
      const double received = a.transportStats ? familyTotal("meridian_transport_path_received_bytes_total") - received0 : 0;
      const double unexpectedPct =
          received > 0 ? 100.0 * (familyTotal("meridian_transport_unexpected_bytes_total") - unexpected0) / received : 0;
      if (!st.isOk()) {
        std::fprintf(stderr, "meridian-bench: rank %d: %s at %zu bytes: %s\n", comm.rank(), opName(op), realBytes,
                     st.toString().c_str());
        return 1;
      }
      // The slowest rank's time, and the wrong elements of all ranks.
      double stats[2] = {us, static_cast<double>(wrong)};
      double maxUs = 0, sumWrong = 0;
      if (!comm.allreduce(&stats[0], &maxUs, 1, kernels::DataType::kF64, kernels::ReduceOp::kMax).isOk() ||
          !comm.allreduce(&stats[1], &sumWrong, 1, kernels::DataType::kF64, kernels::ReduceOp::kSum).isOk()) {
        std::fprintf(stderr, "meridian-bench: rank %d: gathering figures failed\n", comm.rank());
        return 1;
      }
      double algbw = maxUs > 0 ? static_cast<double>(realBytes) / (maxUs * 1e3) : 0;  // GB/s
      Row row{opName(op), realBytes, count, iters, maxUs, algbw, algbw * busBandwidthFactor(op, n),
              static_cast<std::size_t>(sumWrong)};
      totalWrong += row.wrong;
      if (print) {
        std::printf("  %-14s %12zu %12zu %5s %6s %6d %11.1f %12.3f %12.3f %7s", row.op.c_str(), row.bytes, row.count,
                    a.dtypeText.c_str(), a.redopText.c_str(), row.iters, row.timeUs, row.algbw, row.busbw,
                    a.check ? std::to_string(row.wrong).c_str() : "n/a");
        if (a.transportStats) std::printf("  %11.1f", unexpectedPct);
        std::printf("\n");
        std::fflush(stdout);
      }
      rows.push_back(row);
      if (bytes == maxBytes) break;
    }
  }
  if (print) {
    std::printf("# %s: %zu wrong elements in total\n", totalWrong == 0 ? "correct" : "INCORRECT", totalWrong);
    if (!a.jsonPath.empty()) {
      nlohmann::json j;
      j["command"] = cmd;
      j["ranks"] = n;
      j["dtype"] = a.dtypeText;
      j["redop"] = a.redopText;
      for (const auto& r : rows) {
        j["rows"].push_back({{"op", r.op}, {"bytes", r.bytes}, {"count", r.count}, {"iters", r.iters},
                             {"time_us", r.timeUs}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw},
                             {"wrong", r.wrong}});
      }
      std::ofstream(a.jsonPath) << j.dump(2) << "\n";
    }
  }
  return totalWrong == 0 ? 0 : 3;
}

}  // namespace
}  // namespace meridian::bench

int main(int argc, char** argv) {
  using namespace meridian;
  bench::Args a;
  CLI::App app{"meridian-bench: collective bandwidth and latency, nccl-tests style"};
  app.add_option("--ranks,-N", a.ranks, "Launch this many local ranks (else: one rank from the environment)");
  app.add_option("--ops", a.ops, "Comma list: all_reduce, reduce_scatter, all_gather, broadcast, reduce, sendrecv, all");
  app.add_option("--min-bytes,-b", a.minBytesText, "Smallest size (k/M/G suffixes)");
  app.add_option("--max-bytes,-e", a.maxBytesText, "Largest size");
  app.add_option("--factor,-f", a.factor, "Size multiplier between steps");
  app.add_option("--iters,-n", a.iters, "Timed iterations per size (fewer above 8 MiB, at least 5)");
  app.add_option("--warmup,-w", a.warmup, "Untimed iterations per size");
  app.add_option("--dtype,-d", a.dtypeText, "f32, f64, f16, bf16, i32, i64");
  app.add_option("--op,-o", a.redopText, "sum, prod, min, max, avg");
  app.add_option("--root,-r", a.root, "Root of broadcast and reduce");
  app.add_option("--check,-c", a.check, "Check results (1) or not (0)");
  app.add_option("--json", a.jsonPath, "Also write the table as JSON here (rank 0)");
  app.add_option("--duration", a.durationSec,
                 "Timeline mode: repeat the one op and size for this many seconds, a line per --interval");
  app.add_option("--interval", a.intervalSec, "Seconds per timeline line")->check(CLI::PositiveNumber);
  app.add_option("--min-ops", a.minOps, "Timeline mode: go on past --duration until this many ops have run")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--transport-stats", a.transportStats,
               "Add a column: % of rank 0's received bytes that arrived before their receive was posted");
  CLI11_PARSE(app, argc, argv);
  std::string cmd = bench::commandLine(argc, argv);
  try {
    if (a.ranks > 0) {
      LocalLaunchOptions lo;
      lo.ranks = a.ranks;
      lo.argv = relaunchArgv(argc, argv, {"--ranks", "-N"});
      lo.extraEnv.push_back({"MERIDIAN_BENCH_COMMAND", cmd});
      const Result<int> worst = launchLocalRanks(lo);
      if (!worst.isOk()) std::fprintf(stderr, "meridian-bench: %s\n", worst.status().toString().c_str());
      return worst.isOk() ? worst.value() : 1;
    }
    if (const char* c = std::getenv("MERIDIAN_BENCH_COMMAND")) cmd = c;
    return bench::runRank(a, cmd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meridian-bench: %s\n", e.what());
    return 1;
  }
}
