#include "trainer/trainer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/local_launch.h"
#include "core/log.h"
#include "core/metrics.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/integrity.h"
#include "trainer/thread_maker.h"

namespace meridian::trainer {
namespace {

using collectives::Communicator;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// How long a survivor waits for the successor communicator (the agreement takes at most a
// few peer timeouts; its set-up, one connection round per pair).
constexpr auto kSuccessorWait = std::chrono::minutes(2);
// How long a rank the others went on without keeps asking to join again (a cut region waits
// for its network), and how long the members give joiners to connect once admitted.
constexpr auto kRejoinWait = std::chrono::minutes(10);
constexpr auto kAdmitWait = std::chrono::seconds(60);
// How often a rank asks to join again when its admission fell through.
constexpr int kJoinAttempts = 4;
// The state handed to ranks that need it (handState) travels in pieces of this size, each
// passed on down the chain as soon as it arrived.
constexpr std::size_t kStatePieceBytes = std::size_t{1} << 20;
// The point-to-point tag of those pieces.
constexpr std::uint32_t kStateTag = 0x57a7e;

Counter& membershipChanges() {
  return MetricsRegistry::global().counter("meridian_trainer_membership_changes_total",
                                           "Membership changes the training went on through (ranks lost)");
}

Gauge& worldSizeGauge() {
  return MetricsRegistry::global().gauge("meridian_trainer_world_size",
                                         "Ranks this rank trains with (0 while it is out of the job and asks to join again)");
}

Histogram& recoverySeconds() {
  return MetricsRegistry::global().histogram(
      "meridian_trainer_recovery_seconds",
      "Time from a collective cut by a lost rank to the survivors' agreed state on the successor",
      {}, exponentialBuckets(0.01, 2, 14));
}

// Fashion-MNIST's pixel mean and standard deviation (training set, pixels scaled to [0, 1]).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

// One communicator the trainer uses, with the world rank of each of its members (to tell
// which peers are in another region when counting bytes).
struct CommUse {
  Communicator* comm = nullptr;
  std::vector<int> worldRanks;
};

struct Metrics {
  Gauge& loss;
  Gauge& trainAccuracy;
  Gauge& testAccuracy;
  Gauge& samplesPerSec;
  Counter& steps;
  Counter& payloadBytes;
  Histogram& compute;
  Histogram& exposed;

  Metrics(int rank, SyncMode mode)
      : loss(reg().gauge("meridian_trainer_loss", "Mean training loss over the last logging interval", labels(rank, mode))),
        trainAccuracy(reg().gauge("meridian_trainer_train_accuracy_ratio",
                                  "Training-batch accuracy over the last logging interval", labels(rank, mode))),
        testAccuracy(reg().gauge("meridian_trainer_test_accuracy_ratio", "Test-set accuracy at the last evaluation",
                                 labels(rank, mode))),
        samplesPerSec(reg().gauge("meridian_trainer_samples_per_second",
                                  "Global training samples per second over the last logging interval", labels(rank, mode))),
        steps(reg().counter("meridian_trainer_steps_total", "Optimizer steps taken", labels(rank, mode))),
        payloadBytes(reg().counter("meridian_trainer_sync_payload_bytes_total",
                                   "Gradient and pseudo-gradient bytes this rank handed to collectives",
                                   labels(rank, mode))),
        compute(reg().histogram("meridian_trainer_step_compute_seconds", "Forward, backward and optimizer time per step",
                                labels(rank, mode), exponentialBuckets(0.001, 2, 16))),
        exposed(reg().histogram("meridian_trainer_step_exposed_comm_seconds",
                                "Time per step spent waiting for communication after compute", labels(rank, mode),
                                exponentialBuckets(0.0001, 2, 20))) {}

  static MetricsRegistry& reg() { return MetricsRegistry::global(); }
  static MetricLabels labels(int rank, SyncMode mode) {
    return {{"rank", std::to_string(rank)}, {"sync", std::string(toString(mode))}};
  }
};

// The optimizer of the local (inner) steps.
class Optimizer {
 public:
  Optimizer(kernels::Backend& backend, OptimizerKind kind, std::size_t n, const TrainConfig& cfg)
      : backend_(backend), kind_(kind), n_(n) {
    sgd_.lr = cfg.lr;
    sgd_.momentum = cfg.momentum;
    sgd_.weightDecay = cfg.weightDecay;
    adam_.lr = cfg.lr;
    adam_.weightDecay = cfg.weightDecay;
    first_ = static_cast<float*>(backend_.alloc(n * sizeof(float)));
    if (kind_ == OptimizerKind::kAdamW) second_ = static_cast<float*>(backend_.alloc(n * sizeof(float)));
  }
  ~Optimizer() {
    backend_.free(second_);
    backend_.free(first_);
  }
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step(float* w, const float* g) {
    beginStep();
    stepRange(w, g, 0, n_);
  }
  // One step in pieces: beginStep, then stepRange over ranges that cover [0, n) once each
  // (in any order; every update is per element, so the result is the same as step()).
  void beginStep() { ++steps_; }
  void stepRange(float* w, const float* g, std::size_t begin, std::size_t end) {
    MERIDIAN_CHECK(begin <= end && end <= n_);
    const std::size_t n = end - begin;
    if (kind_ == OptimizerKind::kSgd) {
      backend_.sgdStep(w + begin, g + begin, first_ + begin, n, sgd_);
    } else {
      backend_.adamwStep(w + begin, g + begin, first_ + begin, second_ + begin, n, adam_, steps_);
    }
  }
  OptimizerKind kind() const { return kind_; }
  float* first() { return first_; }
  float* second() { return second_; }
  std::int64_t steps() const { return steps_; }
  void setSteps(std::int64_t s) { steps_ = s; }

