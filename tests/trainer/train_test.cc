// The training loop on real communicators (ranks as threads over TCP): DDP on 1, 2 and 4
// ranks ends with the same weights, the wire formats and DiLoCo move the bytes they
// should, checkpoints resume bit-exactly (also past a corrupt one), and bad configurations
// are refused. Data: a small synthetic set with Fashion-MNIST's shape (synthetic.h); one
// smoke test trains on the real Fashion-MNIST.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/rank_harness.h"
#include "tests/trainer/synthetic.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/integrity.h"

namespace meridian::trainer {
namespace {

namespace fs = std::filesystem;

class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dataDir_ = new std::string(fs::temp_directory_path() / ("meridian-train-test-" + std::to_string(::getpid())));
    fs::create_directories(*dataDir_);
    Status st = testing::writeSyntheticFashion(*dataDir_);
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dataDir_);
    delete dataDir_;
  }
  void TearDown() override {
    for (const auto& d : scratch_) fs::remove_all(d);
  }

  std::string scratchDir(const std::string& name) {
    std::string d = *dataDir_ + "-" + name;
    fs::remove_all(d);
    scratch_.push_back(d);
    return d;
  }

  static TrainConfig smallConfig() {
    TrainConfig cfg;
    cfg.model.widths = {784, 32, 10};
    cfg.optimizer = OptimizerKind::kSgd;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.globalBatch = 64;
    cfg.maxSteps = 20;
    cfg.bucketMb = 0.02;  // several buckets, so overlap and ordering are exercised
    cfg.dataDir = *dataDir_;
    cfg.quiet = true;
    cfg.evalEvery = 1000000;
    return cfg;
  }

  // One rank, no communicator.
  static Result<TrainSummary> trainAlone(const TrainConfig& cfg) {
    auto backend = kernels::makeCpuBackend(1);
    TrainContext ctx;
    ctx.backend = backend.get();
    return train(cfg, ctx);
  }

  // n ranks as threads; every rank's summary, or the failures.
  static std::vector<TrainSummary> trainRanks(int n, const TrainConfig& cfg, std::string* failure) {
    return trainRanksWith(n, [&](int) { return cfg; }, failure);
  }
  // The same with a configuration per rank.
  static std::vector<TrainSummary> trainRanksWith(int n, const std::function<TrainConfig(int)>& configOf,
                                                  std::string* failure) {
    std::vector<TrainSummary> out(static_cast<std::size_t>(n));
    auto harness = testing::RankHarness::start(n);
    if (!harness.isOk()) {
      *failure = harness.status().toString();
      return out;
    }
    auto results = (*harness)->run([&](int rank, collectives::Communicator& comm) -> std::string {
      auto backend = kernels::makeCpuBackend(1);
      TrainContext ctx;
      ctx.backend = backend.get();
      ctx.comm = &comm;
      const TrainConfig cfg = configOf(rank);
      auto r = train(cfg, ctx);
      if (!r.isOk()) return r.status().toString();
      out[static_cast<std::size_t>(rank)] = std::move(r).value();
      return "";
    });
    *failure = testing::RankHarness::summarize(results);
    return out;
  }

  // n ranks trained to stopAt (checkpoints in cfg.checkpointDir), then `between` (which may
  // edit the checkpoints), then resumed to cfg.maxSteps: the resumed ranks' summaries.
  static std::vector<TrainSummary> stopAndResume(int n, TrainConfig cfg, std::int64_t stopAt,
                                                 const std::function<void()>& between, std::string* failure) {
    const std::int64_t end = cfg.maxSteps;
    cfg.maxSteps = stopAt;
    trainRanks(n, cfg, failure);
    if (!failure->empty()) return {};
    if (between) between();
    cfg.maxSteps = end;
    cfg.resume = true;
    return trainRanks(n, cfg, failure);
  }

  // The key this process signs checkpoints with (what train() uses).
  static CheckpointKey key() {
    Result<CheckpointSecret> secret = checkpointSecretFromEnvironment();
    EXPECT_TRUE(secret.isOk()) << secret.status().toString();
    return checkpointKey(secret.isOk() ? secret->secret : std::string());
  }

  // Rewrites rank `rank`'s checkpoint of `step`, correctly signed, with `edit` applied to
  // its parameters (as floats): what someone holding the key, or a bug, could write.
  static void editParams(const std::string& ckptDir, int rank, std::uint64_t step,
                         const std::function<void(std::vector<float>&)>& edit) {
    const std::string dir = ckptDir + "/rank-" + std::to_string(rank);
    Result<Checkpoint> ck = readCheckpoint(checkpointPath(dir, step), key());
    ASSERT_TRUE(ck.isOk()) << ck.status().toString();
    std::vector<CheckpointSection> sections = ck->sections;
    for (CheckpointSection& sec : sections) {
      if (sec.name != "params") continue;
      std::vector<float> params(sec.data.size() / sizeof(float));
      std::memcpy(params.data(), sec.data.data(), sec.data.size());
      edit(params);
      std::memcpy(sec.data.data(), params.data(), sec.data.size());
    }
    ASSERT_TRUE(writeCheckpoint(dir, key(), step, sections, 100).isOk());
  }

  static std::string* dataDir_;
  std::vector<std::string> scratch_;
};
std::string* TrainTest::dataDir_ = nullptr;

