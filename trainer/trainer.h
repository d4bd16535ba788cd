// The data-parallel training loop behind meridian-train: Fashion-MNIST, the MLP, one of
// the sync modes, checkpoints, progress lines and a final summary.
//
// Data order: every epoch has one permutation of the training set from (seed, epoch),
// the same on every rank. Step s takes the global batch at position s of that epoch and
// rank r trains on its r-th slice (globalBatch / worldSize rows), so a run on n ranks sees
// exactly the samples a run on one rank sees, and DDP gives the same weights up to
// floating-point summation order.
//
// Sync modes:
//   ddp     gradients averaged every step (GradientSync, buckets overlapped with backward)
//   diloco  H local AdamW steps, then the pseudo-gradients averaged and an outer Nesterov
//           step (OuterSync); about H times fewer bytes on the wire
//   hybrid  ddp inside each region every step, diloco across regions every H steps
//           (regions from MERIDIAN_REGION, else inferred by the routing layer)
//   none    every rank trains alone (a baseline)
//
// Elastic (an elastic communicator: meridian-train's default, docs/elastic.md): when ranks are
// lost, the survivors take the successor communicator and go on. The global batch, the
// learning rate and the data order stay as they were (rank r of n trains on rows
// [G r / n, G (r + 1) / n) of step s's global batch, its gradient weighted by its share), so
// no sample is skipped and the optimisation is the one of the undisturbed run up to
// summation order. A step is applied only once all its gradients were averaged (no bucket
// is stepped early), so every survivor holds the state after its last whole step; the
// survivors adopt the state of the one furthest ahead (checked by digest) and redo the
// step that was cut. DiLoCo redoes the outer sync that was cut. Hybrid splits its region and
// cross-region communicators from the job's anew after every change (regions may then be
// uneven: ranks past the smallest region's size sit the cross-region sync out and take its
// result from their region's first rank); a rank lost mid-round costs the regions behind
// the furthest up to H inner steps. At membership boundaries (every joinCheckEvery steps,
// with an outer sync the nearest multiple of H) the members admit the ranks waiting to join
// (a process started with --join, or a rank that was left out and asks again), which take
// the step and the state from rank 0 and train on from there, and let go of the ranks asked
// to leave (TrainContext::leaveRequested: SIGTERM in meridian-train), who see no error.
//
// Integrity: ranks check that they loaded the same data (a SHA-256 of the decoded sets,
// compared across ranks) and, after a resume, the same replicated weights. A training
// loss that is not finite stops the run with an error; weights are checked before every
// checkpoint (and at the end), so no checkpoint is ever written from NaN or infinite
// weights and the last good one stays. Checkpoints are signed (HMAC-SHA256, see
// checkpoint.h); one that does not verify, or holds numbers that are not finite, is
// skipped when choosing where to resume.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "bootstrap/store.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "trainer/model.h"
#include "trainer/sync.h"