 private:
  kernels::Backend& backend_;
  OptimizerKind kind_;
  std::size_t n_;
  kernels::SgdParams sgd_;
  kernels::AdamWParams adam_;
  float* first_ = nullptr;   // SGD velocity / AdamW first moment
  float* second_ = nullptr;  // AdamW second moment
  std::int64_t steps_ = 0;
};

std::vector<std::uint8_t> bytesOf(kernels::Backend& backend, const float* p, std::size_t n) {
  std::vector<std::uint8_t> out(n * sizeof(float));
  backend.copyToHost(out.data(), p, out.size());
  return out;
}

Status restoreFloats(kernels::Backend& backend, const Checkpoint& ck, const char* name, float* dst, std::size_t n) {
  const CheckpointSection* s = ck.find(name);
  if (s == nullptr || s->data.size() != n * sizeof(float))
    return invalidArgument("{}: section '{}' is missing or has {} bytes (want {})", ck.path, name,
                           s == nullptr ? 0 : s->data.size(), n * sizeof(float));
  backend.copyToDevice(dst, s->data.data(), s->data.size());
  return Status();
}

// What must match between a checkpoint and the run resuming from it.
nlohmann::json identity(const TrainConfig& cfg, int rank, int world) {
  return {{"widths", cfg.model.widths},
          {"conv", cfg.model.convChannels},
          {"activation", cfg.model.activation == kernels::Activation::kRelu ? "relu" : "gelu"},
          {"sync", toString(cfg.sync)},
          {"optimizer", cfg.optimizer == OptimizerKind::kSgd ? "sgd" : "adamw"},
          {"global_batch", cfg.globalBatch},
          {"world", world},
          {"rank", rank},
          {"seed", cfg.seed},
          {"inner_steps", cfg.innerSteps}};
}

// Hybrid's communicators, split from a world communicator: one per region (every step) and
// one per local index across regions.
struct HybridComms {
  std::unique_ptr<Communicator> region, cross;
  std::vector<int> regionRanks, crossRanks;  // their members' world ranks
  std::vector<int> regionOf;                 // per world rank
  bool relayOuter = false;                   // this region relays the outer step (uneven regions)
};

// Collective over `world`: the regions routing assigned to it, one snapshot for the grouping
// and the names; a membership change may leave them uneven: the cross-region communicators
// then cover the local indices every region has, and a rank past them sits out the
// cross-region sync and takes its result from its region's first rank (relayOuter).
Result<HybridComms> splitForHybrid(Communicator& world) {
  const routing::RegionAssignment regions = world.regions();
  const int size = world.size();
  const int rank = world.rank();
  if (regions.regionOf.size() != static_cast<std::size_t>(size)) {
    return invalidArgument("--sync hybrid needs regions: set MERIDIAN_REGION on every rank");
  }
  HybridComms h;
  h.regionOf = regions.regionOf;
  std::vector<std::vector<int>> members(static_cast<std::size_t>(*std::max_element(h.regionOf.begin(), h.regionOf.end())) + 1);
  for (int r = 0; r < size; ++r) members[static_cast<std::size_t>(h.regionOf[static_cast<std::size_t>(r)])].push_back(r);
  std::size_t common = members.front().size();
  for (const auto& m : members) common = std::min(common, m.size());
  const int myRegion = h.regionOf[static_cast<std::size_t>(rank)];
  const auto& mine = members[static_cast<std::size_t>(myRegion)];
  const int localIndex = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  // Split from the world communicator: when its membership changes they stop with it.
  MERIDIAN_ASSIGN_OR_RETURN(h.region, world.split(myRegion, "in"));  // metrics "in<rank>", "x<rank>"
  h.regionRanks = mine;
  const bool crosses = static_cast<std::size_t>(localIndex) < common;
  MERIDIAN_ASSIGN_OR_RETURN(h.cross, world.split(crosses ? localIndex : -1 - rank, "x"));
  if (crosses) {
    for (const auto& m : members) h.crossRanks.push_back(m[static_cast<std::size_t>(localIndex)]);
  } else {
    h.crossRanks.push_back(rank);
  }
  h.relayOuter = mine.size() > common;
  // Their per-peer series name the peers' regions, as the world communicator's do.
  for (const auto& [comm, ranks] : {std::pair{h.region.get(), &h.regionRanks}, std::pair{h.cross.get(), &h.crossRanks}}) {
    std::vector<std::string> memberRegions;
    for (int r : *ranks) {
      const auto region = static_cast<std::size_t>(h.regionOf[static_cast<std::size_t>(r)]);
      memberRegions.push_back(region < regions.names.size() ? regions.names[region] : "");
    }
    comm->labelPeerMetrics(memberRegions);
  }
  return h;
}

class Run {
 public:
  Run(const TrainConfig& cfg, const TrainContext& ctx) : cfg_(cfg), ctx_(ctx), backend_(*ctx.backend), comm_(ctx.comm) {
    if (ctx.comm != nullptr) {
      worldSync_ = std::make_unique<MeridianSyncComm>(*ctx.comm);
      sync_ = worldSync_.get();
    } else {
      sync_ = ctx.external;
    }
    rank_ = sync_ != nullptr ? sync_->rank() : 0;
    world_ = sync_ != nullptr ? sync_->size() : 1;
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() {
    if (admission_) dropAdmission("the run ended");
    for (auto& a : dropped_) a->worker.join();
    for (auto& r : reapers_) r->worker.join();
  }
  Result<TrainSummary> go();
  // After go() failed on this rank: an elastic world communicator is given up (the others
  // lose this rank and go on without it, instead of waiting on a rank that only closed).
  void giveUp(const Status& why) {
    if (elastic()) comm_->abandon(why);
  }

 private:
  Status setUpSync();
  // Applies cfg_.computeNice to this thread (after setUpSync: the communicator's threads,
  // started there, keep the nice value they were born with) and records it in nice_.
  void lowerComputePriority();
  // The nice value computing runs at (--compute-nice; auto: kAutoComputeNice when the local
  // ranks outnumber the cores, else 0).
  int computeNice() const;
  // Runs `work` on a thread of its own at that nice value, and waits for it: work done before
  // the compute thread's priority drops (the communicator's threads must not inherit it).
  Status atComputePriority(const std::function<Status()>& work);
  // Normalised images and labels of `indices` into `model`'s input (rows <= hostRows_).
  void fillBatch(Model& model, const Dataset& data, const std::uint32_t* indices, int rows);
  Status evaluate(double* accuracy, double* loss);
  // Seconds one rank alone takes for a step of the whole global batch (forward, backward,
  // optimizer; the best of three on a scratch model), the baseline of the speedup figure.
  double oneRankStepSec(const std::vector<std::uint32_t>& order);
  // Loads both splits on every rank and checks that all ranks decoded the same bytes.
  Status loadData();
  // Fails every rank when weights (host copies of the float sections) are not finite on
  // any rank, naming it: nothing is saved from them. A collective on the world.
  Status checkFiniteEverywhere(std::int64_t step, const std::vector<CheckpointSection>& sections);
  // What a checkpoint would hold now (host copies).
  std::vector<CheckpointSection> checkpointSections(std::int64_t step);
  Status saveCheckpoint(std::int64_t step);
  Result<std::int64_t> resumeStep();
  // Restores this rank's checkpoint of `step` (no collective); returns it.
  Result<Checkpoint> loadCheckpoint(std::int64_t step);
  // resumeStep, loadCheckpoint on every rank, then checkResumedAlike; returns the step.
  Result<std::int64_t> resume();
  // After a resume: the state that the sync mode keeps equal across ranks is equal.
  Status checkResumedAlike(const Checkpoint& ck);
  // Every rank learns whether any rank's `mine` failed, so that all stop together rather
  // than leave the others in the next collective: this rank's own error, else one saying
  // "rank(s) <list> <what>".
  Status agreeOnFailure(const Status& mine, std::string_view what);
  // The error of a run that diverged at `step`: `what` went bad (not finite).
  Status diverged(std::int64_t step, const std::string& what) const;
  // This rank's transport bytes to every peer, and to peers in other regions.
  std::pair<std::uint64_t, std::uint64_t> transportBytes() const;
  bool innerOnly() const { return cfg_.sync == SyncMode::kDiloco || cfg_.sync == SyncMode::kNone; }
  // This rank's rows of a global batch: [G r / n, G (r + 1) / n) (G / n each while n divides G).
  int batchBegin() const {
    return static_cast<int>(static_cast<std::int64_t>(cfg_.globalBatch) * rank_ / world_);
  }
  int localBatch() const {
    return static_cast<int>(static_cast<std::int64_t>(cfg_.globalBatch) * (rank_ + 1) / world_) - batchBegin();
  }
  // Survives lost ranks: the world communicator is elastic (hybrid's region and cross-region
  // communicators are split from it, and split anew after each membership change).
  bool elastic() const { return comm_ != nullptr && comm_->elastic(); }
  // Hybrid: binds the region and cross-region communicators split from the world
  // communicator in force, and the syncs over them.
  Status setUpHybrid(HybridComms made);
  // The outer sync, and for a rank of a region larger than the smallest, its result from
  // the region's first rank.
  Status syncOuter();
  // After a collective failed with `failure` (elastic): takes the successor communicator,
  // binds the sync to it, and brings every survivor to the state of the one furthest ahead.
  // Positions say where a rank's state is: 2s after s whole steps (at a boundary, or cut in
  // step s + 1), 2s - 1 after the inner part of step s with its outer sync still to do
  // (DiLoCo). Returns the position every survivor goes on from (the largest; the others took
  // that rank's state); the failure itself when there is no successor and no way back in.
  // `since`: when the work that was cut began (what the change cost is counted from there).
  Result<std::int64_t> recover(const Status& failure, std::int64_t position, Clock::time_point since);
  // What a rank's training state is, by checkpoint section name: parameters, the optimizer's
  // moments, DiLoCo's anchor and momentum (paramCount floats each, backend memory).
  std::vector<std::pair<const char*, float*>> stateParts() const;
  // `source`'s state (stateParts and the optimizer's step count) to the ranks in `targets`
  // (ascending, without `source`), which take it in; the others keep their own. Point to
  // point along a chain, source -> targets[0] -> targets[1] ..., each piece passed on as it
  // arrives: one copy per hop, so the joiners of one region take one copy over the WAN
  // between them, and ranks that keep their state take none. Each target checks the SHA-256
  // the source appended. `agree`: a collective, after which every rank knows whether all
  // targets took it (else only a target that could not fails).
  Status handState(int source, const std::vector<int>& targets, bool agree);
  // handState's part on the source and the target at `index` of `targets`.
  Status passStateOn(int source, const std::vector<int>& targets, std::ptrdiff_t index);
  // `parts` (paramCount floats each, backend memory) from `source` to every rank of `comm`
  // through a host copy, taken in by every rank.
  Status broadcastParts(Communicator& comm, const std::vector<float*>& parts, int source);
  // Runs `op`, a collective at a boundary (an evaluation, a checkpoint, the joiners' check)
  // at `position`. True when a lost rank cut it: it is not run again, and every survivor goes
  // on from `*agreed` (recover).
  Result<bool> atBoundary(const std::function<Status()>& op, std::int64_t position, std::int64_t* agreed);
  // Makes `next` the world communicator (owned here): the sync modes, ranks and regions
  // follow it; hybrid's communicators are `children` when given (split from `next`), else
  // split here. An admission under way is dropped (it was planned over the old one).
  Status bindTo(std::unique_ptr<Communicator> next, std::optional<HybridComms> children = std::nullopt);
  // After a membership change (on every member and joiner, after a barrier on the new
  // communicator: the joiners ready): every rank learns rank 0's step and checks it decoded
  // the same data; the joiners take rank 0's state. `joiners`: how many joined, on the
  // members (a joiner passes 0 and learns it from rank 0).
  Status welcome(std::int64_t* step, int joiners);
  // A joiner's side, on its new communicator: the barrier that tells the members it is ready
  // (they take their build as done once it passed), then the welcome.
  Status arrive(std::int64_t* step) {
    MERIDIAN_RETURN_IF_ERROR(comm_->barrier());
    return welcome(step, /*joiners=*/0);
  }
  // Members, at a step boundary: admits the ranks waiting to join and lets go of the ones
  // asking to leave (ctx.leaveRequested), if any; `*left` turns true on a rank that left.
  // Joiners are admitted without stopping: the grown communicator (and hybrid's, split from
  // it) is built on a thread while the members train on, and they switch to it at the first
  // boundary where every member has it (admission_).
  Status changeMembership(std::int64_t* step, bool* left);
  // Destroys `going` (in order: children before their parent) on a thread of its own:
  // closing a healthy channel waits for the peer to acknowledge what it was sent, a WAN
  // round trip or more that the training need not wait for.
  void destroyAside(std::vector<std::unique_ptr<Communicator>> going);
  // The switch: the grown communicator in force, the joiners welcomed.
  Status admit(std::int64_t* step, Clock::time_point start);
  // Cancels the admission under way (`why` logged): every member's build fails soon; the
  // worker is joined later (dropped_), without waiting here.
  void dropAdmission(const std::string& why);
  // A rank the others went on without asks to join again (ctx.rejoinStore).
  Result<std::int64_t> rejoin(const Status& why);
  void log(const std::string& line) const {
    if (rank_ == 0 && !cfg_.quiet) fmt::print("{}\n", line), std::fflush(stdout);
  }

  const TrainConfig& cfg_;
  const TrainContext& ctx_;
  int nice_ = 0;  // the compute thread's nice value in force
  kernels::Backend& backend_;
  Communicator* comm_ = nullptr;  // the world communicator in force (null for one rank)
  std::vector<std::unique_ptr<Communicator>> successors_;  // the ones membership changes made
  double recoverySec_ = 0;
  std::vector<int> worldSizes_;  // at the start and after each membership change
  Sha256 dataDigest_{};
  int rank_ = 0;
  int world_ = 1;
  Dataset train_, test_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<MeridianSyncComm> worldSync_;
  SyncComm* sync_ = nullptr;  // the world's collectives (Meridian's, or ctx.external)
  std::unique_ptr<Communicator> regionComm_, crossComm_;
  std::unique_ptr<MeridianSyncComm> regionSync_, crossSync_;
  bool relayOuter_ = false;  // hybrid, uneven regions: this region relays the outer step
  std::unique_ptr<GradientSync> gradSync_;
  std::unique_ptr<OuterSync> outerSync_;
  std::vector<CommUse> comms_;
  std::vector<int> regionOf_;  // per world rank; empty when unknown
  std::vector<float> hostInput_;
  std::vector<std::int32_t> hostLabels_;
  // A thread of the run's own whose end is known without waiting for it.
  struct Background {
    std::thread worker;
    std::atomic<bool> done{false};
    // Joins it when it ended; false (and nothing waited for) while it runs.
    bool joinIfEnded() {
      if (!done.load(std::memory_order_acquire)) return false;
      worker.join();
      return true;
    }
  };
  // An admission under way: the members' build of the grown communicator, on `worker`.
  struct Admission : Background {
    std::unique_ptr<Communicator::MembershipChange> change;
    // The worker's, read once done.
    Status status;
    std::unique_ptr<Communicator> grown;
    std::optional<HybridComms> children;
    Clock::time_point planned;  // when the members planned it
    std::int64_t step = 0;      // the boundary it was planned at
  };
  std::unique_ptr<Admission> admission_;
  std::vector<std::unique_ptr<Admission>> dropped_;  // cancelled; their workers end soon
  std::vector<std::unique_ptr<Background>> reapers_;  // destroying retired communicators
  ThreadMaker threads_;  // communicators are built on its threads
  CheckpointKey checkpointKey_{};
  std::int64_t lastCheckpointStep_ = -1;  // the newest checkpoint written or resumed from
};

namespace {

// Lowers the calling thread to nice `want` (a nice value belongs to a thread on Linux);
// returns the value it runs at, or -1 when it could not.
int lowerThisThread(int want) {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && now >= want) return now;
  if (::setpriority(PRIO_PROCESS, tid, want) != 0) return -1;
  return want;
}

}  // namespace

int Run::computeNice() const {
  return cfg_.computeNice >= 0 ? cfg_.computeNice : (localRanksOutnumberCores() ? kAutoComputeNice : 0);
}

void Run::lowerComputePriority() {
  const int want = computeNice();
  if (want == 0) return;
  const int got = lowerThisThread(want);
  if (got < 0) {
    MLOG_WARN(kTrainer, "could not lower the compute thread to nice {}: {}", want, std::strerror(errno));
    return;
  }
  nice_ = got;
}

Status Run::atComputePriority(const std::function<Status()>& work) {
  const int want = computeNice();
  if (want == 0) return work();
  Status st;
  std::thread([&] {
    (void)lowerThisThread(want);  // if not, the work runs as this thread would
    st = work();
  }).join();
  return st;
}

Status Run::setUpSync() {
  Communicator* world = comm_;
  if (world != nullptr) {
    std::vector<int> all(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r) all[static_cast<std::size_t>(r)] = r;
    comms_.push_back(CommUse{world, all});
    const routing::RegionAssignment regions = world->regions();
    if (regions.regionOf.size() == static_cast<std::size_t>(world_)) regionOf_ = regions.regionOf;
  }
  const std::size_t bucketBytes = static_cast<std::size_t>(cfg_.bucketMb * 1024 * 1024);
  switch (cfg_.sync) {
    case SyncMode::kNone: return Status();
    case SyncMode::kDdp: {
      MERIDIAN_ASSIGN_OR_RETURN(gradSync_, GradientSync::create(backend_, sync_, *model_, bucketBytes, cfg_.wire));
      return Status();
    }
    case SyncMode::kDiloco:
      outerSync_ = std::make_unique<OuterSync>(backend_, sync_, *model_, cfg_.outer, cfg_.wire);
      return Status();
    case SyncMode::kHybrid: break;
  }
  // Hybrid: one communicator per region (every step) and one per local index across regions.
  if (ctx_.external != nullptr) return invalidArgument("--sync hybrid runs on Meridian communicators only");
  if (world == nullptr || regionOf_.empty()) {
    if (world != nullptr) return invalidArgument("--sync hybrid needs regions: set MERIDIAN_REGION on every rank");
    MERIDIAN_ASSIGN_OR_RETURN(gradSync_, GradientSync::create(backend_, nullptr, *model_, bucketBytes, cfg_.wire));
    outerSync_ = std::make_unique<OuterSync>(backend_, nullptr, *model_, cfg_.outer, Wire::kF32);
    return Status();
  }
  const int regionCount = *std::max_element(regionOf_.begin(), regionOf_.end()) + 1;
  if (regionCount < 2)
    return invalidArgument("--sync hybrid needs ranks in at least two regions, and all {} ranks are in one: set "
                           "MERIDIAN_REGION on every rank (meridian-lab does; meridian-train --ranks takes --regions)",
                           world_);
  outerSync_ = std::make_unique<OuterSync>(backend_, nullptr, *model_, cfg_.outer, cfg_.wire);
  MERIDIAN_ASSIGN_OR_RETURN(HybridComms made, splitForHybrid(*world));
  MERIDIAN_RETURN_IF_ERROR(setUpHybrid(std::move(made)));
  log(fmt::format("hybrid: {} regions of {} ranks; gradients averaged in the region every step, models across "
                  "regions every {} steps",
                  regionCount, regionComm_->size(), cfg_.innerSteps));
  return Status();
}

Status Run::setUpHybrid(HybridComms made) {
  regionOf_ = std::move(made.regionOf);
  regionComm_ = std::move(made.region);
  crossComm_ = std::move(made.cross);
  comms_.push_back(CommUse{regionComm_.get(), std::move(made.regionRanks)});
  comms_.push_back(CommUse{crossComm_.get(), std::move(made.crossRanks)});
  relayOuter_ = made.relayOuter;
  regionSync_ = std::make_unique<MeridianSyncComm>(*regionComm_);
  crossSync_ = std::make_unique<MeridianSyncComm>(*crossComm_);
  const std::size_t bucketBytes = static_cast<std::size_t>(cfg_.bucketMb * 1024 * 1024);
  MERIDIAN_ASSIGN_OR_RETURN(gradSync_, GradientSync::create(backend_, regionComm_->size() > 1 ? regionSync_.get() : nullptr,
                                                             *model_, bucketBytes, cfg_.wire));
  outerSync_->rebind(crossComm_->size() > 1 ? crossSync_.get() : nullptr);
  return Status();
}

Status Run::syncOuter() {
  MERIDIAN_RETURN_IF_ERROR(outerSync_->sync());
  if (!relayOuter_) return Status();
  // Uneven regions: every rank of this region takes the outer step's result from its first
  // rank (that one's cross-region sync covered every region), bit for bit.
  return broadcastParts(*regionComm_, {model_->params(), outerSync_->anchor(), outerSync_->velocity()}, 0);
}

Status Run::broadcastParts(Communicator& comm, const std::vector<float*>& parts, int source) {
  const std::size_t n = model_->paramCount();
  std::vector<float> host(n);
  for (float* part : parts) {
    backend_.copyToHost(host.data(), part, n * sizeof(float));
    MERIDIAN_RETURN_IF_ERROR(comm.broadcast(host.data(), host.data(), n, kernels::DataType::kF32, source));
    backend_.copyToDevice(part, host.data(), n * sizeof(float));
  }
  return Status();
}

void Run::fillBatch(Model& model, const Dataset& data, const std::uint32_t* indices, int rows) {
  const std::size_t f = data.features();
  for (int i = 0; i < rows; ++i) {
    const std::size_t idx = indices[i];
    const std::uint8_t* px = data.images.data() + idx * f;
    float* out = hostInput_.data() + static_cast<std::size_t>(i) * f;
    for (std::size_t j = 0; j < f; ++j) out[j] = (static_cast<float>(px[j]) * (1.0f / 255.0f) - kPixelMean) / kPixelStd;
    hostLabels_[static_cast<std::size_t>(i)] = data.labels[idx];
  }
  backend_.stageToDevice(model.input(), hostInput_.data(), static_cast<std::size_t>(rows) * f * sizeof(float));
  backend_.stageToDevice(model.labels(), hostLabels_.data(), static_cast<std::size_t>(rows) * sizeof(std::int32_t));
}

Status Run::evaluate(double* accuracy, double* loss) {
  // Each rank scores its slice of the test set; the sums are added up over the world.
  const std::size_t lo = test_.count * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(world_);
  const std::size_t hi = test_.count * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(world_);
  std::vector<std::uint32_t> idx(static_cast<std::size_t>(model_->maxBatch()));
  double sums[3] = {0, 0, static_cast<double>(hi - lo)};
  for (std::size_t pos = lo; pos < hi;) {
    const int rows = static_cast<int>(std::min<std::size_t>(hi - pos, idx.size()));
    for (int i = 0; i < rows; ++i) idx[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(pos) + static_cast<std::uint32_t>(i);
    fillBatch(*model_, test_, idx.data(), rows);
    const kernels::LossStats s = model_->forward(rows);
    sums[0] += s.lossSum;
    sums[1] += static_cast<double>(s.correct);
    pos += static_cast<std::size_t>(rows);
  }
  if (sync_ != nullptr)
    MERIDIAN_RETURN_IF_ERROR(sync_->allreduce(sums, 3, kernels::DataType::kF64, kernels::ReduceOp::kSum));
  *accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  return Status();
}

double Run::oneRankStepSec(const std::vector<std::uint32_t>& order) {
  Model scratch(backend_, cfg_.model, cfg_.globalBatch, cfg_.seed);
  Optimizer opt(backend_, opt_->kind(), scratch.paramCount(), cfg_);
  fillBatch(scratch, train_, order.data(), cfg_.globalBatch);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const auto t = Clock::now();
    scratch.forwardBackward(cfg_.globalBatch, 1.0f, nullptr);
    opt.step(scratch.params(), scratch.grads());
    backend_.synchronize();
    if (i > 0) best = std::min(best, secondsSince(t));  // the first one warms the caches
  }
  return best;
}

std::string rankDir(const std::string& base, int rank) { return fmt::format("{}/rank-{}", base, rank); }

std::vector<std::pair<const char*, float*>> Run::stateParts() const {
  std::vector<std::pair<const char*, float*>> parts{{"params", model_->params()}, {"opt.first", opt_->first()}};
  if (opt_->second() != nullptr) parts.emplace_back("opt.second", opt_->second());
  if (outerSync_) {
    parts.emplace_back("outer.anchor", outerSync_->anchor());
    parts.emplace_back("outer.velocity", outerSync_->velocity());
  }
  return parts;
}

std::vector<CheckpointSection> Run::checkpointSections(std::int64_t step) {
  const std::size_t n = model_->paramCount();
  nlohmann::json meta = identity(cfg_, rank_, world_);
  meta["step"] = step;
  meta["optimizer_steps"] = opt_->steps();
  std::vector<CheckpointSection> sections;
  const std::string metaText = meta.dump();
  sections.push_back({"meta", std::vector<std::uint8_t>(metaText.begin(), metaText.end())});
  for (const auto& [name, part] : stateParts()) sections.push_back({name, bytesOf(backend_, part, n)});
  return sections;
}

Status Run::diverged(std::int64_t step, const std::string& what) const {
  const std::string kept = lastCheckpointStep_ < 0 ? std::string()
                                                   : fmt::format(" (the last good checkpoint: step {} in {})",
                                                                 lastCheckpointStep_, cfg_.checkpointDir);
  return invalidArgument("step {}: training diverged, {}: stopping without saving these weights{} (a smaller --lr?)",
                         step, what, kept);
}

Status Run::agreeOnFailure(const Status& mine, std::string_view what) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<int> failed, ranksThatFailed(sync_, !mine.isOk()));
  if (!mine.isOk()) return mine;
  if (!failed.empty()) return invalidArgument("rank(s) {} {}", fmt::join(failed, ", "), what);
  return Status();
}

