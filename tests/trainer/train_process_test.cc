// meridian-train as users run it: local ranks it starts itself, a run killed with SIGKILL
// half-way and resumed (it must end on exactly the weights of an uninterrupted run),
// hybrid sync over two named regions, and clear errors for bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/common/lab_session.h"
#include "tests/common/poll.h"
#include "tests/trainer/synthetic.h"
#include "trainer/checkpoint.h"
#include "trainer/dataset.h"
#include "trainer/integrity.h"
#include "trainer/trainer.h"

namespace meridian::trainer {
namespace {

namespace fs = std::filesystem;
using meridian::testing::pollUntil;
using meridian::testing::processEnded;
using meridian::testing::runShell;

class TrainProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meridian-train-proc-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/data");
    Status st = testing::writeSyntheticFashion(dir_ + "/data");
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string train(const std::string& args) const {
    return std::string(MERIDIAN_TRAIN_BIN) + " --data-dir " + dir_ + "/data --quiet " + args;
  }

  // The key meridian-train --ranks signs checkpoints with in this environment.
  static CheckpointKey key() {
    Result<CheckpointSecret> secret = checkpointSecretFromEnvironment();
    EXPECT_TRUE(secret.isOk()) << secret.status().toString();
    return checkpointKey(secret.isOk() ? secret->secret : std::string());
  }

  // The final parameters a run left in its newest checkpoint of rank `rank`.
  std::vector<std::uint8_t> finalParams(const std::string& ckptDir, int rank = 0) const {
    auto ck = loadLatestCheckpoint(ckptDir + "/rank-" + std::to_string(rank), key());
    if (!ck.isOk()) {
      ADD_FAILURE() << ck.status().toString();
      return {};
    }
    const auto* p = ck->find("params");
    return p != nullptr ? p->data : std::vector<std::uint8_t>{};
  }

  // Runs `cmd` in the background, its output to `out`.
  static pid_t startShell(const std::string& cmd, const std::string& out) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >" + out + " 2>&1").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }
  static std::string readAll(const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  // The rank process of launcher `pid` that has MERIDIAN_RANK=`rank` (-1 if none); its
  // MERIDIAN_STORE, MERIDIAN_SECRET and MERIDIAN_REGION, quoted for a shell, into `*joinEnv`
  // (what a joiner for its job rank needs).
  static pid_t rankProcess(pid_t pid, int rank, std::string* joinEnv = nullptr) {
    std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
    for (pid_t c; children >> c;) {
      const std::string all = readAll("/proc/" + std::to_string(c) + "/environ");
      if (all.find("MERIDIAN_RANK=" + std::to_string(rank) + '\0') == std::string::npos) continue;
      std::istringstream vars(all);
      for (std::string v; joinEnv != nullptr && std::getline(vars, v, '\0');) {
        if (v.rfind("MERIDIAN_STORE=", 0) == 0 || v.rfind("MERIDIAN_SECRET=", 0) == 0 ||
            v.rfind("MERIDIAN_REGION=", 0) == 0)
          *joinEnv += "'" + v + "' ";
      }
      return c;
    }
    return -1;
  }

  // `meridian-train --ranks 4 <args>` (its output in membersOut(), its JSON in
  // membersJson()), with job rank 2 killed at step 200; the launcher's pid (-1 after a
  // failure, reported), and what a joiner for job rank 2 needs in `*joinEnv`.
  pid_t startMembersAndKillRank2(const std::string& args, std::string* joinEnv) const {
    const pid_t pid = startShell(fmt::format("{} --ranks 4 {} --eval-every 100000 --log-every 10 --json {}",
                                             MERIDIAN_TRAIN_BIN, args, membersJson()),
                                 membersOut());
    if (pid < 0) {
      ADD_FAILURE() << "could not start the members";
      return -1;
    }
    const bool reached = pollUntil(
        [&] { return readAll(membersOut()).find("step    200/") != std::string::npos || processEnded(pid); },
        std::chrono::seconds(120), std::chrono::milliseconds(2));
    const pid_t victim = rankProcess(pid, 2, joinEnv);
    if (!reached || victim <= 0 || processEnded(pid)) {
      ADD_FAILURE() << "the run ended before a rank could be killed: " << readAll(membersOut());
      return -1;
    }
    ::kill(victim, SIGKILL);
    return pid;
  }
  // Waits for the members' launcher to exit 0 and returns their JSON summary (null after a
  // failure, reported).
  nlohmann::json membersFinished(pid_t pid) const {
    int status = 0;
    if (!pollUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(180))) {
      ADD_FAILURE() << "the members did not finish";
      return {};
    }
    const std::string text = readAll(membersOut());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << text;
      return {};
    }
    std::ifstream f(membersJson());
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) ADD_FAILURE() << text;
    return j.is_discarded() ? nlohmann::json() : j;
  }
  std::string membersOut() const { return dir_ + "/members.out"; }
  std::string membersJson() const { return dir_ + "/members.json"; }

  std::string dir_;
};