// ||a - b|| / ||a|| and max |a - b| / max |a|.
void expectClose(const std::vector<float>& a, const std::vector<float>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double diff2 = 0, norm2 = 0, maxDiff = 0, maxAbs = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff2 += d * d;
    norm2 += static_cast<double>(a[i]) * static_cast<double>(a[i]);
    maxDiff = std::max(maxDiff, std::fabs(d));
    maxAbs = std::max(maxAbs, std::fabs(static_cast<double>(a[i])));
  }
  EXPECT_LE(std::sqrt(diff2 / norm2), rel) << what;
  EXPECT_LE(maxDiff / maxAbs, rel) << what;
}

TEST_F(TrainTest, DdpOnOneTwoAndFourRanksEndsWithTheSameWeights) {
  const TrainConfig cfg = smallConfig();
  auto one = trainAlone(cfg);
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  EXPECT_EQ(one->finalStep, 20);
  for (int n : {2, 4}) {
    std::string failure;
    auto ranks = trainRanks(n, cfg, &failure);
    ASSERT_EQ(failure, "");
    expectClose(one->params, ranks[0].params, 1e-5, "ddp on " + std::to_string(n) + " ranks vs 1");
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(ranks[static_cast<std::size_t>(r)].params, ranks[0].params) << "rank " << r << " of " << n;
    // Every step averaged every parameter once.
    EXPECT_EQ(ranks[0].payloadBytes, 20u * one->params.size() * sizeof(float));
  }
}

// The same for the small CNN: its convolution gradients are sums over pixels and rows that a
// split batch adds in another grouping, within the same 1e-5.
TEST_F(TrainTest, DdpOfTheCnnOnTwoAndFourRanksEndsWithTheSameWeights) {
  TrainConfig cfg = smallConfig();
  ASSERT_TRUE(parseModel("784-c4-c8-16-10", &cfg.model).isOk());
  cfg.maxSteps = 10;
  auto one = trainAlone(cfg);
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  for (int n : {2, 4}) {
    std::string failure;
    auto ranks = trainRanks(n, cfg, &failure);
    ASSERT_EQ(failure, "");
    expectClose(one->params, ranks[0].params, 1e-5, "cnn ddp on " + std::to_string(n) + " ranks vs 1");
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(ranks[static_cast<std::size_t>(r)].params, ranks[0].params) << "rank " << r << " of " << n;
  }
}