Status Run::bindTo(std::unique_ptr<Communicator> next, std::optional<HybridComms> children) {
  if (admission_) dropAdmission(fmt::format("the membership changed to {} ranks meanwhile", next->size()));
  gradSync_.reset();  // its buckets were on the old communicator
  // Hybrid: the old communicator's children go first; they stop with it (retire).
  if (outerSync_) outerSync_->rebind(nullptr);
  regionSync_.reset();
  crossSync_.reset();
  std::vector<std::unique_ptr<Communicator>> going;
  going.push_back(std::move(regionComm_));
  going.push_back(std::move(crossComm_));
  Communicator* old = comm_;
  successors_.push_back(std::move(next));
  comm_ = successors_.back().get();
  worldSync_ = std::make_unique<MeridianSyncComm>(*comm_);
  sync_ = worldSync_.get();
  if (outerSync_) outerSync_->rebind(sync_);
  // The old one stops (nothing of this rank is in flight on it at a boundary or after a cut)
  // and goes, unless the launcher owns it.
  if (old != nullptr) {
    old->retire();
    const auto owned = std::find_if(successors_.begin(), successors_.end(),
                                    [&](const std::unique_ptr<Communicator>& c) { return c.get() == old; });
    if (owned != successors_.end()) {
      going.push_back(std::move(*owned));
      successors_.erase(owned);
    }
  }
  destroyAside(std::move(going));
  rank_ = comm_->rank();
  world_ = comm_->size();
  worldSizes_.push_back(world_);
  membershipChanges().add();
  worldSizeGauge().set(world_);
  comms_.assign(1, CommUse{comm_, {}});
  for (int r = 0; r < world_; ++r) comms_[0].worldRanks.push_back(r);
  const routing::RegionAssignment regions = comm_->regions();
  regionOf_ = regions.regionOf.size() == static_cast<std::size_t>(world_) ? regions.regionOf : std::vector<int>{};
  if (cfg_.sync == SyncMode::kDdp) {
    const std::size_t bucketBytes = static_cast<std::size_t>(cfg_.bucketMb * 1024 * 1024);
    MERIDIAN_ASSIGN_OR_RETURN(gradSync_, GradientSync::create(backend_, sync_, *model_, bucketBytes, cfg_.wire));
  }
  if (cfg_.sync == SyncMode::kHybrid) {
    if (!children) {
      Result<HybridComms> made = invalidArgument("not split");
      threads_.run([&] { made = splitForHybrid(*comm_); });
      MERIDIAN_RETURN_IF_ERROR(made.status());
      children = std::move(made).value();
    }
    return setUpHybrid(std::move(*children));
  }
  return Status();
}