TEST_F(TrainProcessTest, KilledHalfWayAndResumedEndsOnTheUninterruptedWeights) {
  const std::string common = "--ranks 2 --model 784-256-256-10 --batch 64 --max-steps 120 --checkpoint-every 10";
  auto straight = runShell(train(common + " --checkpoint-dir " + dir_ + "/straight"));
  ASSERT_EQ(straight.code, 0) << straight.output;

  // The same run in its own process group, killed (SIGKILL, every rank at once) once it has
  // written a checkpoint past step 30.
  const std::string ckpt = dir_ + "/killed";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    const std::string cmd = train(common + " --checkpoint-dir " + ckpt) + " >/dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  bool killed = false;
  pollUntil(
      [&] {
        auto steps = validCheckpointSteps(ckpt + "/rank-1", key());
        if (steps.isOk() && !steps->empty() && steps->front() >= 30) {
          ::kill(-pid, SIGKILL);
          killed = true;
          return true;
        }
        int status = 0;
        return ::waitpid(pid, &status, WNOHANG) == pid;  // finished before we could kill it
      },
      std::chrono::seconds(120), std::chrono::milliseconds(5));
  if (killed) ::waitpid(pid, nullptr, 0);
  ASSERT_TRUE(killed) << "the run ended before it could be killed";
  auto newest = validCheckpointSteps(ckpt + "/rank-0", key());
  ASSERT_TRUE(newest.isOk());
  ASSERT_FALSE(newest->empty());
  ASSERT_LT(newest->front(), 120u) << "killed after the end";

  auto resumed = runShell(train(common + " --checkpoint-dir " + ckpt + " --resume --json " + dir_ + "/resumed.json"));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  std::ifstream f(dir_ + "/resumed.json");
  auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["final_step"], 120);
  EXPECT_LT(j["steps"].get<int>(), 120) << "it resumed rather than starting over";
  for (int rank : {0, 1}) {
    const auto a = finalParams(dir_ + "/straight", rank);
    const auto b = finalParams(ckpt, rank);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "rank " << rank << ": the resumed run's weights differ from the uninterrupted run's";
  }
}

// Killing the launcher of --ranks N (even with SIGKILL) takes its ranks with it: nothing
// keeps training in the background.
TEST_F(TrainProcessTest, RanksDieWithTheirLauncher) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string data = dir_ + "/data";
    ::execl(MERIDIAN_TRAIN_BIN, MERIDIAN_TRAIN_BIN, "--ranks", "2", "--data-dir", data.c_str(), "--quiet", "--model",
            "784-32-10", "--epochs", "100000", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> ranks;
  pollUntil(
      [&] {
        std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
        ranks.clear();
        for (pid_t c; children >> c;) ranks.push_back(c);
        return ranks.size() >= 2;
      },
      std::chrono::seconds(5), std::chrono::milliseconds(25));
  ASSERT_EQ(ranks.size(), 2u) << "the launcher did not start its ranks";
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  for (pid_t r : ranks) {
    const bool gone = pollUntil([&] { return processEnded(r); }, std::chrono::seconds(5), std::chrono::milliseconds(25));
    EXPECT_TRUE(gone) << "rank process " << r << " outlived its launcher";
    if (!gone) ::kill(r, SIGKILL);
  }
}

