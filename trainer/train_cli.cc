#include "trainer/train_cli.h"

#include <atomic>
#include <charconv>
#include <csignal>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "bootstrap/launch_env.h"
#include "core/knobs.h"
#include "core/local_launch.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace meridian::trainer {
namespace {

// --ranks N starts N processes on this host, each with its threads and a TCP connection to
// every other rank (a full mesh: 256 ranks hold 65,280 sockets between them), which is
// about where one host's descriptors and cores give out; more ranks belong on more hosts,
// started by a launcher (mpirun, Slurm, torchrun, meridian-lab).
constexpr int kMaxLocalRanks = 256;

// A finite number between lo and hi, each end open or closed. CLI::Range lets NaN through
// (every comparison with it is false) and cannot leave an end open.
CLI::Validator finiteIn(double lo, bool loOpen, double hi, bool hiOpen) {
  const std::string range = fmt::format("{}{}, {}{}", loOpen ? '(' : '[', lo, hi, hiOpen ? ')' : ']');
  return CLI::Validator(
      [=](const std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return fmt::format("'{}' is not a number", text);
        const bool inside = std::isfinite(v) && (loOpen ? v > lo : v >= lo) && (hiOpen ? v < hi : v <= hi);
        return inside ? std::string() : fmt::format("{} is outside {}", text, range);
      },
      "in " + range);
}

struct Args {
  int ranks = 0;
  std::string device = "auto";
  std::string sync = "ddp";
  std::string model = "784-1024-1024-10";
  std::string activation = "relu";
  std::string optimizer = "adamw";
  std::string wire = "f32";
  std::string jsonPath;
  std::string regions;
  int blasThreads = 1;
  std::string computeNice = "auto";
  std::string bind = "cpus";
  std::string elastic = "on";
  bool join = false;
};

std::string human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

void printSummary(const TrainConfig& cfg, const TrainSummary& s, const std::string& backend) {
  const double commShare = s.computeSec + s.exposedCommSec > 0 ? s.exposedCommSec / (s.computeSec + s.exposedCommSec) : 0;
  const double speedup = s.oneRankSamplesPerSec > 0 ? s.samplesPerSec / s.oneRankSamplesPerSec : 0;
  fmt::print("\n== meridian-train summary ==\n");
  fmt::print("  test accuracy      {:.2f}%  (test loss {:.4f}, last train loss {:.4f})\n", 100 * s.testAccuracy, s.testLoss,
             s.trainLoss);
  fmt::print("  steps              {} this run, {} in all; sync {}, {} ranks, {}, backend {}\n", s.steps, s.finalStep,
             toString(cfg.sync), s.worldSize,
             s.regionCount > 0 ? fmt::format("{} regions", s.regionCount) : std::string("regions unknown"), backend);
  fmt::print("  wall time          {:.1f} s, {:.0f} samples/s\n", s.wallSec, s.samplesPerSec);
  if (s.membershipChanges() > 0) {
    fmt::print("  membership         {} ranks in {} change(s); {:.2f} s recovering from losses (this rank), no sample "
               "skipped\n",
               fmt::join(s.worldSizes, " -> "), s.membershipChanges(), s.recoverySec);
  }
  fmt::print("  step time          compute {:.1f} ms, exposed communication {:.1f} ms ({:.0f}% of the step)\n",
             s.steps > 0 ? 1e3 * s.computeSec / static_cast<double>(s.steps) : 0,
             s.steps > 0 ? 1e3 * s.exposedCommSec / static_cast<double>(s.steps) : 0, 100 * commShare);
  fmt::print("  speedup vs 1 rank  {:.2f}x on {} ranks (one rank alone, measured before training: {:.0f} samples/s)\n",
             speedup, s.worldSize, s.oneRankSamplesPerSec);
  fmt::print("  bytes sent         {} in all, {} across regions; sync payload {} ({} on the wire)\n",
             human(static_cast<double>(s.worldBytesSent)), human(static_cast<double>(s.worldBytesCrossRegion)),
             human(static_cast<double>(s.worldPayloadBytes)), toString(cfg.wire));
  if (cfg.targetAccuracy > 0) {
    if (s.timeToTargetSec >= 0)
      fmt::print("  time to {:.1f}%      {:.1f} s\n", 100 * cfg.targetAccuracy, s.timeToTargetSec);
    else
      fmt::print("  time to {:.1f}%      not reached\n", 100 * cfg.targetAccuracy);
  }
  std::fflush(stdout);
}

void writeJson(const std::string& path, const TrainConfig& cfg, const TrainSummary& s, const std::string& backend) {
  nlohmann::json j{{"sync", toString(cfg.sync)},
                   {"ranks", s.worldSize},
                   {"regions", s.regionCount},
                   {"backend", backend},
                   {"steps", s.steps},
                   {"final_step", s.finalStep},
                   {"wall_s", s.wallSec},
                   {"compute_s", s.computeSec},
                   {"exposed_comm_s", s.exposedCommSec},
                   {"samples_per_s", s.samplesPerSec},
                   {"one_rank_samples_per_s", s.oneRankSamplesPerSec},
                   {"test_accuracy", s.testAccuracy},
                   {"test_loss", s.testLoss},
                   {"time_to_target_s", s.timeToTargetSec},
                   {"target_accuracy", cfg.targetAccuracy},
                   {"bytes_sent", s.worldBytesSent},
                   {"bytes_cross_region", s.worldBytesCrossRegion},
                   {"payload_bytes", s.worldPayloadBytes},
                   {"wire", toString(cfg.wire)},
                   {"inner_steps", cfg.innerSteps},
                   {"batch", cfg.globalBatch},
                   {"compute_nice", s.computeNice},
                   {"start_ranks", s.worldSizes.empty() ? s.worldSize : s.worldSizes.front()},
                   {"membership_changes", s.membershipChanges()},
                   {"world_sizes", s.worldSizes},
                   {"recovery_s", s.recoverySec}};
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) std::fprintf(stderr, "meridian-train: could not write %s\n", path.c_str());
}