Result<std::int64_t> Run::recover(const Status& failure, std::int64_t position, Clock::time_point since) {
  if (!elastic()) return failure;
  const int before = world_;
  // A loss during the recovery itself is one more membership change: a few in a row.
  Status last = failure;
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto next = comm_->successor(Clock::now() + kSuccessorWait);
    if (!next.isOk()) {
      // Left out (the others agreed without this rank, e.g. across a cut that healed), or no
      // successor at all: ask to join again.
      return rejoin(commError("{}; and no successor communicator: {}", last.toString(), next.status().toString()));
    }
    MERIDIAN_RETURN_IF_ERROR(bindTo(std::move(next).value()));
    // Every survivor holds its last whole step; the one furthest ahead (the lowest rank of
    // them) hands its state to the ones behind.
    Result<std::vector<std::int64_t>> steps = gatherFromEveryRank(sync_, position);
    Status st = steps.status();
    std::int64_t agreed = position;
    if (st.isOk()) {
      const auto ahead = std::max_element(steps->begin(), steps->end());
      agreed = *ahead;
      std::vector<int> behind;
      for (std::size_t r = 0; r < steps->size(); ++r) {
        if ((*steps)[r] != agreed) behind.push_back(static_cast<int>(r));
      }
      st = handState(static_cast<int>(ahead - steps->begin()), behind, /*agree=*/true);
    }
    if (!st.isOk()) {
      last = st;
      continue;  // lost another rank meanwhile: the next successor
    }
    const double sec = secondsSince(since);
    recoverySec_ += sec;
    recoverySeconds().observe(sec);
    const std::vector<int>& members = comm_->jobRanks();
    const std::int64_t from = agreed / 2 + (agreed % 2);
    MLOG_WARN(kTrainer, "membership changed ({} -> {} ranks, job ranks {}): going on from step {}{} as rank {} after "
              "{:.2f} s (cut by: {})",
              before, world_, fmt::join(members, ","), from, agreed % 2 ? "'s outer sync" : "", rank_, sec,
              failure.message());
    log(fmt::format("membership: {} -> {} ranks (job ranks {}); {:.2f} s to recover, going on from step {}{} with the "
                    "same global batch ({} rows per rank now) and learning rate",
                    before, world_, fmt::join(members, ","), sec, from, agreed % 2 ? "'s outer sync" : "", localBatch()));
    return agreed;
  }
  return last;
}

Result<std::int64_t> Run::rejoin(const Status& why) {
  if (ctx_.rejoinStore.empty()) return why;
  const int jobRank = comm_->jobRanks()[static_cast<std::size_t>(comm_->rank())];
  const auto deadline = Clock::now() + kRejoinWait;
  Status last = why;
  // The members may drop an admission (one of them was lost meanwhile): this rank's grown
  // communicator then breaks before the welcome, and it asks again.
  for (int attempt = 0; attempt < kJoinAttempts; ++attempt) {
    MLOG_WARN(kTrainer, "job rank {} asks to join the job again ({}): {}", jobRank, ctx_.rejoinStore, last.message());
    worldSizeGauge().set(0);
    Result<std::unique_ptr<Communicator>> joined = std::unique_ptr<Communicator>();
    threads_.run([&] { joined = Communicator::join(ctx_.rejoinStore, jobRank, ctx_.commOptions, deadline); });
    if (!joined.isOk()) return commError("{}; and could not join again: {}", last.toString(), joined.status().toString());
    MERIDIAN_RETURN_IF_ERROR(bindTo(std::move(joined).value()));
    std::int64_t step = 0;
    last = arrive(&step);
    if (last.isOk()) return 2 * step;  // the members admit ranks at a boundary
    if (last.code() == StatusCode::kInvalidArgument) return last;  // not the network's doing
  }
  return last;
}

Status Run::welcome(std::int64_t* step, int joiners) {
  // Rank 0's step, how many joined (the last ranks) and the digest of its data, in one
  // broadcast; a joiner learns them here and checks its own data against rank 0's (the
  // members checked theirs when they started).
  constexpr std::size_t kDigestWords = sizeof(Sha256) / sizeof(std::int64_t);
  std::int64_t header[2 + kDigestWords] = {*step, joiners};
  std::memcpy(header + 2, dataDigest_.data(), sizeof(Sha256));
  MERIDIAN_RETURN_IF_ERROR(comm_->broadcast(header, header, 2 + kDigestWords, kernels::DataType::kI64, 0));
  *step = header[0];
  if (header[1] < 0 || header[1] >= world_)
    return internalError("rank 0 says {} of {} ranks joined", header[1], world_);
  const bool joining = rank_ >= world_ - header[1];
  Sha256 theirs;
  std::memcpy(theirs.data(), header + 2, sizeof(Sha256));
  if (joining && theirs != dataDigest_) {
    // This rank alone stops; the members lose it like any rank and go on.
    return invalidArgument("this rank decoded different data than rank 0 (SHA-256 {}... here, {}... on rank 0): it "
                           "does not join",
                           shortHex(dataDigest_), shortHex(theirs));
  }
  // The members keep their own state (DiLoCo's and hybrid's inner optimizers differ between
  // ranks); the joiners take rank 0's, each checking it, and a joiner that could not stops
  // alone (nobody waits on an agreement across the WAN for it).
  std::vector<int> joined;
  for (int r = world_ - static_cast<int>(header[1]); r < world_; ++r) joined.push_back(r);
  return handState(0, joined, /*agree=*/false);
}