// Elastic training (issue 28): one of 4 local ranks killed with SIGKILL while training. The
// survivors agree on the membership, take the successor communicator and go on from the
// step that was cut, with the same global batch. A process started with --join (the lost
// rank's store, secret and job rank) is admitted at a later step boundary and takes the
// state. The run ends at its last step on 4 ranks, exit 0 (the joiner too), within a point
// of the undisturbed run's accuracy (same seed, same samples).
class ElasticTrainTest : public TrainProcessTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ElasticTrainTest, ARankKilledMidRunTheOthersFinishTheRun) {
  // The real data set: the synthetic one is learnt perfectly, which would hide a difference.
  if (!fs::exists(kFashionMnistDir)) {
    GTEST_SKIP() << kFashionMnistDir << " is missing: apt-get install dataset-fashion-mnist";
  }
  const std::string common = fmt::format("--ranks 4 --data-dir {} --model 784-128-128-10 --batch 64 --max-steps 1500 "
                                         "--eval-every 100000 {}",
                                         kFashionMnistDir, GetParam());
  auto straight = runShell(std::string(MERIDIAN_TRAIN_BIN) + " --quiet " + common + " --json " + dir_ + "/straight.json");
  ASSERT_EQ(straight.code, 0) << straight.output;

  const std::string out = dir_ + "/elastic.out";
  const std::string json = dir_ + "/elastic.json";
  const pid_t pid = startShell(std::string(MERIDIAN_TRAIN_BIN) + " --log-every 10 " + common + " --json " + json, out);
  ASSERT_GE(pid, 0);
  // Rank 2 dies once rank 0 has said step 300 (while all are training).
  const bool reached = pollUntil(
      [&] { return readAll(out).find("step    300/") != std::string::npos || processEnded(pid); },
      std::chrono::seconds(120), std::chrono::milliseconds(2));
  std::string joinEnv;  // the victim's MERIDIAN_STORE and MERIDIAN_SECRET, for the joiner
  const pid_t victim = rankProcess(pid, 2, &joinEnv);
  ASSERT_TRUE(reached && victim > 0 && !processEnded(pid)) << "the run ended before a rank could be killed";
  ::kill(victim, SIGKILL);
  auto joiner = runShell("env " + joinEnv + "MERIDIAN_RANK=2 MERIDIAN_METRICS_ADDR=0 " + std::string(MERIDIAN_TRAIN_BIN) +
                         " --join --quiet " + common.substr(common.find("--data-dir")));
  EXPECT_EQ(joiner.code, 0) << joiner.output;
  int status = 0;
  ASSERT_TRUE(pollUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(180)))
      << "the survivors did not finish";
  const std::string text = readAll(out);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  EXPECT_NE(text.find("membership: 4 -> 3 ranks (job ranks 0,1,3)"), std::string::npos) << text;
  EXPECT_NE(text.find("membership: 3 -> 4 ranks (job ranks 0,1,3,2); 1 joined"), std::string::npos) << text;
  // Admitted without stopping the members: they asked at one boundary and trained on while
  // the grown communicator was built; the joiner came in at a later one.
  std::smatch admitted;
  ASSERT_TRUE(std::regex_search(text, admitted, std::regex(R"(1 joined, at step (\d+) \(asked at step (\d+)\), the members stopped ([0-9.]+) s)")))
      << text;
  EXPECT_GT(std::stoll(admitted[1]), std::stoll(admitted[2])) << text;
  std::ifstream a(dir_ + "/straight.json"), b(json);
  auto ja = nlohmann::json::parse(a, nullptr, false);
  auto jb = nlohmann::json::parse(b, nullptr, false);
  ASSERT_FALSE(ja.is_discarded() || jb.is_discarded()) << text;
  EXPECT_EQ(jb["final_step"], 1500);
  EXPECT_EQ(jb["start_ranks"], 4);
  EXPECT_EQ(jb["ranks"], 4);
  EXPECT_EQ(jb["membership_changes"], 2);
  EXPECT_EQ(jb["world_sizes"], nlohmann::json::array({4, 3, 4}));
  EXPECT_LT(jb["recovery_s"].get<double>(), 5.0);
  // Within a point: summation order alone moves this run's accuracy that much (undisturbed,
  // the same samples and steps: 86.32% on 1 rank, 86.22% on 2, 86.82% on 4).
  EXPECT_NEAR(jb["test_accuracy"].get<double>(), ja["test_accuracy"].get<double>(), 0.01) << text;
  std::printf("[ figures  ] %s: test accuracy %.2f%% undisturbed, %.2f%% with rank 2 killed and back; %.3f s recovering; "
              "joiner asked at step %s, in at step %s, the members stopped %s s for it; wall %.2f s vs %.2f s\n",
              GetParam(), 100 * ja["test_accuracy"].get<double>(), 100 * jb["test_accuracy"].get<double>(),
              jb["recovery_s"].get<double>(), admitted[2].str().c_str(), admitted[1].str().c_str(),
              admitted[3].str().c_str(), ja["wall_s"].get<double>(), jb["wall_s"].get<double>());
}
// Hybrid: regions a {0, 1} and b {2, 3}; without rank 2 they are uneven (rank 3 sits out the
// cross-region sync and takes its result from its region's first rank).
INSTANTIATE_TEST_SUITE_P(SyncModes, ElasticTrainTest,
                         ::testing::Values("--sync ddp", "--sync diloco -H 20", "--sync hybrid -H 20 --regions a,a,b,b"),
                         [](const auto& p) { return std::string(p.index == 0 ? "Ddp" : p.index == 1 ? "Diloco" : "Hybrid"); });