// Elastic: the first SIGTERM asks this rank to leave (drain): it finishes its step, hands
// over at the next membership boundary and exits 0, and nobody sees an error. The handler
// then reverts to the default, so a second SIGTERM ends the process at once.
std::atomic<bool> gLeaveRequested{false};
void onLeaveSignal(int) { gLeaveRequested.store(true); }

Status handleLeaveSignal() {
  struct sigaction sa {};
  sa.sa_handler = onLeaveSignal;
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGTERM, &sa, nullptr) != 0) return internalError("cannot handle SIGTERM: {}", std::strerror(errno));
  return Status();
}

int runRank(const TrainConfig& given, const Args& a, SyncComm* external, const RankHook& onJoined) {
  TrainConfig cfg = given;
  // The backend first: a bad --device fails before anyone waits at the store.
  std::unique_ptr<kernels::Backend> backend;
  if (a.device == "cuda" || (a.device == "auto" && kernels::cudaAvailable())) {
    auto b = kernels::makeCudaBackend(0);
    if (!b.isOk()) {
      std::fprintf(stderr, "meridian-train: --device %s: %s\n", a.device.c_str(), b.status().message().c_str());
      return 2;
    }
    backend = std::move(b).value();
  } else if (a.device == "cpu" || a.device == "auto") {
    backend = kernels::makeCpuBackend(a.blasThreads);
  } else {
    std::fprintf(stderr, "meridian-train: --device '%s': expected cpu, cuda or auto\n", a.device.c_str());
    return 2;
  }
  TrainContext ctx;
  ctx.backend = backend.get();
  ctx.commOptions.elastic = a.elastic;
  ctx.external = external;
  bootstrap::LaunchInfo launch;
  // MERIDIAN_JOIN=on (meridian-lab restarting a node's rank) is --join.
  const Result<std::string> joinKnob = readKnobChoice(knobs::kJoin);
  if (!joinKnob.isOk()) {
    std::fprintf(stderr, "meridian-train: %s\n", joinKnob.status().message().c_str());
    return 2;
  }
  const bool join = external == nullptr && (a.join || joinKnob.value() == "on");
  if (external != nullptr) {
    launch.rank = external->rank();
    launch.worldSize = external->size();
  } else if (join) {
    // A joiner: the job's store and secret from the environment, and MERIDIAN_RANK (when set)
    // the job rank it asks for back.
    launch.storeAddress = knobString(knobs::kStore);
    if (launch.storeAddress.empty()) {
      std::fprintf(stderr, "meridian-train: --join needs MERIDIAN_STORE, the job's store (host:port)\n");
      return 2;
    }
    const Result<std::int64_t> wanted = readKnobInt(knobs::kRank);
    if (!wanted.isOk()) {
      std::fprintf(stderr, "meridian-train: %s\n", wanted.status().message().c_str());
      return 2;
    }
    launch.rank = static_cast<int>(wanted.value());
    launch.worldSize = 2;  // at least: it joins others
  } else {
    auto info = bootstrap::detectLaunch();
    if (!info.isOk()) {
      std::fprintf(stderr, "meridian-train: %s\n", info.status().message().c_str());
      return 2;
    }
    launch = *info;
  }
  log::setRank(launch.rank);
  // --compute-nice auto: by the launcher's count of ranks on this host, whichever launcher.
  // OpenBLAS's own threads started with the library and keep nice 0, so with more than one
  // of them lowering this thread alone would only slow its share of the GEMMs: auto stays 0.
  if (cfg.computeNice < 0 && (launch.localWorldSize > 0 || a.blasThreads != 1)) {
    cfg.computeNice = a.blasThreads == 1 && launch.localWorldSize > hostCores() ? kAutoComputeNice : 0;
  }
  if (Status st = checkConfig(cfg, launch.worldSize); !st.isOk()) {
    std::fprintf(stderr, "meridian-train rank %d: %s\n", launch.rank, st.message().c_str());
    return 2;
  }
  std::unique_ptr<collectives::Communicator> comm;
  if (a.elastic == "on" && external == nullptr) {
    ctx.rejoinStore = launch.storeAddress;
    if (cfg.joinCheckEvery > 0) {  // with no membership boundary, SIGTERM ends the rank as usual
      if (Status st = handleLeaveSignal(); !st.isOk()) {
        std::fprintf(stderr, "meridian-train: %s\n", st.message().c_str());
        return 1;
      }
      ctx.leaveRequested = &gLeaveRequested;
    }
  }
  if (join) {
    auto c = collectives::Communicator::join(launch.storeAddress, launch.rank, ctx.commOptions,
                                             Clock::now() + std::chrono::minutes(10));
    if (!c.isOk()) {
      std::fprintf(stderr, "meridian-train: could not join the job at %s: %s\n", launch.storeAddress.c_str(),
                   c.status().toString().c_str());
      return 1;
    }
    comm = std::move(c).value();
    ctx.comm = comm.get();
    ctx.joined = true;
  } else if (external == nullptr && launch.worldSize > 1) {
    auto c = collectives::Communicator::createFromEnvironment(ctx.commOptions);
    if (!c.isOk()) {
      std::fprintf(stderr, "meridian-train rank %d: could not join the job: %s\n", launch.rank,
                   c.status().toString().c_str());
      return 1;
    }
    comm = std::move(c).value();
    ctx.comm = comm.get();
    ctx.store = comm->store();
  }
  const std::shared_ptr<void> keep = onJoined ? onJoined(launch, comm.get()) : nullptr;
  auto result = train(cfg, ctx);
  if (!result.isOk()) {
    std::fprintf(stderr, "meridian-train rank %d: %s\n", launch.rank, result.status().toString().c_str());
    return result.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (result->left) {
    std::fprintf(stderr, "meridian-train rank %d: left the job at step %lld as asked; the others go on\n", launch.rank,
                 static_cast<long long>(result->finalStep));
    return 0;
  }
  if (result->rank == 0) {  // rank 0 of the membership at the end (job rank 0 may be gone)
    printSummary(cfg, *result, backend->describe());
    if (!a.jsonPath.empty()) writeJson(a.jsonPath, cfg, *result, backend->describe());
  }
  return 0;
}

}  // namespace