Status Run::changeMembership(std::int64_t* step, bool* left) {
  const auto start = Clock::now();
  const bool leave = ctx_.leaveRequested != nullptr && ctx_.leaveRequested->load();
  using BuildState = Communicator::BuildState;
  BuildState building = BuildState::kNone;
  if (admission_) {
    building = !admission_->done.load(std::memory_order_acquire) ? BuildState::kBuilding
               : admission_->status.isOk()                       ? BuildState::kBuilt
                                                                 : BuildState::kFailed;
  }
  MERIDIAN_ASSIGN_OR_RETURN(const Communicator::MembershipRequests asked, comm_->membershipRequests(leave, building));
  if (admission_) {
    // Every member decides alike, from what all of them said: switch, drop, or go on (a
    // request to leave waits until the admission is over).
    if (asked.buildFailed) {
      dropAdmission(building == BuildState::kFailed ? admission_->status.toString()
                                                    : std::string("another member could not build it"));
      return Status();
    }
    return asked.builtEverywhere ? admit(step, start) : Status();
  }
  if (!asked.any()) return Status();
  if (asked.leaving.size() == static_cast<std::size_t>(world_)) {
    return commError("stopped at step {}: every rank was asked to leave (SIGTERM), so there is nobody to hand over "
                     "to{}",
                     *step, lastCheckpointStep_ >= 0 ? fmt::format("; the last checkpoint is step {} in {}",
                                                                   lastCheckpointStep_, cfg_.checkpointDir)
                                                     : std::string());
  }
  if (asked.leaving.empty()) {
    // Joiners only: planned now (two broadcasts), built while the members train on.
    auto change = comm_->planMembershipChange(asked);
    if (!change.isOk()) {
      if (change.status().code() != StatusCode::kAgain)
        MLOG_WARN(kTrainer, "could not admit the {} rank(s) waiting to join: {}", asked.joiners,
                  change.status().toString());
      return Status();  // the members go on as they were
    }
    auto a = std::make_unique<Admission>();
    a->change = std::move(change).value();
    a->planned = start;
    a->step = *step;
    Admission* raw = a.get();
    const bool hybrid = cfg_.sync == SyncMode::kHybrid;
    a->worker = threads_.make([raw, hybrid] {
      auto grown = raw->change->build(Clock::now() + kAdmitWait);
      if (grown.isOk() && hybrid) {
        auto children = splitForHybrid(**grown);
        if (children.isOk()) raw->children = std::move(children).value();
        else grown = children.status();
      }
      // Until the joiners are ready to take the state (data loaded, model made): the members
      // train on meanwhile, and the switch costs them the hand-over alone.
      if (grown.isOk()) {
        if (Status ready = (*grown)->barrier(); !ready.isOk()) grown = ready;
      }
      if (grown.isOk()) raw->grown = std::move(grown).value();
      else raw->status = grown.status();
      raw->done.store(true, std::memory_order_release);
      raw->done.notify_all();  // the owner joins this thread before the admission goes
    });
    MLOG_INFO(kTrainer, "admitting {} rank(s) at step {} (membership epoch {}): the members train on while the grown "
              "communicator is built",
              a->change->joiners(), *step, a->change->epoch());
    admission_ = std::move(a);
    return Status();
  }
  // Ranks leave (drain) at this boundary, joiners with them: all at once.
  const int before = world_;
  const std::vector<int> jobRanksBefore = comm_->jobRanks();
  Result<std::unique_ptr<Communicator>> next = std::unique_ptr<Communicator>();
  threads_.run([&] { next = comm_->changeMembership(asked, Clock::now() + kAdmitWait); });
  if (!next.isOk()) {
    MLOG_WARN(kTrainer, "could not change the membership ({} waiting to join, {} asking to leave): {}", asked.joiners,
              asked.leaving.size(), next.status().toString());
    return Status();  // the members go on as they were
  }
  if (next.value() == nullptr) {  // this rank left: the others are over on the new one
    comm_->retire();
    *left = true;
    worldSizeGauge().set(0);
    MLOG_INFO(kTrainer, "left the job at step {} as asked (SIGTERM): {} rank(s) go on without this one", *step,
              before - static_cast<int>(asked.leaving.size()) + asked.joiners);
    return Status();
  }
  MERIDIAN_RETURN_IF_ERROR(bindTo(std::move(next).value()));
  MERIDIAN_RETURN_IF_ERROR(comm_->barrier());  // the joiners are ready
  MERIDIAN_RETURN_IF_ERROR(welcome(step, asked.joiners));
  std::vector<int> gone;
  for (int r : asked.leaving) gone.push_back(jobRanksBefore[static_cast<std::size_t>(r)]);
  log(fmt::format("membership: {} -> {} ranks (job ranks {}); {} joined, job rank(s) {} left as asked, at step {}, "
                  "state handed over in {:.2f} s",
                  before, world_, fmt::join(comm_->jobRanks(), ","), asked.joiners, fmt::join(gone, ","), *step,
                  secondsSince(start)));
  return Status();
}

Status Run::admit(std::int64_t* step, Clock::time_point start) {
  std::unique_ptr<Admission> a = std::move(admission_);
  a->worker.join();  // done: it only ends
  const int before = world_;
  const int joiners = a->change->joiners();
  std::unique_ptr<Communicator> grown = std::move(a->grown);
  comm_->handOver(*a->change, *grown);
  MERIDIAN_RETURN_IF_ERROR(bindTo(std::move(grown), std::move(a->children)));
  const auto bound = Clock::now();
  MERIDIAN_RETURN_IF_ERROR(welcome(step, joiners));
  const double stopped = secondsSince(start);
  MLOG_INFO(kTrainer, "membership changed at step {}: planned at step {}, built in the background over {:.3f} s; "
            "the members stopped {:.3f} s (switch {:.3f} s, welcome {:.3f} s)",
            *step, a->step, std::chrono::duration<double>(start - a->planned).count(), stopped,
            std::chrono::duration<double>(bound - start).count(), secondsSince(bound));
  log(fmt::format("membership: {} -> {} ranks (job ranks {}); {} joined, at step {} (asked at step {}), the members "
                  "stopped {:.2f} s to hand the state over",
                  before, world_, fmt::join(comm_->jobRanks(), ","), joiners, *step, a->step, stopped));
  return Status();
}

void Run::destroyAside(std::vector<std::unique_ptr<Communicator>> going) {
  std::erase_if(reapers_, [](std::unique_ptr<Background>& r) { return r->joinIfEnded(); });
  auto reaper = std::make_unique<Background>();
  reaper->worker = std::thread([going = std::move(going), done = &reaper->done]() mutable {
    for (auto& c : going) c.reset();
    done->store(true, std::memory_order_release);
  });
  reapers_.push_back(std::move(reaper));
}

void Run::dropAdmission(const std::string& why) {
  std::unique_ptr<Admission> a = std::move(admission_);
  MLOG_WARN(kTrainer, "dropped the admission of {} rank(s) planned at step {} (membership epoch {}): {}",
            a->change->joiners(), a->step, a->change->epoch(), why);
  a->change->cancel();
  dropped_.push_back(std::move(a));
  // Those whose workers ended go now; the others when theirs do (later, or at the end).
  std::erase_if(dropped_, [](std::unique_ptr<Admission>& d) { return d->joinIfEnded(); });
}

Status Run::handState(int source, const std::vector<int>& targets, bool agree) {
  if (targets.empty()) return Status();
  const auto at = std::find(targets.begin(), targets.end(), rank_);
  const bool sending = rank_ == source;
  Status mine;
  if (sending || at != targets.end()) mine = passStateOn(source, targets, at - targets.begin());
  backend_.synchronize();
  if (!agree) return mine;
  return agreeOnFailure(mine, fmt::format("did not take rank {}'s state bit-exact", source));
}

Status Run::passStateOn(int source, const std::vector<int>& targets, std::ptrdiff_t index) {
  const std::size_t n = model_->paramCount();
  const std::vector<std::pair<const char*, float*>> parts = stateParts();
  const std::size_t stateBytes = parts.size() * n * sizeof(float);
  // The parts one after the other, the optimizer's step count, the SHA-256 of all that.
  std::vector<std::uint8_t> payload(stateBytes + sizeof(std::int64_t) + sizeof(Sha256));
  const bool sending = rank_ == source;
  if (sending) {
    std::size_t off = 0;
    for (const auto& [name, part] : parts) {
      backend_.copyToHost(payload.data() + off, part, n * sizeof(float));
      off += n * sizeof(float);
    }
    const std::int64_t optSteps = opt_->steps();
    std::memcpy(payload.data() + off, &optSteps, sizeof(optSteps));
    const Sha256 digest = sha256({std::span<const std::uint8_t>(payload.data(), stateBytes + sizeof(optSteps))});
    std::memcpy(payload.data() + stateBytes + sizeof(optSteps), digest.data(), digest.size());
  }
  const int from = sending ? -1 : index == 0 ? source : targets[static_cast<std::size_t>(index - 1)];
  const int to = sending ? targets.front()
                 : static_cast<std::size_t>(index + 1) < targets.size() ? targets[static_cast<std::size_t>(index + 1)]
                                                                         : -1;
  // Pieces of whole 4-byte words (every section is), sent as kI32 (no arithmetic on them).
  const std::size_t pieces = (payload.size() + kStatePieceBytes - 1) / kStatePieceBytes;
  auto piece = [&](std::size_t i) {
    const std::size_t off = i * kStatePieceBytes;
    return std::make_pair(payload.data() + off, std::min(kStatePieceBytes, payload.size() - off) / 4);
  };
  std::vector<Communicator::WorkPtr> received, sent;
  if (from >= 0) {
    for (std::size_t i = 0; i < pieces; ++i) {
      const auto [data, words] = piece(i);
      received.push_back(comm_->recvAsync(data, words, kernels::DataType::kI32, from, kStateTag));
    }
  }
  Status st;
  for (std::size_t i = 0; i < pieces && st.isOk(); ++i) {
    if (from >= 0) st = received[i]->wait();
    const auto [data, words] = piece(i);
    if (st.isOk() && to >= 0) sent.push_back(comm_->sendAsync(data, words, kernels::DataType::kI32, to, kStateTag));
  }
  for (const Communicator::WorkPtr& w : sent) {
    const Status s = w->wait();
    if (st.isOk()) st = s;
  }
  MERIDIAN_RETURN_IF_ERROR(st);
  if (sending) return Status();
  Sha256 claimed;
  std::memcpy(claimed.data(), payload.data() + stateBytes + sizeof(std::int64_t), claimed.size());
  const Sha256 got = sha256({std::span<const std::uint8_t>(payload.data(), stateBytes + sizeof(std::int64_t))});
  if (got != claimed)
    return invalidArgument("the state from rank {} arrived with SHA-256 {}..., sent as {}...", source, shortHex(got),
                           shortHex(claimed));
  std::size_t off = 0;
  for (const auto& [name, part] : parts) {
    backend_.copyToDevice(part, payload.data() + off, n * sizeof(float));
    off += n * sizeof(float);
  }
  std::int64_t optSteps = 0;
  std::memcpy(&optSteps, payload.data() + off, sizeof(optSteps));
  opt_->setSteps(optSteps);
  return Status();
}

Result<bool> Run::atBoundary(const std::function<Status()>& op, std::int64_t position, std::int64_t* agreed) {
  const auto since = Clock::now();
  const Status st = op();
  if (st.isOk()) return false;
  if (st.code() == StatusCode::kInvalidArgument) return st;  // the op's own verdict, no loss
  MERIDIAN_ASSIGN_OR_RETURN(*agreed, recover(st, position, since));
  return true;
}

Status Run::checkFiniteEverywhere(std::int64_t step, const std::vector<CheckpointSection>& sections) {
  const Status mine = checkFiniteSections(sections);
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<int> bad, ranksThatFailed(sync_, !mine.isOk()));
  if (bad.empty()) return Status();
  return diverged(step, fmt::format("weights are not finite on rank(s) {}{}", fmt::join(bad, ", "),
                                    mine.isOk() ? std::string() : fmt::format(" (here {})", mine.message())));
}

Status Run::saveCheckpoint(std::int64_t step) {
  const std::vector<CheckpointSection> sections = checkpointSections(step);
  // Also what keeps ranks within one checkpoint of each other (kCheckpointsKept).
  MERIDIAN_RETURN_IF_ERROR(checkFiniteEverywhere(step, sections));
  MERIDIAN_RETURN_IF_ERROR(writeCheckpoint(rankDir(cfg_.checkpointDir, rank_), checkpointKey_,
                                           static_cast<std::uint64_t>(step), sections, kCheckpointsKept));
  lastCheckpointStep_ = step;
  return Status();
}