TEST_F(TrainTest, WireFormatsAndDilocoCutTheBytes) {
  // The transport's byte counts are judged below: the gradients must cross it, not shared
  // memory (which the ranks of this one process would otherwise take).
  ASSERT_EQ(::setenv("MERIDIAN_SHM", "off", 1), 0);
  struct Restore {
    ~Restore() { ::unsetenv("MERIDIAN_SHM"); }
  } restore;
  TrainConfig ddp = smallConfig();
  ddp.maxSteps = 40;
  std::string failure;
  auto f32 = trainRanks(2, ddp, &failure);
  ASSERT_EQ(failure, "");
  ddp.wire = Wire::kBF16;
  auto bf16 = trainRanks(2, ddp, &failure);
  ASSERT_EQ(failure, "");
  EXPECT_EQ(bf16[0].payloadBytes * 2, f32[0].payloadBytes);
  EXPECT_GT(bf16[0].testAccuracy, 0.8);
  EXPECT_GT(f32[0].testAccuracy, 0.8);

  TrainConfig diloco = smallConfig();
  diloco.sync = SyncMode::kDiloco;
  diloco.lr = 2e-3f;
  diloco.maxSteps = 40;
  diloco.innerSteps = 8;
  for (Wire wire : {Wire::kF32, Wire::kInt8}) {
    diloco.wire = wire;
    auto d = trainRanks(2, diloco, &failure);
    ASSERT_EQ(failure, "") << toString(wire);
    // 40 steps, a sync every 8: 5 syncs of every parameter.
    const std::size_t n = f32[0].params.size();
    const std::size_t perSync = wire == Wire::kF32 ? n * 4 : int8PackedBytes(n);
    EXPECT_EQ(d[0].payloadBytes, 5 * perSync) << toString(wire);
    if (wire == Wire::kF32) {
      EXPECT_EQ(f32[0].payloadBytes, 8 * d[0].payloadBytes);
    }
    // The transport carried about that much (plus probes and control traffic).
    EXPECT_GE(d[0].bytesSent, d[0].payloadBytes / 2) << toString(wire);  // ring: half of it per peer for 2 ranks
    EXPECT_EQ(d[0].params, d[1].params) << "ranks share the model after the final outer step";
    EXPECT_GT(d[0].testAccuracy, 0.8) << toString(wire);
  }
}

TEST_F(TrainTest, ResumeIsBitExactAlsoPastACorruptCheckpoint) {
  TrainConfig cfg = smallConfig();
  cfg.optimizer = OptimizerKind::kAdamW;
  cfg.lr = 2e-3f;
  cfg.maxSteps = 30;
  cfg.checkpointDir = scratchDir("straight");
  auto straight = trainAlone(cfg);
  ASSERT_TRUE(straight.isOk()) << straight.status().toString();

  // Stop at 20 (checkpoints at 10 and 20), then resume to 30.
  cfg.checkpointDir = scratchDir("stopped");
  cfg.checkpointEvery = 10;
  cfg.maxSteps = 20;
  ASSERT_TRUE(trainAlone(cfg).isOk());
  const std::string copy = scratchDir("stopped-copy");
  fs::copy(cfg.checkpointDir, copy, fs::copy_options::recursive);
  cfg.maxSteps = 30;
  cfg.resume = true;
  auto resumed = trainAlone(cfg);
  ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
  EXPECT_EQ(resumed->steps, 10);
  EXPECT_EQ(resumed->params, straight->params) << "resumed run differs from the uninterrupted one";

  // The same with the checkpoint of step 20 corrupted: the resume falls back to step 10
  // and still lands on the same weights.
  {
    std::fstream f(copy + "/rank-0/ckpt-000000000020.mrc", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    char c = 0;
    f.seekg(100);
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  cfg.checkpointDir = copy;
  auto fallback = trainAlone(cfg);
  ASSERT_TRUE(fallback.isOk()) << fallback.status().toString();
  EXPECT_EQ(fallback->steps, 20) << "resumed from step 10, past the corrupt checkpoint of step 20";
  EXPECT_EQ(fallback->params, straight->params);
}

TEST_F(TrainTest, DdpResumeOnTwoRanksIsBitExact) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 24;
  std::string failure;
  auto straight = trainRanks(2, cfg, &failure);
  ASSERT_EQ(failure, "");
  cfg.checkpointDir = scratchDir("ddp2");
  auto resumed = stopAndResume(2, cfg, 12, nullptr, &failure);
  ASSERT_EQ(failure, "");
  EXPECT_EQ(resumed[0].steps, 12);
  EXPECT_EQ(resumed[0].params, straight[0].params);
}

// Issue 26: a checkpoint with NaN weights (its digest recomputed) resumed and trained to
// 10% accuracy. Now a checkpoint must verify under the key and hold finite numbers; the
// resume falls back to the last good one and lands on the uninterrupted run's weights.
TEST_F(TrainTest, ACheckpointWithNanWeightsIsRefusedEvenWhenItsDigestVerifies) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 15;
  auto straight = trainAlone(cfg);
  ASSERT_TRUE(straight.isOk()) << straight.status().toString();

  cfg.checkpointDir = scratchDir("nan-ckpt");
  cfg.checkpointEvery = 5;
  cfg.maxSteps = 10;
  ASSERT_TRUE(trainAlone(cfg).isOk());
  editParams(cfg.checkpointDir, 0, 10, [](std::vector<float>& p) { p[3] = std::numeric_limits<float>::quiet_NaN(); });
  EXPECT_EQ(validCheckpointSteps(cfg.checkpointDir + "/rank-0", key()).value(), (std::vector<std::uint64_t>{10, 5}))
      << "the edited checkpoint verifies: only the finite check refuses it";

  cfg.maxSteps = 15;
  cfg.resume = true;
  auto resumed = trainAlone(cfg);
  ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
  EXPECT_EQ(resumed->steps, 10) << "resumed from step 5, past the NaN checkpoint of step 10";
  EXPECT_EQ(resumed->params, straight->params);

  // A checkpoint signed under another key is no checkpoint: with only such, the run starts over.
  const std::string foreign = scratchDir("foreign-ckpt");
  ASSERT_TRUE(writeCheckpoint(foreign + "/rank-0", checkpointKey("another job"), 5, {{"meta", {'{', '}'}}}).isOk());
  cfg.checkpointDir = foreign;
  resumed = trainAlone(cfg);
  ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
  EXPECT_EQ(resumed->steps, 15);
}