// A joiner that decoded other data than the members (here the synthetic set, not
// Fashion-MNIST) learns it from rank 0's digest in the welcome and stops alone with a line
// saying so; the members lose it like any rank and finish the run.
TEST_F(TrainProcessTest, AJoinerWithOtherDataStopsAloneAndTheMembersFinish) {
  if (!fs::exists(kFashionMnistDir)) {
    GTEST_SKIP() << kFashionMnistDir << " is missing: apt-get install dataset-fashion-mnist";
  }
  const std::string common = "--model 784-32-10 --batch 64 --max-steps 1500";
  std::string joinEnv;
  const pid_t pid = startMembersAndKillRank2(fmt::format("--data-dir {} {}", kFashionMnistDir, common), &joinEnv);
  ASSERT_GT(pid, 0);
  auto joiner = runShell("env " + joinEnv + "MERIDIAN_RANK=2 MERIDIAN_METRICS_ADDR=0 " + std::string(MERIDIAN_TRAIN_BIN) +
                         " --join --quiet --data-dir " + dir_ + "/data " + common);
  EXPECT_NE(joiner.code, 0) << joiner.output;
  EXPECT_NE(joiner.output.find("decoded different data than rank 0"), std::string::npos) << joiner.output;
  const nlohmann::json j = membersFinished(pid);
  EXPECT_EQ(j["final_step"], 1500);
  EXPECT_EQ(j["world_sizes"], nlohmann::json::array({4, 3, 4, 3})) << readAll(membersOut());
}