// The newest step every rank holds a valid checkpoint of (-1: no rank holds any). Ranks
// gather the newest step each holds at or below a bound, try the smallest, and lower the
// bound past it until every rank holds the step tried. Checkpoints that do not verify or
// hold numbers that are not finite do not count.
Result<std::int64_t> Run::resumeStep() {
  MERIDIAN_ASSIGN_OR_RETURN(
      std::vector<std::uint64_t> steps,
      validCheckpointSteps(rankDir(cfg_.checkpointDir, rank_), checkpointKey_,
                           [](const Checkpoint& ck) { return checkFiniteSections(ck.sections); }));
  auto newestAtOrBelow = [&](std::int64_t bound) {
    std::int64_t best = -1;
    for (std::uint64_t s : steps)
      if (static_cast<std::int64_t>(s) <= bound) best = std::max(best, static_cast<std::int64_t>(s));
    return best;
  };
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<std::int64_t> newest, gatherFromEveryRank(sync_, newestAtOrBelow(INT64_MAX)));
  const auto [lo, hi] = std::minmax_element(newest.begin(), newest.end());
  if (*hi < 0) return std::int64_t{-1};
  std::vector<std::int64_t> tried = newest;
  for (;;) {  // the candidate falls every round, the same on every rank
    const std::int64_t candidate = *std::min_element(tried.begin(), tried.end());
    if (candidate < 0) break;
    const bool have = std::find(steps.begin(), steps.end(), static_cast<std::uint64_t>(candidate)) != steps.end();
    MERIDIAN_ASSIGN_OR_RETURN(const std::vector<int> missing, ranksThatFailed(sync_, !have));
    if (missing.empty()) {
      if (*lo != *hi)
        log(fmt::format("resume: the ranks' newest valid checkpoints differ (steps {} by rank): every rank resumes "
                        "from step {}, the newest all of them hold",
                        fmt::join(newest, ", "), candidate));
      return candidate;
    }
    MERIDIAN_ASSIGN_OR_RETURN(tried, gatherFromEveryRank(sync_, newestAtOrBelow(candidate - 1)));
  }
  return invalidArgument("resume: no checkpoint step is held by every rank in {} (the newest valid one by rank: {}; "
                         "-1 none); starting over would discard them: restore the missing checkpoints, or start "
                         "afresh with another --checkpoint-dir",
                         cfg_.checkpointDir, fmt::join(newest, ", "));
}

Result<Checkpoint> Run::loadCheckpoint(std::int64_t step) {
  MERIDIAN_ASSIGN_OR_RETURN(Checkpoint ck,
                            loadLatestCheckpoint(rankDir(cfg_.checkpointDir, rank_), checkpointKey_,
                                                 static_cast<std::uint64_t>(step),
                                                 [](const Checkpoint& c) { return checkFiniteSections(c.sections); }));
  if (static_cast<std::int64_t>(ck.step) != step)
    return invalidArgument("{}: expected the checkpoint of step {}, found step {}", ck.path, step, ck.step);
  const CheckpointSection* metaSec = ck.find("meta");
  if (metaSec == nullptr) return invalidArgument("{}: no meta section", ck.path);
  nlohmann::json meta = nlohmann::json::parse(metaSec->data.begin(), metaSec->data.end(), nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) return invalidArgument("{}: meta section is not JSON", ck.path);
  if (!meta.contains("conv")) meta["conv"] = nlohmann::json::array();  // written before conv blocks existed
  const nlohmann::json want = identity(cfg_, rank_, world_);
  for (const auto& [key, value] : want.items()) {
    if (!meta.contains(key) || meta[key] != value)
      return invalidArgument("{}: written by a different run ({} was {}, this run has {}); use another "
                             "--checkpoint-dir or drop --resume",
                             ck.path, key, meta.contains(key) ? meta[key].dump() : "missing", value.dump());
  }
  const std::size_t n = model_->paramCount();
  for (const auto& [name, part] : stateParts()) MERIDIAN_RETURN_IF_ERROR(restoreFloats(backend_, ck, name, part, n));
  opt_->setSteps(meta.value("optimizer_steps", std::int64_t{0}));
  return ck;
}

Result<std::int64_t> Run::resume() {
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t from, resumeStep());
  if (from < 0) return from;
  Result<Checkpoint> ck = loadCheckpoint(from);
  MERIDIAN_RETURN_IF_ERROR(
      agreeOnFailure(ck.status(), fmt::format("could not load the checkpoint of step {}", from)));
  MERIDIAN_RETURN_IF_ERROR(agreeOnFailure(checkResumedAlike(*ck), fmt::format("resumed different weights at step {}", from)));
  lastCheckpointStep_ = from;
  return from;
}

Status Run::checkResumedAlike(const Checkpoint& ck) {
  auto compare = [&](SyncComm* comm, const char* section, const char* among) -> Status {
    const CheckpointSection* s = ck.find(section);
    const Sha256 digest = s != nullptr ? sha256({s->data}) : Sha256{};
    const Status st = checkSameOnEveryRank(comm, digest, fmt::format("weights ('{}' {})", section, among));
    if (st.isOk()) return st;
    return invalidArgument("resume from step {}: {}; the checkpoints in {} are not one run's state: refusing to "
                           "train from them",
                           ck.step, st.message(), cfg_.checkpointDir);
  };
  switch (cfg_.sync) {
    case SyncMode::kDdp: return compare(sync_, "params", "of every rank");
    case SyncMode::kDiloco: return compare(sync_, "outer.anchor", "of every rank");
    case SyncMode::kHybrid: {
      if (regionSync_ == nullptr) return Status();
      // Both comparisons on every rank, whatever the first found: each is a collective.
      const Status inRegion = compare(regionSync_.get(), "params", "inside the region");
      const Status across = compare(crossSync_.get(), "outer.anchor", "across regions");
      return inRegion.isOk() ? across : inRegion;
    }
    case SyncMode::kNone: return Status();  // every rank has weights of its own
  }
  return Status();
}

Status Run::loadData() {
  const std::string dir = cfg_.dataDir.empty() ? kFashionMnistDir : cfg_.dataDir;
  Status loaded;
  if (Result<Dataset> d = loadFashionMnist(dir, true); d.isOk()) {
    train_ = std::move(d).value();
    if (Result<Dataset> t = loadFashionMnist(dir, false); t.isOk()) test_ = std::move(t).value();
    else loaded = t.status();
  } else {
    loaded = d.status();
  }
  // A joiner checks its data in welcome(), with the members.
  if (ctx_.joined && !loaded.isOk()) return loaded;
  if (!ctx_.joined) MERIDIAN_RETURN_IF_ERROR(agreeOnFailure(loaded, "could not load the data"));
  const Sha256 trainDigest = datasetDigest(train_), testDigest = datasetDigest(test_);
  dataDigest_ = sha256({trainDigest, testDigest});
  if (ctx_.joined) return Status();
  return checkSameOnEveryRank(sync_, dataDigest_, fmt::format("data (decoded from {})", dir));
}

std::pair<std::uint64_t, std::uint64_t> Run::transportBytes() const {
  std::uint64_t all = 0, cross = 0;
  for (const CommUse& use : comms_) {
    for (int peer = 0; peer < use.comm->size(); ++peer) {
      if (peer == use.comm->rank()) continue;
      std::uint64_t sent = 0;
      for (const auto& p : use.comm->peerPathStats(peer)) sent += p.bytesSent;
      all += sent;
      const int worldPeer = use.worldRanks[static_cast<std::size_t>(peer)];
      if (!regionOf_.empty() &&
          regionOf_[static_cast<std::size_t>(worldPeer)] != regionOf_[static_cast<std::size_t>(rank_)])
        cross += sent;
    }
  }
  return {all, cross};
}