int trainCli(int argc, char** argv, SyncComm* external, const RankHook& onJoined) {
  Args a;
  TrainConfig cfg;
  CLI::App app{external == nullptr ? "meridian-train: data-parallel Fashion-MNIST training over Meridian"
                                    : "the meridian-train loop with its sync over another library (comparisons)"};
  if (external == nullptr) {
    app.add_option("--ranks,-N", a.ranks,
                   fmt::format("Start this many local ranks, 1..{} (else: one rank from the launcher's environment; "
                               "each local rank is a process meshed with every other, so more ranks belong on more "
                               "hosts, started by a launcher)",
                               kMaxLocalRanks))
        ->check(CLI::Range(1, kMaxLocalRanks));
    app.add_option("--regions", a.regions,
                   "With --ranks: each rank's MERIDIAN_REGION, comma-separated (e.g. eu,eu,us,us)");
  }
  app.add_option("--device", a.device, "cpu, cuda or auto (cuda when a GPU is visible)");
  app.add_option("--sync", a.sync, "ddp, diloco, hybrid or none");
  app.add_option("--model", a.model, "Layers, input to classes: dense widths (784-1024-1024-10), optionally conv blocks of N channels right after the input (784-c16-c32-128-10)");
  app.add_option("--activation", a.activation, "relu or gelu");
  app.add_option("--optimizer", a.optimizer, "Inner optimizer: adamw or sgd (diloco: always adamw)");
  app.add_option("--lr", cfg.lr, "Inner learning rate")->check(finiteIn(0, true, kMaxLr, false));
  app.add_option("--momentum", cfg.momentum, "SGD momentum")->check(finiteIn(0, false, 1, true));
  app.add_option("--weight-decay", cfg.weightDecay, "SGD: L2; AdamW: decoupled weight decay")
      ->check(finiteIn(0, false, 1, false));
  app.add_option("--batch", cfg.globalBatch, "Global batch (split evenly over the ranks)")
      ->check(CLI::Range(1, kMaxGlobalBatch));
  app.add_option("--epochs", cfg.epochs, "Epochs over the training set")->check(CLI::Range(1, kMaxEpochs));
  app.add_option("--max-steps", cfg.maxSteps, "Stop after this many steps (0: run the epochs)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{INT64_MAX}));
  app.add_option("--inner-steps,-H", cfg.innerSteps, "diloco/hybrid: local steps between outer syncs")
      ->check(CLI::Range(1, kMaxInnerSteps));
  app.add_option("--outer-lr", cfg.outer.lr, "diloco/hybrid: outer Nesterov learning rate")
      ->check(finiteIn(0, true, kMaxLr, false));
  app.add_option("--outer-momentum", cfg.outer.momentum, "diloco/hybrid: outer Nesterov momentum")
      ->check(finiteIn(0, false, 1, true));
  app.add_option("--wire", a.wire, "Sync payload on the wire: f32, bf16 (all modes) or int8 (diloco)");
  app.add_option("--bucket-mb", cfg.bucketMb, "ddp/hybrid: gradient bucket size in MiB")
      ->check(finiteIn(0, true, kMaxBucketMb, false));
  app.add_option("--seed", cfg.seed, "Seed of the initial weights and the data order");
  app.add_option("--data-dir", cfg.dataDir, "Fashion-MNIST IDX files (default: Debian's dataset-fashion-mnist)");
  app.add_option("--checkpoint-dir", cfg.checkpointDir, "Write checkpoints here (one folder per rank)");
  app.add_option("--checkpoint-every", cfg.checkpointEvery, "Steps between checkpoints (0: at the end only)")
      ->check(CLI::Range(0, INT_MAX));
  app.add_flag("--resume", cfg.resume, "Continue from the newest checkpoint every rank holds");
  app.add_option("--log-every", cfg.logEvery, "Steps between progress lines")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", cfg.evalEvery, "Steps between test evaluations (0: every epoch)")
      ->check(CLI::Range(0, INT_MAX));
  app.add_option("--target-accuracy", cfg.targetAccuracy, "Report the time to this test accuracy, in (0, 1]")
      ->check(finiteIn(0, true, 1, false));
  app.add_flag("--stop-at-target", cfg.stopAtTarget, "Stop once an evaluation reached --target-accuracy");
  app.add_option("--json", a.jsonPath, "Write the summary as JSON here (rank 0)");
  app.add_option("--blas-threads", a.blasThreads, "OpenBLAS threads per rank (cpu)")->check(CLI::Range(1, 1024));
  app.add_option("--compute-nice", a.computeNice,
                 "Nice value of the compute thread, 0..19, so that communication goes first when cores are "
                 "short; auto: " + std::to_string(kAutoComputeNice) + " when this host runs more ranks than cores, else 0");
  app.add_option("--bind", a.bind,
                 "--ranks: cpus binds each rank to its own share of the CPUs this process may use (as mpirun "
                 "--bind-to core; taskset/numactl the launcher to pick them), none leaves placement to the scheduler")
      ->check(CLI::IsMember({"cpus", "none"}));
  app.add_option("--elastic", a.elastic,
                 "on: training goes on when ranks are lost (the survivors agree on the membership, take a successor "
                 "communicator and redo the step that was cut; docs/elastic.md); off: a lost rank stops the run")
      ->check(CLI::IsMember({"on", "off"}));
  if (external == nullptr) {
    app.add_flag("--join", a.join,
                 "Join a running elastic job (its store in MERIDIAN_STORE, its secret in MERIDIAN_SECRET; "
                 "MERIDIAN_RANK asks for that job rank back): the members admit it at their next check and hand it "
                 "the step and the state");
  }
  app.add_option("--join-check-every", cfg.joinCheckEvery,
                 "Elastic: steps between the membership boundaries, where ranks waiting to join come in and ranks "
                 "sent SIGTERM leave (drain); with an outer sync (diloco, hybrid) the nearest multiple of -H. 0: "
                 "none (nobody joins, SIGTERM ends a rank at once)")
      ->check(CLI::Range(0, INT_MAX));
  app.add_flag("--quiet", cfg.quiet, "No progress lines");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; anything else is bad input, exit 2 as documented.
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto fail = [](const Status& st) {
    std::fprintf(stderr, "meridian-train: %s\n", st.message().c_str());
    return 2;
  };
  if (const Status st = parseModel(a.model, &cfg.model); !st.isOk()) return fail(st);
  if (a.activation == "relu") cfg.model.activation = kernels::Activation::kRelu;
  else if (a.activation == "gelu") cfg.model.activation = kernels::Activation::kGelu;
  else return fail(invalidArgument("--activation '{}': expected relu or gelu", a.activation));
  auto sync = parseSyncMode(a.sync);
  if (!sync.isOk()) return fail(sync.status());
  cfg.sync = *sync;
  auto opt = parseOptimizer(a.optimizer);
  if (!opt.isOk()) return fail(opt.status());
  cfg.optimizer = *opt;
  auto wire = parseWire(a.wire);
  if (!wire.isOk()) return fail(wire.status());
  cfg.wire = *wire;
  if (a.computeNice != "auto") {
    int nice = -1;
    const auto [end, ec] = std::from_chars(a.computeNice.data(), a.computeNice.data() + a.computeNice.size(), nice);
    if (ec != std::errc() || end != a.computeNice.data() + a.computeNice.size() || nice < 0 || nice > 19)
      return fail(invalidArgument("--compute-nice '{}': expected auto or 0..19", a.computeNice));
    cfg.computeNice = nice;
  }

  try {
    if (a.ranks > 0) {
      LocalLaunchOptions lo;
      lo.ranks = a.ranks;
      lo.argv = relaunchArgv(argc, argv, {"--ranks", "-N", "--regions", "--bind"});
      lo.bindCpus = a.bind == "cpus";
      lo.elastic = a.elastic == "on";
      std::vector<std::string> regions;
      if (!a.regions.empty()) {
        regions = splitCommaList(a.regions);
        if (regions.size() != static_cast<std::size_t>(a.ranks))
          return fail(invalidArgument("--regions names {} regions for {} ranks", regions.size(), a.ranks));
      }
      // Without a job secret the launcher invents one per launch: checkpoints must verify in
      // the next launch too, so they are signed with the checkpoint directory's key file.
      std::string checkpointSecret;
      if (!knobIsSet(knobs::kSecret) && !knobIsSet(knobs::kSecretFile) && !knobIsSet(knobs::kCheckpointSecret) &&
          !cfg.checkpointDir.empty()) {
        auto key = checkpointKeyFile(cfg.checkpointDir);
        if (!key.isOk()) return fail(key.status());
        checkpointSecret = key.value();
      }
      lo.rankEnv = [regions, checkpointSecret](int rank) {
        std::vector<std::pair<std::string, std::string>> env;
        if (!regions.empty()) env.emplace_back("MERIDIAN_REGION", regions[static_cast<std::size_t>(rank)]);
        if (!checkpointSecret.empty()) env.emplace_back("MERIDIAN_CHECKPOINT_SECRET", checkpointSecret);
        return env;
      };
      const Result<int> worst = launchLocalRanks(lo);
      if (!worst.isOk()) return fail(worst.status());
      return worst.value();
    }
    return runRank(cfg, a, external, onJoined);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meridian-train: %s\n", e.what());
    return 1;
  }
}

}  // namespace meridian::trainer