// Issue 26: --lr 1e300 gave a NaN loss and exit 0, and the NaN checkpoints rotated the good
// ones away. Now the run stops with an error and the newest checkpoint is a finite one.
TEST_F(TrainTest, DivergenceStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  TrainConfig cfg = smallConfig();
  cfg.lr = kMaxLr;  // SGD at the largest learning rate accepted: diverges within 60 steps
  cfg.maxSteps = 60;
  cfg.checkpointDir = scratchDir("diverged");
  cfg.checkpointEvery = 2;
  auto r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk()) << "trained 60 steps at lr " << cfg.lr << " without diverging";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("training diverged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stopping without saving these weights"), std::string::npos) << msg;

  const std::string dir = cfg.checkpointDir + "/rank-0";
  Result<std::vector<std::uint64_t>> all = validCheckpointSteps(dir, key());
  ASSERT_TRUE(all.isOk());
  ASSERT_FALSE(all->empty()) << msg;
  EXPECT_EQ(validCheckpointSteps(dir, key(), [](const Checkpoint& c) { return checkFiniteSections(c.sections); }).value(),
            *all)
      << "every checkpoint left holds finite weights";
  EXPECT_NE(msg.find(fmt::format("the last good checkpoint: step {} in {}", all->front(), cfg.checkpointDir)),
            std::string::npos)
      << msg;
  EXPECT_LT(all->front(), 60u);
}