namespace meridian::trainer {

enum class SyncMode : std::uint8_t { kDdp, kDiloco, kHybrid, kNone };
std::string_view toString(SyncMode mode);
Result<SyncMode> parseSyncMode(const std::string& text);

enum class OptimizerKind : std::uint8_t { kSgd, kAdamW };
Result<OptimizerKind> parseOptimizer(const std::string& text);

// The ranges checkConfig enforces (meridian-train's options say the same at parsing).
inline constexpr float kMaxLr = 1000.0f;           // --lr and --outer-lr: finite, in (0, kMaxLr]
inline constexpr int kMaxGlobalBatch = 1 << 20;    // --batch: 1..kMaxGlobalBatch (and at most the data)
inline constexpr int kMaxEpochs = 1'000'000;       // --epochs: 1..kMaxEpochs
inline constexpr int kMaxInnerSteps = 1'000'000;   // -H: 1..kMaxInnerSteps
inline constexpr double kMaxBucketMb = 1024;       // --bucket-mb: (0, kMaxBucketMb]
// Checkpoints each rank keeps. Ranks agree that every one of them finished the previous
// checkpoint before any writes the next (the finite check before a write is a collective),
// so the rank furthest behind is at most one checkpoint behind the others: keeping two
// always leaves a step that every rank holds to resume from.
inline constexpr int kCheckpointsKept = 2;

struct TrainConfig {
  ModelConfig model;
  SyncMode sync = SyncMode::kDdp;
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // the inner optimizer (DiLoCo: always AdamW)
  float lr = 1e-3f;
  float momentum = 0.9f;      // SGD; [0, 1)
  float weightDecay = 0.0f;   // SGD: L2; AdamW: decoupled; [0, 1]
  int globalBatch = 256;      // divided evenly over the ranks
  int epochs = 3;
  std::int64_t maxSteps = 0;  // > 0: stop after this many steps (before the epochs end)
  int innerSteps = 16;        // H for diloco and hybrid
  OuterParams outer;
  Wire wire = Wire::kF32;     // gradients (ddp: f32|bf16) and pseudo-gradients (f32|bf16|int8)
  double bucketMb = 4.0;
  std::uint64_t seed = 1;
  std::string dataDir;        // empty: kFashionMnistDir
  std::string checkpointDir;  // empty: no checkpoints
  int checkpointEvery = 0;    // steps; 0: only at the end (when a directory is set)
  bool resume = false;
  int logEvery = 50;          // steps between progress lines (rank 0)
  int evalEvery = 0;          // steps between test-set evaluations; 0: at each epoch's end
  double targetAccuracy = 0;  // in (0, 1]: report the time the test accuracy first reached it; 0: none
  bool stopAtTarget = false;  // and stop there (every rank sees the same accuracy)
  bool quiet = false;         // no progress lines
  // Elastic: steps between the members' checks for ranks waiting to join (a broadcast of 8
  // bytes from rank 0); 0: nobody is admitted.
  int joinCheckEvery = 25;
  // Nice value for the thread that computes (0..19), set once the communicator's threads
  // run, so that they go first when cores are short (the CPU side of NCCL's high-priority
  // stream); -1: auto, kAutoComputeNice when this host's ranks outnumber its cores, else 0.
  int computeNice = -1;
};
inline constexpr int kAutoComputeNice = 10;

struct TrainSummary {
  std::int64_t steps = 0;        // steps this run made (after a resume: from the checkpoint)
  std::int64_t finalStep = 0;
  double wallSec = 0;
  double computeSec = 0;         // forward, backward, optimizer
  double exposedCommSec = 0;     // waiting for communication after compute
  double samplesPerSec = 0;      // global
  // Rank 0: what one rank alone manages on the whole global batch (measured before training).
  double oneRankSamplesPerSec = 0;
  double testAccuracy = 0;
  double testLoss = 0;
  double trainLoss = 0;          // mean over the last logging interval
  double timeToTargetSec = -1;   // first evaluation at or above targetAccuracy; -1: never
  std::uint64_t bytesSent = 0;   // this rank's transport bytes, all peers
  std::uint64_t bytesCrossRegion = 0;  // this rank's transport bytes to ranks of other regions
  std::uint64_t payloadBytes = 0;      // gradient / pseudo-gradient payload this rank put on the wire
  // The same three summed over every rank.
  std::uint64_t worldBytesSent = 0;
  std::uint64_t worldBytesCrossRegion = 0;
  std::uint64_t worldPayloadBytes = 0;
  int worldSize = 1;
  int regionCount = 0;           // regions known to the routing layer (0: none)
  int computeNice = 0;           // rank 0's compute thread's nice value (TrainConfig::computeNice)
  // Elastic runs: this rank's rank at the end (0 prints the summary), the world size it
  // started with and after each membership change it went through (so the changes are one
  // fewer), and the time the losses cost it (from the cut collective to the state agreed on
  // the successor).
  int rank = 0;
  std::vector<int> worldSizes;
  double recoverySec = 0;
  int membershipChanges() const { return worldSizes.empty() ? 0 : static_cast<int>(worldSizes.size()) - 1; }
  // This rank left the job as asked (drain, TrainContext::leaveRequested) at finalStep; the
  // others went on (no other figure is filled in).
  bool left = false;
  std::vector<float> params;     // the final parameters (host copy), for tests and tools
};

// Everything a rank needs from its launcher. comm is null for a world of one; store is the
// rendezvous store (hybrid creates its region communicators through it). `external`, when
// set instead of comm, carries the sync over another library (comparisons; no hybrid, no
// transport byte counts).
struct TrainContext {
  kernels::Backend* backend = nullptr;
  collectives::Communicator* comm = nullptr;
  SyncComm* external = nullptr;
  bootstrap::Store* store = nullptr;
  collectives::CommOptions commOptions;  // for the region communicators
  // comm came from Communicator::join (meridian-train --join): the members hand this rank
  // the step and the state (docs/elastic.md) instead of it starting from the seed.
  bool joined = false;
  // Elastic: where a rank the others went on without asks to join again (the job's store,
  // MERIDIAN_STORE); empty: it stops instead.
  std::string rejoinStore;
  // Elastic: turns true when this rank is asked to leave (meridian-train: SIGTERM). At the
  // next membership boundary it hands over and returns a summary with `left` set; the
  // others see no error.
  const std::atomic<bool>* leaveRequested = nullptr;
};

// The checks that need no data and no peers (batch divisible by the world size, option
// ranges, wire format against the sync mode): kInvalidArgument naming the option. Launchers
// call it before joining the job, so a bad option fails every rank the same way at once.
Status checkConfig(const TrainConfig& config, int worldSize);

// Runs the whole training; errors (bad data, a broken communicator, a checkpoint that does
// not match the configuration, ranks that disagree on data or weights, a loss or weights
// that are not finite: kInvalidArgument, fix the input) come back as a Status.
Result<TrainSummary> train(const TrainConfig& config, const TrainContext& ctx);

}  // namespace meridian::trainer