// A joiner whose admission is under way when the members finish their last step comes in
// at the end (the members wait for the build) and ends with them, exit 0, instead of being
// dropped and then asking a job that is over. The only boundary is the step before the last.
TEST_F(TrainProcessTest, AJoinerAdmittedAtTheLastBoundaryEndsWithTheMembers) {
  if (!fs::exists(kFashionMnistDir)) {
    GTEST_SKIP() << kFashionMnistDir << " is missing: apt-get install dataset-fashion-mnist";
  }
  const std::string common = fmt::format("--data-dir {} --model 784-32-10 --batch 64 --max-steps 6000 "
                                         "--join-check-every 5999", kFashionMnistDir);
  std::string joinEnv;
  const pid_t pid = startMembersAndKillRank2(common, &joinEnv);
  ASSERT_GT(pid, 0);
  auto joiner = runShell("env " + joinEnv + "MERIDIAN_RANK=2 MERIDIAN_METRICS_ADDR=0 " + std::string(MERIDIAN_TRAIN_BIN) +
                         " --join --quiet " + common);
  EXPECT_EQ(joiner.code, 0) << joiner.output;
  const nlohmann::json j = membersFinished(pid);
  const std::string text = readAll(membersOut());
  EXPECT_EQ(j["final_step"], 6000);
  EXPECT_EQ(j["world_sizes"], nlohmann::json::array({4, 3, 4})) << text << joiner.output;
  EXPECT_NE(text.find("1 joined, at step 6000"), std::string::npos) << text;
}

// Drain (hot migration): rank 1 gets SIGTERM mid-run. It finishes its step, leaves at the next
// membership boundary and exits 0; the others go on on 3 ranks and nobody logs an error.
TEST_F(TrainProcessTest, ARankSentSigtermLeavesAtTheNextBoundaryAndNobodySeesAnError) {
  const std::string out = dir_ + "/drain.out";
  const std::string json = dir_ + "/drain.json";
  const pid_t pid = startShell(std::string(MERIDIAN_TRAIN_BIN) + " --ranks 4 --regions a,a,b,b --sync hybrid -H 10 "
                               "--data-dir " + dir_ + "/data --model 784-32-10 --batch 64 --max-steps 600 "
                               "--eval-every 100000 --log-every 10 --json " + json,
                               out);
  ASSERT_GE(pid, 0);
  auto text = [&] { return readAll(out); };
  const bool reached = pollUntil([&] { return text().find("step    100/") != std::string::npos || processEnded(pid); },
                                 std::chrono::seconds(120), std::chrono::milliseconds(2));
  const pid_t leaver = rankProcess(pid, 1);
  ASSERT_TRUE(reached && leaver > 0 && !processEnded(pid)) << "the run ended before a rank could be drained";
  ::kill(leaver, SIGTERM);
  int status = 0;
  ASSERT_TRUE(pollUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(180)))
      << "the run did not finish";
  const std::string log = text();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  EXPECT_NE(log.find("job rank(s) 1 left as asked"), std::string::npos) << log;
  EXPECT_NE(log.find("left the job at step"), std::string::npos) << log;
  EXPECT_EQ(log.find("[error]"), std::string::npos) << "a drain is no error:\n" << log;
  EXPECT_EQ(log.find("aborted"), std::string::npos) << "no op may be cut by a drain:\n" << log;
  std::ifstream f(json);
  auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << log;
  EXPECT_EQ(j["final_step"], 600);
  EXPECT_EQ(j["world_sizes"], nlohmann::json::array({4, 3}));
  EXPECT_EQ(j["recovery_s"].get<double>(), 0.0);  // nothing was lost
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.8);
}

TEST_F(TrainProcessTest, HybridOverTwoNamedRegions) {
  const std::string json = dir_ + "/hybrid.json";
  // The regions are labels on one host here: shared memory would carry every byte, across
  // the "regions" too, and the transport's counters judged below would see none of it.
  auto r = runShell("MERIDIAN_SHM=off " +
                    train("--ranks 4 --regions eu,eu,us,us --sync hybrid -H 5 --model 784-32-10 --batch 64 "
                          "--max-steps 40 --json " + json));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream f(json);
  auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["regions"], 2);
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.8);
  // Every step inside the region, every 5 steps across: payload = 4 ranks x (40 + 8) x params.
  const double params = 784 * 32 + 32 + 32 * 10 + 10;
  EXPECT_EQ(j["payload_bytes"].get<double>(), 4 * (40 + 8) * params * 4);
  EXPECT_GT(j["bytes_cross_region"].get<double>(), 0);
  EXPECT_LT(j["bytes_cross_region"].get<double>(), 0.5 * j["bytes_sent"].get<double>());
}