// Issue 26: ranks whose newest valid checkpoints differed restarted from step 0 saying
// "no checkpoint". Now they resume from the newest step all of them hold.
TEST_F(TrainTest, RanksWithDifferentNewestCheckpointsResumeFromTheOneAllHold) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 20;
  std::string failure;
  auto straight = trainRanks(2, cfg, &failure);
  ASSERT_EQ(failure, "");

  cfg.checkpointDir = scratchDir("uneven");
  cfg.checkpointEvery = 5;
  // Rank 1 holds step 10, rank 0 steps 15 and 10.
  auto resumed = stopAndResume(
      2, cfg, 15, [&] { fs::remove(checkpointPath(cfg.checkpointDir + "/rank-1", 15)); }, &failure);
  ASSERT_EQ(failure, "");
  EXPECT_EQ(resumed[0].steps, 10);
  EXPECT_EQ(resumed[1].steps, 10);
  EXPECT_EQ(resumed[0].params, straight[0].params);

  // No step that both hold: a clear error on every rank, not a silent start from step 0.
  const std::string apart = scratchDir("apart");
  fs::create_directories(apart);
  fs::copy(cfg.checkpointDir, apart, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(apart + "/rank-1")) fs::remove(e.path());
  cfg.checkpointDir = apart;
  cfg.resume = true;
  trainRanks(2, cfg, &failure);
  EXPECT_NE(failure.find("no checkpoint step is held by every rank"), std::string::npos) << failure;
  EXPECT_NE(failure.find("(the newest valid one by rank: 20, -1"), std::string::npos) << failure;
}

TEST_F(TrainTest, RanksThatResumeDifferentWeightsAreRefused) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 20;
  cfg.checkpointDir = scratchDir("split-brain");
  std::string failure;
  stopAndResume(
      2, cfg, 10, [&] { editParams(cfg.checkpointDir, 1, 10, [](std::vector<float>& p) { p[0] += 1e-3f; }); },
      &failure);
  EXPECT_NE(failure.find("ranks hold different weights ('params' of every rank): rank(s) 1 differ from rank 0"),
            std::string::npos)
      << failure;
}

TEST_F(TrainTest, RanksThatLoadedDifferentDataAreRefused) {
  const std::string other = scratchDir("other-data");
  fs::create_directories(other);
  ASSERT_TRUE(testing::writeSyntheticSplit(other, "train", 1024, 99).isOk());
  ASSERT_TRUE(testing::writeSyntheticSplit(other, "t10k", 256, 8).isOk());
  std::string failure;
  trainRanksWith(
      2,
      [&](int rank) {
        TrainConfig cfg = smallConfig();
        if (rank == 1) cfg.dataDir = other;
        return cfg;
      },
      &failure);
  EXPECT_NE(failure.find("ranks hold different data"), std::string::npos) << failure;
}

TEST_F(TrainTest, ACheckpointOfAnotherRunIsRefused) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 5;
  cfg.checkpointDir = scratchDir("other");
  ASSERT_TRUE(trainAlone(cfg).isOk());
  cfg.model.widths = {784, 16, 10};
  cfg.resume = true;
  cfg.maxSteps = 10;
  auto r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("written by a different run (widths"), std::string::npos) << r.status().message();
  // Same dense widths behind conv blocks: still another model.
  cfg.model.widths = {784, 32, 10};
  cfg.model.convChannels = {4};
  r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("written by a different run (conv was [], this run has [4])"), std::string::npos)
      << r.status().message();
}

TEST_F(TrainTest, StopsAtTheTargetAccuracyOnEveryRank) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 200;
  cfg.evalEvery = 5;
  cfg.targetAccuracy = 0.6;
  cfg.stopAtTarget = true;
  std::string failure;
  auto ranks = trainRanks(2, cfg, &failure);
  ASSERT_EQ(failure, "");
  EXPECT_GE(ranks[0].timeToTargetSec, 0);
  EXPECT_LT(ranks[0].finalStep, 200);
  EXPECT_EQ(ranks[0].finalStep % 5, 0) << "stops right after an evaluation";
  EXPECT_EQ(ranks[1].finalStep, ranks[0].finalStep);
  EXPECT_GE(ranks[0].testAccuracy, 0.6);
}