Result<TrainSummary> Run::go() {
  // A joiner's world is whatever the members had plus it: the batch need not divide it.
  MERIDIAN_RETURN_IF_ERROR(checkConfig(cfg_, ctx_.joined ? 1 : world_));
  // Decoding is compute: a joiner decodes while the members train beside it on a shared host.
  MERIDIAN_RETURN_IF_ERROR(atComputePriority([&] { return loadData(); }));
  if (static_cast<std::size_t>(cfg_.model.widths.front()) != train_.features() ||
      cfg_.model.widths.back() != train_.classes)
    return invalidArgument("model {} does not fit the data: {} inputs and {} classes wanted",
                           formatModel(cfg_.model), train_.features(), train_.classes);
  const std::int64_t stepsPerEpoch = static_cast<std::int64_t>(train_.count) / cfg_.globalBatch;
  if (stepsPerEpoch < 1) return invalidArgument("--batch {} is larger than the {} training examples", cfg_.globalBatch, train_.count);
  const std::int64_t totalSteps = cfg_.maxSteps > 0 ? cfg_.maxSteps : stepsPerEpoch * cfg_.epochs;

  const int b = localBatch();
  // Elastic: room for a survivor's larger share of the global batch.
  MERIDIAN_ASSIGN_OR_RETURN(model_, Model::create(backend_, cfg_.model, std::max(elastic() ? cfg_.globalBatch : b, 500),
                                                  cfg_.seed));
  const auto hostRows = static_cast<std::size_t>(std::max(model_->maxBatch(), cfg_.globalBatch));
  hostInput_.resize(hostRows * train_.features());
  hostLabels_.resize(hostRows);
  const OptimizerKind kind = cfg_.sync == SyncMode::kDiloco ? OptimizerKind::kAdamW : cfg_.optimizer;
  opt_ = std::make_unique<Optimizer>(backend_, kind, model_->paramCount(), cfg_);
  MERIDIAN_RETURN_IF_ERROR(setUpSync());
  lowerComputePriority();
  Metrics metrics(rank_, cfg_.sync);
  (void)membershipChanges();  // a series from the start (0), for the dashboard's membership panel
  worldSizeGauge().set(world_);

  std::int64_t step = 0;
  if (!cfg_.checkpointDir.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(const CheckpointSecret secret, checkpointSecretFromEnvironment(cfg_.checkpointDir));
    checkpointKey_ = checkpointKey(secret.secret);
  }
  if (cfg_.resume && !ctx_.joined) {
    if (cfg_.checkpointDir.empty()) return invalidArgument("--resume needs --checkpoint-dir");
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t from, resume());
    if (from < 0) {
      log(fmt::format("resume: no checkpoint in {}, starting from step 0", cfg_.checkpointDir));
    } else {
      step = from;
      log(fmt::format("resume: continuing from the checkpoint of step {}", from));
    }
  }
  log(fmt::format("meridian-train: {} ranks, sync {}, model {} ({:.2f} M parameters), batch {} ({} per rank), "
                  "{} steps ({} per epoch), {} on the wire, backend {}{}",
                  world_, toString(cfg_.sync), formatModel(cfg_.model),
                  static_cast<double>(model_->paramCount()) / 1e6, cfg_.globalBatch, b, totalSteps, stepsPerEpoch,
                  toString(cfg_.wire), backend_.describe(),
                  nice_ > 0 ? fmt::format(", compute at nice {} (communication first)", nice_) : std::string()));

  TrainSummary sum;
  sum.computeNice = nice_;
  worldSizes_.assign(1, world_);
  if (ctx_.joined) {
    // The members switch at a step boundary once every joiner passed its barrier (arrive);
    // the step and the state come from rank 0.
    if (Status st = arrive(&step); !st.isOk()) {
      if (st.code() == StatusCode::kInvalidArgument) return st;
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t position, rejoin(st));
      step = position / 2;
    }
    log(fmt::format("joined at step {} as rank {} of {}", step, rank_, world_));
  }
  // The one-rank baseline: rank 0 alone on the machine while the others wait.
  if (!ctx_.joined) {
    const std::vector<std::uint32_t> first = epochPermutation(train_.count, cfg_.seed, 0);
    // Cut by a lost rank, the baseline is dropped (0 in the summary): the survivors go on
    // from step `step` at once.
    std::int64_t agreed = 0;
    bool cut = false;
    if (sync_ != nullptr) {
      MERIDIAN_ASSIGN_OR_RETURN(cut, atBoundary([&] { return sync_->barrier(); }, 2 * step, &agreed));
    }
    if (!cut && rank_ == 0) sum.oneRankSamplesPerSec = cfg_.globalBatch / oneRankStepSec(first);
    if (!cut && sync_ != nullptr) {
      MERIDIAN_ASSIGN_OR_RETURN(cut, atBoundary([&] { return sync_->barrier(); }, 2 * step, &agreed));
    }
    if (cut && agreed != 2 * step) return internalError("a rank finished a step before the others started");
  }
  const std::int64_t firstStep = step;
  std::int64_t cachedEpoch = -1;
  std::vector<std::uint32_t> order;
  double intervalLoss = 0, intervalCorrect = 0, intervalRows = 0, intervalCompute = 0, intervalComm = 0;
  std::int64_t intervalSteps = 0;
  auto intervalStart = Clock::now();
  const auto start = Clock::now();
  std::uint64_t payload = 0;
  const int evalEvery = cfg_.evalEvery > 0 ? cfg_.evalEvery : static_cast<int>(stepsPerEpoch);
  // Elastic: steps between membership boundaries; with an outer sync, a multiple of H.
  std::int64_t membershipEvery = cfg_.joinCheckEvery > 0 ? cfg_.joinCheckEvery : INT64_MAX;
  if (outerSync_ && cfg_.joinCheckEvery > 0) {
    membershipEvery = cfg_.innerSteps * std::max<std::int64_t>(1, std::llround(static_cast<double>(cfg_.joinCheckEvery) /
                                                                              cfg_.innerSteps));
  }

  // Elastic: where a recovery puts this rank, the same on every survivor (see recover).
  bool outerPending = false;
  auto jumpTo = [&](std::int64_t position) {
    step = (position + 1) / 2;
    outerPending = position % 2 == 1;
  };
  while (step < totalSteps) {
    kernels::LossStats stats;
    double compute = 0, comm = 0;
    int rows = 0;
    if (!outerPending) {
      const std::int64_t epoch = step / stepsPerEpoch;
      if (epoch != cachedEpoch) {
        order = epochPermutation(train_.count, cfg_.seed, static_cast<std::uint64_t>(epoch));
        cachedEpoch = epoch;
      }
      const auto t0 = Clock::now();
      rows = localBatch();
      const std::size_t at = static_cast<std::size_t>(step % stepsPerEpoch) * static_cast<std::size_t>(cfg_.globalBatch) +
                             static_cast<std::size_t>(batchBegin());
      fillBatch(*model_, train_, order.data() + at, rows);
      // This rank's share of the global batch weighs its gradient (1 while the world divides
      // the batch), so the average over ranks is the mean over the global batch.
      const float share = static_cast<float>(static_cast<double>(rows) * world_ / cfg_.globalBatch);
      if (gradSync_) {
        stats = model_->forwardBackward(rows, share, [&](int layer) { gradSync_->onLayerDone(layer); });
      } else {
        stats = model_->forwardBackward(rows, share, nullptr);
      }
      compute = secondsSince(t0);
      // The optimizer steps each bucket as soon as it is averaged (DDP), overlapping the
      // buckets still on the wire; its time counts as compute, the rest of the wait as comm.
      double optimizerSec = 0;
      const std::int64_t optimizerSteps = opt_->steps();
      opt_->beginStep();
      auto stepRange = [&](std::size_t begin, std::size_t end) {
        const auto to = Clock::now();
        opt_->stepRange(model_->params(), model_->grads(), begin, end);
        optimizerSec += secondsSince(to);
      };
      // Elastic: a bucket is stepped only once every bucket was averaged, so a step cut by a
      // lost rank leaves the state of the step before, whole.
      std::vector<std::pair<std::size_t, std::size_t>> averaged;
      auto collect = [&](std::size_t begin, std::size_t end) { averaged.emplace_back(begin, end); };
      if (gradSync_) {
        const auto tw = Clock::now();
        if (const Status synced = elastic() ? gradSync_->finish(collect) : gradSync_->finish(stepRange); !synced.isOk()) {
          opt_->setSteps(optimizerSteps);
          MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t agreed, recover(synced, 2 * step, t0));
          jumpTo(agreed);
          continue;  // the step again, on the survivors (or from where the one furthest ahead is)
        }
        comm += std::max(0.0, secondsSince(tw) - optimizerSec);
        for (const auto& [begin, end] : averaged) stepRange(begin, end);
        payload += gradSync_->payloadBytesPerStep();
      } else {
        stepRange(0, model_->paramCount());
      }
      compute += optimizerSec;
      ++step;
    }  // the inner step
    const bool resumed = outerPending;
    outerPending = false;
    if (outerSync_ && (step % cfg_.innerSteps == 0 || step == totalSteps)) {
      const auto ts = Clock::now();
      // Cut by a lost rank: again on the survivors, unless one of them finished it (then
      // every survivor took its state, the outer step included, and goes on from there).
      if (const Status synced = syncOuter(); !synced.isOk()) {
        MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t agreed, recover(synced, 2 * step - 1, ts));
        jumpTo(agreed);
        continue;
      }
      comm += secondsSince(ts);
      payload += outerSync_->payloadBytesPerSync();
    }
    if (resumed) continue;  // this step's figures went with the cut
    // The loss is on the host already: a free check every step. Weights that went bad show
    // here by the next step at the latest; peers stop when this rank leaves their collective.
    if (!std::isfinite(stats.lossSum))
      return diverged(step, fmt::format("the training loss is {} on rank {}", stats.lossSum / rows, rank_));
    sum.computeSec += compute;
    sum.exposedCommSec += comm;
    metrics.steps.add();
    metrics.compute.observe(compute);
    metrics.exposed.observe(comm);
    intervalLoss += stats.lossSum;
    intervalCorrect += static_cast<double>(stats.correct);
    intervalRows += rows;
    intervalCompute += compute;
    intervalComm += comm;
    ++intervalSteps;

    if (step % cfg_.logEvery == 0 || step == totalSteps) {
      const double secs = secondsSince(intervalStart);
      const double sps = static_cast<double>(intervalSteps) * cfg_.globalBatch / std::max(secs, 1e-9);
      sum.trainLoss = intervalLoss / intervalRows;
      metrics.loss.set(sum.trainLoss);
      metrics.trainAccuracy.set(intervalCorrect / intervalRows);
      metrics.samplesPerSec.set(sps);
      const double stepMs = 1e3 * secs / static_cast<double>(intervalSteps);
      const double computeMs = 1e3 * intervalCompute / static_cast<double>(intervalSteps);
      const double commMs = 1e3 * intervalComm / static_cast<double>(intervalSteps);
      log(fmt::format("step {:>6}/{} | epoch {} | loss {:.4f} | train acc {:5.1f}% | {:8.0f} samples/s | step {:.1f} ms: "
                      "compute {:.1f}, exposed comm {:.1f} ({:.0f}%)",
                      step, totalSteps, step / stepsPerEpoch + (step % stepsPerEpoch ? 1 : 0), sum.trainLoss,
                      100 * intervalCorrect / intervalRows, sps, stepMs, computeMs, commMs,
                      100 * commMs / std::max(stepMs, 1e-9)));
      intervalLoss = intervalCorrect = intervalRows = intervalCompute = intervalComm = 0;
      intervalSteps = 0;
      intervalStart = Clock::now();
    }
    // At the boundary, each collective cut by a lost rank is dropped for this boundary: the
    // survivors go on from the same point (the next step, or where the one furthest ahead is).
    std::int64_t agreed = 0;
    if (step % evalEvery == 0 && step != totalSteps) {
      double acc = 0, loss = 0;
      MERIDIAN_ASSIGN_OR_RETURN(const bool cut, atBoundary([&] { return evaluate(&acc, &loss); }, 2 * step, &agreed));
      if (cut) {
        jumpTo(agreed);
        continue;
      }
      // Summed over every rank: all of them stop here together. Finite weights can still
      // be large enough to overflow the forward pass; they are no checkpoint to keep.
      if (!std::isfinite(loss)) return diverged(step, fmt::format("the test loss is {}", loss));
      metrics.testAccuracy.set(acc);
      log(fmt::format("eval  step {} | test accuracy {:.2f}% | test loss {:.4f} | {:.1f} s", step, 100 * acc, loss,
                      secondsSince(start)));
      if (cfg_.targetAccuracy > 0 && sum.timeToTargetSec < 0 && acc >= cfg_.targetAccuracy) {
        sum.timeToTargetSec = secondsSince(start);
        if (cfg_.stopAtTarget) {
          log(fmt::format("target accuracy {:.2f}% reached at step {}: stopping", 100 * cfg_.targetAccuracy, step));
          break;
        }
      }
    }
    if (!cfg_.checkpointDir.empty() && cfg_.checkpointEvery > 0 && step % cfg_.checkpointEvery == 0 && step != totalSteps) {
      MERIDIAN_ASSIGN_OR_RETURN(const bool cut, atBoundary([&] { return saveCheckpoint(step); }, 2 * step, &agreed));
      if (cut) {
        jumpTo(agreed);
        continue;
      }
    }
    // A step boundary every member agrees on: ranks waiting to join come in here, and ranks
    // asked to leave go. With an outer sync, right after one: every rank holds the same
    // model then, so a joiner starts from it and a leaver takes no inner progress away.
    if (elastic() && step % membershipEvery == 0 && step != totalSteps) {
      const std::int64_t boundary = step;
      bool left = false;
      MERIDIAN_ASSIGN_OR_RETURN(const bool cut,
                                atBoundary([&] { return changeMembership(&step, &left); }, 2 * step, &agreed));
      if (cut) {
        jumpTo(agreed);
        continue;
      }
      if (left) {
        sum.left = true;
        sum.finalStep = step;
        sum.worldSizes = worldSizes_;
        return sum;
      }
      if (step != boundary) return internalError("ranks joined at step {} while this rank was at step {}", step, boundary);
    }
  }
  // A joiner on its way in when the last step is done comes in at the end: each member waits
  // for its own build of the grown communicator (it ends built or failed, within kAdmitWait
  // and the barrier with the joiners), then all decide alike. Admitted, a joiner takes the
  // final model and ends with the others; dropped, it would ask a job that is over.
  while (admission_) {
    admission_->done.wait(false, std::memory_order_acquire);
    bool left = false;  // a request to leave waits until an admission is over: not here
    std::int64_t agreed = 0;
    const std::int64_t end = step;
    MERIDIAN_ASSIGN_OR_RETURN(const bool cut,
                              atBoundary([&] { return changeMembership(&step, &left); }, 2 * step, &agreed));
    // Cut: a member was lost meanwhile and the recovery dropped the admission.
    if (step != end) return internalError("ranks joined at step {} while this rank was at step {}", step, end);
    if (cut && agreed != 2 * end) return internalError("the survivors agreed on position {} after the last step", agreed);
  }
  backend_.synchronize();
  sum.wallSec = secondsSince(start);
  sum.steps = step - firstStep;
  sum.finalStep = step;
  sum.samplesPerSec = static_cast<double>(sum.steps) * cfg_.globalBatch / std::max(sum.wallSec, 1e-9);
  // The end: an evaluation, the last checkpoint (or the finite check) and the byte totals,
  // all collectives. Cut by a lost rank, the whole of it runs again on the survivors.
  std::uint64_t totals[3];
  auto finish = [&]() -> Status {
    MERIDIAN_RETURN_IF_ERROR(evaluate(&sum.testAccuracy, &sum.testLoss));
    if (!std::isfinite(sum.testLoss)) return diverged(step, fmt::format("the test loss is {}", sum.testLoss));
    if (!cfg_.checkpointDir.empty() && sum.steps > 0) {
      MERIDIAN_RETURN_IF_ERROR(saveCheckpoint(step));
    } else {
      MERIDIAN_RETURN_IF_ERROR(
          checkFiniteEverywhere(step, {{"params", bytesOf(backend_, model_->params(), model_->paramCount())}}));
    }
    // Elastic DDP: through every membership change the replicas must stay one model (every
    // rank checks, joiners too: it is a collective).
    if (elastic() && cfg_.sync == SyncMode::kDdp) {
      MERIDIAN_RETURN_IF_ERROR(checkSameOnEveryRank(
          sync_, sha256({bytesOf(backend_, model_->params(), model_->paramCount())}), "the replicas' weights at the end"));
    }
    std::tie(sum.bytesSent, sum.bytesCrossRegion) = transportBytes();
    totals[0] = sum.bytesSent, totals[1] = sum.bytesCrossRegion, totals[2] = payload;
    if (sync_ != nullptr) {
      MERIDIAN_RETURN_IF_ERROR(sync_->allreduce(totals, 3, kernels::DataType::kI64, kernels::ReduceOp::kSum));
    }
    return Status();
  };
  auto since = Clock::now();
  Status ended = finish();
  for (int attempt = 0; !ended.isOk() && attempt < 4 && elastic(); ++attempt) {
    if (ended.code() == StatusCode::kInvalidArgument) break;  // diverged: no loss behind it
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t agreed, recover(ended, 2 * step, since));
    since = Clock::now();
    if (agreed != 2 * step) {
      return internalError("after a membership change at the end the survivors are at step {}, this rank at {}",
                           (agreed + 1) / 2, step);
    }
    ended = finish();
  }
  MERIDIAN_RETURN_IF_ERROR(ended);
  metrics.testAccuracy.set(sum.testAccuracy);
  if (cfg_.targetAccuracy > 0 && sum.timeToTargetSec < 0 && sum.testAccuracy >= cfg_.targetAccuracy)
    sum.timeToTargetSec = sum.wallSec;
  sum.payloadBytes = payload;
  metrics.payloadBytes.add(payload);
  sum.worldBytesSent = totals[0];
  sum.worldBytesCrossRegion = totals[1];
  sum.worldPayloadBytes = totals[2];
  sum.worldSize = world_;
  sum.rank = rank_;
  sum.recoverySec = recoverySec_;
  sum.worldSizes = worldSizes_;
  sum.regionCount = regionOf_.empty() ? 0 : *std::max_element(regionOf_.begin(), regionOf_.end()) + 1;
  sum.params.resize(model_->paramCount());
  backend_.copyToHost(sum.params.data(), model_->params(), sum.params.size() * sizeof(float));
  return sum;
}

}  // namespace