TEST_F(TrainProcessTest, BadInputGetsAClearError) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"--sync allgather", "expected ddp, diloco, hybrid or none"},
      {"--model 784-x-10", "not a width"},
      {"--wire fp8", "expected f32, bf16 or int8"},
      {"--device tpu", "expected cpu, cuda or auto"},
      {"--ranks 2 --regions eu", "names 1 regions for 2 ranks"},
      {"--ranks 2 --batch 63 --max-steps 1", "multiple of the 2 ranks"},
      {"--ranks 2 --sync hybrid --max-steps 1", "MERIDIAN_REGION"},
      {"--ranks 2 --bind sometimes", "--bind: sometimes not in {cpus,none}"},
      // Issue 26: these started processes without limit, ran one process quietly, or were
      // taken as they came.
      {"--ranks 100000", "--ranks: Value 100000 not in range 1 to 256"},
      {"--ranks 0", "--ranks: Value 0 not in range 1 to 256"},
      {"--ranks -2", "--ranks: Value -2 not in range 1 to 256"},
      {"--target-accuracy 5", "--target-accuracy: 5 is outside (0, 1]"},
      {"--max-steps -5", "--max-steps: Value -5 not in range 0"},
      {"--lr 1e300", "--lr: 1e300 is outside (0, 1000]"},
      {"--lr nan", "--lr: nan is outside (0, 1000]"},
      {"--lr 0", "--lr: 0 is outside (0, 1000]"},
      {"--momentum 1", "--momentum: 1 is outside [0, 1)"},
      {"--outer-momentum -0.1", "--outer-momentum: -0.1 is outside [0, 1)"},
      {"--epochs 0", "--epochs: Value 0 not in range 1 to 1000000"},
      {"--batch 0", "--batch: Value 0 not in range 1 to 1048576"},
      {"--inner-steps 0", "--inner-steps: Value 0 not in range 1 to 1000000"},
      {"--bucket-mb inf", "--bucket-mb: inf is outside (0, 1024]"},
      {"--eval-every -1", "--eval-every: Value -1 not in range 0"},
      {"--lr abc", "--lr: 'abc' is not a number"},
  };
  for (const auto& c : cases) {
    auto r = runShell(train(c.args));
    EXPECT_EQ(r.code, 2) << c.args;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
  auto missing = runShell(std::string(MERIDIAN_TRAIN_BIN) + " --data-dir /nonexistent --max-steps 1");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("apt-get install dataset-fashion-mnist"), std::string::npos) << missing.output;
}

// Issue 26: --lr 1e300 gave a NaN loss and exit 0. A run that diverges now exits non-zero on
// every rank, and each rank's newest checkpoint is a finite one from before.
TEST_F(TrainProcessTest, ADivergingRunExitsNonZeroAndKeepsItsLastGoodCheckpoints) {
  const std::string ckpt = dir_ + "/diverged";
  auto r = runShell(train(fmt::format("--ranks 2 --model 784-32-10 --batch 64 --optimizer sgd --lr {} "
                                      "--max-steps 60 --checkpoint-every 2 --checkpoint-dir {}",
                                      kMaxLr, ckpt)));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  for (int rank : {0, 1}) {
    const std::string dir = ckpt + "/rank-" + std::to_string(rank);
    auto all = validCheckpointSteps(dir, key());
    ASSERT_TRUE(all.isOk());
    ASSERT_FALSE(all->empty()) << "rank " << rank << "\n" << r.output;
    EXPECT_LT(all->front(), 60u);
    auto finite = validCheckpointSteps(dir, key(), [](const Checkpoint& c) { return checkFiniteSections(c.sections); });
    EXPECT_EQ(finite.value(), all.value()) << "rank " << rank << " kept a checkpoint that is not finite";
  }
}

}  // namespace
}  // namespace meridian::trainer