TEST_F(TrainTest, BadConfigurationsAreRefusedClearly) {
  TrainConfig cfg = smallConfig();
  cfg.globalBatch = 63;
  std::string failure;
  trainRanks(2, cfg, &failure);
  EXPECT_NE(failure.find("multiple of the 2 ranks"), std::string::npos) << failure;

  cfg = smallConfig();
  cfg.model.widths = {100, 10};
  auto r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("784 inputs"), std::string::npos) << r.status().message();

  cfg = smallConfig();
  cfg.dataDir = "/nonexistent/fashion";
  r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("dataset-fashion-mnist"), std::string::npos) << r.status().message();

  cfg = smallConfig();
  cfg.sync = SyncMode::kDdp;
  cfg.wire = Wire::kInt8;
  r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("int8"), std::string::npos);

  cfg = smallConfig();
  cfg.resume = true;
  r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("--resume needs --checkpoint-dir"), std::string::npos);

  // Issue 26: nonsense numbers were accepted. Each is refused naming its option.
  const std::vector<std::pair<std::function<void(TrainConfig&)>, std::string>> ranges = {
      {[](TrainConfig& c) { c.lr = std::numeric_limits<float>::quiet_NaN(); }, "--lr must be in (0, 1000]"},
      {[](TrainConfig& c) { c.lr = std::numeric_limits<float>::infinity(); }, "--lr must be in (0, 1000]"},
      {[](TrainConfig& c) { c.outer.lr = 0; }, "--outer-lr must be in (0, 1000]"},
      {[](TrainConfig& c) { c.momentum = 1; }, "--momentum must be in [0, 1)"},
      {[](TrainConfig& c) { c.targetAccuracy = 5; }, "--target-accuracy must be in (0, 1]"},
      {[](TrainConfig& c) { c.maxSteps = -5; }, "--max-steps must be 0"},
      {[](TrainConfig& c) { c.epochs = 0; }, "--epochs must be in 1..1000000"},
      {[](TrainConfig& c) { c.bucketMb = std::numeric_limits<double>::quiet_NaN(); }, "--bucket-mb must be in"},
      {[](TrainConfig& c) { c.checkpointEvery = -1; }, "--checkpoint-every"},
  };
  for (const auto& [set, fragment] : ranges) {
    cfg = smallConfig();
    set(cfg);
    r = trainAlone(cfg);
    ASSERT_FALSE(r.isOk()) << fragment;
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  }

  cfg = smallConfig();
  cfg.computeNice = 20;
  r = trainAlone(cfg);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("--compute-nice"), std::string::npos) << r.status().message();
}

// --compute-nice lowers the thread that trains (only that one: Linux nice values are per
// thread), after the communicator's threads have started, and the summary says so.
TEST_F(TrainTest, ComputeNiceLowersOnlyTheTrainingThread) {
  TrainConfig cfg = smallConfig();
  cfg.maxSteps = 2;
  cfg.computeNice = 7;
  errno = 0;
  const int before = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  ASSERT_EQ(errno, 0);
  if (before >= cfg.computeNice) GTEST_SKIP() << "this test already runs at nice " << before;
  int during = -100;
  Result<TrainSummary> r = internalError("not run");
  std::thread t([&] {
    r = trainAlone(cfg);
    during = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  });
  t.join();
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->computeNice, 7);
  EXPECT_EQ(during, 7);
  EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))), before) << "the caller's thread";
}

// The smoke tests on the real data set: a short CPU run of `model` (DDP, 2 ranks, 150 steps
// of 128) is far above chance (10%), and both ranks end with the same weights.
class RealFashionMnistTest : public TrainTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(RealFashionMnistTest, TrainsWellAboveChance) {
  if (!fs::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  TrainConfig cfg;
  ASSERT_TRUE(parseModel(GetParam(), &cfg.model).isOk());
  cfg.lr = 2e-3f;
  cfg.globalBatch = 128;
  cfg.maxSteps = 150;
  cfg.quiet = true;
  cfg.evalEvery = 1000000;
  std::string failure;
  auto ranks = trainRanks(2, cfg, &failure);
  ASSERT_EQ(failure, "");
  EXPECT_GT(ranks[0].testAccuracy, 0.75);
  EXPECT_LT(ranks[0].testLoss, 0.8);
  EXPECT_EQ(ranks[0].params, ranks[1].params);
}

// The MLP, and the small CNN (one rank alone measured 82.8% after these 150 steps).
INSTANTIATE_TEST_SUITE_P(Models, RealFashionMnistTest, ::testing::Values("784-128-10", "784-c8-c16-64-10"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param).find("-c") == std::string::npos ? "mlp" : "cnn";
                         });

}  // namespace
}  // namespace meridian::trainer