std::string_view toString(SyncMode mode) {
  switch (mode) {
    case SyncMode::kDdp: return "ddp";
    case SyncMode::kDiloco: return "diloco";
    case SyncMode::kHybrid: return "hybrid";
    case SyncMode::kNone: return "none";
  }
  return "?";
}

Result<SyncMode> parseSyncMode(const std::string& text) {
  if (text == "ddp") return SyncMode::kDdp;
  if (text == "diloco") return SyncMode::kDiloco;
  if (text == "hybrid") return SyncMode::kHybrid;
  if (text == "none") return SyncMode::kNone;
  return invalidArgument("sync mode '{}': expected ddp, diloco, hybrid or none", text);
}

Result<OptimizerKind> parseOptimizer(const std::string& text) {
  if (text == "sgd") return OptimizerKind::kSgd;
  if (text == "adamw") return OptimizerKind::kAdamW;
  return invalidArgument("optimizer '{}': expected sgd or adamw", text);
}

Status checkConfig(const TrainConfig& cfg, int worldSize) {
  if (cfg.globalBatch < 1 || cfg.globalBatch > kMaxGlobalBatch || cfg.globalBatch % worldSize != 0)
    return invalidArgument("--batch {} must be a positive multiple of the {} ranks, at most {}", cfg.globalBatch,
                           worldSize, kMaxGlobalBatch);
  if (cfg.innerSteps < 1 || cfg.innerSteps > kMaxInnerSteps)
    return invalidArgument("--inner-steps must be in 1..{} (got {})", kMaxInnerSteps, cfg.innerSteps);
  if (cfg.epochs < 1 || cfg.epochs > kMaxEpochs) return invalidArgument("--epochs must be in 1..{} (got {})", kMaxEpochs, cfg.epochs);
  if (cfg.maxSteps < 0) return invalidArgument("--max-steps must be 0 (run the epochs) or more (got {})", cfg.maxSteps);
  if (!(cfg.bucketMb > 0 && cfg.bucketMb <= kMaxBucketMb))
    return invalidArgument("--bucket-mb must be in (0, {}] (got {})", kMaxBucketMb, cfg.bucketMb);
  if ((cfg.sync == SyncMode::kDdp || cfg.sync == SyncMode::kHybrid) && cfg.wire == Wire::kInt8)
    return invalidArgument("--wire int8 is for the DiLoCo outer step; ddp and hybrid gradients take f32 or bf16");
  // Written so that NaN fails every test.
  if (!(cfg.lr > 0 && cfg.lr <= kMaxLr)) return invalidArgument("--lr must be in (0, {}] (got {})", kMaxLr, cfg.lr);
  if (!(cfg.outer.lr > 0 && cfg.outer.lr <= kMaxLr))
    return invalidArgument("--outer-lr must be in (0, {}] (got {})", kMaxLr, cfg.outer.lr);
  if (!(cfg.momentum >= 0 && cfg.momentum < 1)) return invalidArgument("--momentum must be in [0, 1) (got {})", cfg.momentum);
  if (!(cfg.outer.momentum >= 0 && cfg.outer.momentum < 1))
    return invalidArgument("--outer-momentum must be in [0, 1) (got {})", cfg.outer.momentum);
  if (!(cfg.weightDecay >= 0 && cfg.weightDecay <= 1))
    return invalidArgument("--weight-decay must be in [0, 1] (got {})", cfg.weightDecay);
  if (!(cfg.targetAccuracy >= 0 && cfg.targetAccuracy <= 1))
    return invalidArgument("--target-accuracy must be in (0, 1] (got {})", cfg.targetAccuracy);
  if (cfg.checkpointEvery < 0 || cfg.evalEvery < 0 || cfg.logEvery < 1)
    return invalidArgument("--checkpoint-every and --eval-every must be 0 or more and --log-every 1 or more (got {}, "
                           "{}, {})",
                           cfg.checkpointEvery, cfg.evalEvery, cfg.logEvery);
  if (cfg.computeNice < -1 || cfg.computeNice > 19)
    return invalidArgument("--compute-nice must be auto or 0..19 (got {})", cfg.computeNice);
  return Status();
}

Result<TrainSummary> train(const TrainConfig& config, const TrainContext& ctx) {
  if (ctx.backend == nullptr) return invalidArgument("train: no backend");
  try {
    Run run(config, ctx);
    Result<TrainSummary> done = run.go();
    if (!done.isOk()) run.giveUp(done.status());
    return done;
  } catch (const std::bad_alloc&) {
    return invalidArgument("out of memory on the {} backend (model {}, batch {})",
                           ctx.backend->device() == kernels::Device::kCpu ? "cpu" : "cuda",
                           formatModel(config.model), config.globalBatch);
  } catch (const std::exception& e) {
    return internalError("training failed: {}", e.what());
  }
}

}  // namespace meridian::trainer
