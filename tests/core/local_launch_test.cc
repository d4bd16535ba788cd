// The local launcher's CPU binding: the share each rank gets, and that a launched rank runs
// on exactly that share; errors come back as a Status.
#include "core/local_launch.h"

#include "core/check.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace meridian {
namespace {

TEST(RankCpus, BlocksWhenCpusSufficeSharedCpusWhenTheyDoNot) {
  const std::vector<int> eight{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(rankCpus(eight, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(rankCpus(eight, 1, 2), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(rankCpus(eight, 2, 3), (std::vector<int>{5, 6, 7}));  // 8/3: blocks of 2, 3, 3
  EXPECT_EQ(rankCpus(eight, 0, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(rankCpus(eight, 7, 8), (std::vector<int>{7}));
  // More ranks than CPUs: neighbours share, every CPU gets the same number of ranks.
  const std::vector<int> two{2, 5};  // whatever the allowed CPUs are called
  std::vector<int> placed;
  for (int r = 0; r < 4; ++r) {
    const std::vector<int> one = rankCpus(two, r, 4);
    ASSERT_EQ(one.size(), 1u) << "rank " << r;
    placed.push_back(one[0]);
  }
  EXPECT_EQ(placed, (std::vector<int>{2, 2, 5, 5}));
  EXPECT_EQ(rankCpus(two, 2, 3), (std::vector<int>{5}));
  // Every rank's block is non-empty and the blocks cover the CPUs without overlap.
  for (int ranks = 1; ranks <= 8; ++ranks) {
    std::multiset<int> covered;
    for (int r = 0; r < ranks; ++r)
      for (const int c : rankCpus(eight, r, ranks)) covered.insert(c);
    EXPECT_EQ(covered, (std::multiset<int>(eight.begin(), eight.end()))) << ranks << " ranks";
  }
  EXPECT_THROW(rankCpus(eight, 2, 2), CheckError);
  EXPECT_THROW(rankCpus({}, 0, 1), CheckError);
}

// The launcher returns what stops it instead of throwing.
TEST(LaunchLocalRanks, BadOptionsComeBackAsInvalidArgumentWithoutStartingAnything) {
  LocalLaunchOptions o;
  o.ranks = 0;
  o.argv = {"/bin/true"};
  Result<int> r = internalError("not run");
  EXPECT_NO_THROW(r = launchLocalRanks(o));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "--ranks must be at least 1 (not 0)");
  o.ranks = 2;
  o.argv.clear();
  EXPECT_EQ(launchLocalRanks(o).status().code(), StatusCode::kInvalidArgument);
  o.argv = {"/bin/true"};
  o.outputPrefixes = {"[a] "};
  EXPECT_EQ(launchLocalRanks(o).status().message(), "1 output prefixes for 2 ranks (want one per rank)");
}

TEST(LaunchLocalRanks, ReturnsTheWorstExitStatus) {
  LocalLaunchOptions o;
  o.ranks = 2;
  o.argv = {"/bin/sh", "-c", "exit $((MERIDIAN_RANK * 3))"};
  const Result<int> worst = launchLocalRanks(o);
  ASSERT_TRUE(worst.isOk()) << worst.status().toString();
  EXPECT_EQ(worst.value(), 3);
}

TEST(LaunchLocalRanks, ListensOnAFreeLoopbackPort) {
  Result<LoopbackListener> listener = listenOnFreeLoopbackPort();
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  EXPECT_GT(listener->port, 0);
  int listening = 0;
  socklen_t len = sizeof listening;
  ASSERT_EQ(::getsockopt(listener->fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len), 0);
  EXPECT_EQ(listening, 1);
  EXPECT_NE(::fcntl(listener->fd.get(), F_GETFD) & FD_CLOEXEC, 0);
}

// Regression (issue 26): the launcher picked a free port, released it and left rank 0 to
// bind it again, a window in which anyone could take it. Now the port is listening before
// any rank starts, and rank 0 alone inherits the socket (MERIDIAN_STORE_FD) to serve on.
TEST(LaunchLocalRanks, RankZeroInheritsTheStoreSocketAlreadyListening) {
  LocalLaunchOptions o;
  o.ranks = 3;
  o.argv = {"/bin/sh", "-c",
            "set -e\n"
            "if [ \"$MERIDIAN_RANK\" = 0 ]; then\n"
            "  readlink \"/proc/self/fd/$MERIDIAN_STORE_FD\" | grep -q '^socket:'\n"
            "  port=${MERIDIAN_STORE##*:}\n"
            "  grep -q \" 0100007F:$(printf %04X \"$port\") 00000000:0000 0A \" /proc/net/tcp\n"
            "else\n"
            "  [ -z \"${MERIDIAN_STORE_FD:-}\" ]\n"
            "fi\n"};
  ::setenv("MERIDIAN_STORE_FD", "999", 1);  // a stale one from above is no rank's
  const Result<int> worst = launchLocalRanks(o);
  ::unsetenv("MERIDIAN_STORE_FD");
  ASSERT_TRUE(worst.isOk()) << worst.status().toString();
  EXPECT_EQ(worst.value(), 0) << "rank 0 lacked a listening socket on MERIDIAN_STORE's port, or another rank got one";
}

// A rank taken down on purpose (meridian-lab kill) is no failure, and once released it
// starts again as a joiner: MERIDIAN_JOIN=on, its own MERIDIAN_RANK, and rank 0 does not
// get the store socket twice. Rank 0 waits for the joiner's mark so that the job is still
// running when the release comes; a rank whose exit nobody took down still counts.
TEST(LaunchLocalRanks, ARankTakenDownStartsAgainAsAJoinerOnceReleased) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("meridian-restart-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  LocalLaunchOptions o;
  o.ranks = 2;
  o.extraEnv = {{"DIR", dir.string()}};
  o.argv = {"/bin/sh", "-c",
            "if [ \"$MERIDIAN_RANK\" = 0 ]; then\n"
            "  i=0; while [ ! -e \"$DIR/joined\" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done\n"
            "  [ -e \"$DIR/joined\" ]; exit $?\n"
            "elif [ \"${MERIDIAN_JOIN:-off}\" = on ]; then\n"
            "  echo \"$MERIDIAN_RANK ${MERIDIAN_STORE_FD:-none}\" > \"$DIR/joined\"; exit 0\n"
            "else\n"
            "  exit 9\n"  // as a SIGKILLed rank fails
            "fi\n"};
  std::atomic<int> asked{0};
  o.takenDown = [&](int rank) { return rank == 1; };
  o.released = [&](int rank) { return rank == 1 && ++asked >= 3; };  // released after a few looks
  const Result<int> worst = launchLocalRanks(o);
  ASSERT_TRUE(worst.isOk()) << worst.status().toString();
  EXPECT_EQ(worst.value(), 0) << "the first exit of a rank taken down counted as a failure, or the joiner never came";
  std::ifstream joined(dir / "joined");
  std::string line;
  std::getline(joined, line);
  EXPECT_EQ(line, "1 none");
  EXPECT_GE(asked.load(), 3);

  o.takenDown = [](int) { return false; };  // nobody took it down: exit 9 is a failure
  o.failureGrace = std::chrono::seconds(0);
  std::filesystem::remove(dir / "joined");
  const Result<int> failed = launchLocalRanks(o);
  ASSERT_TRUE(failed.isOk()) << failed.status().toString();
  EXPECT_EQ(failed.value(), 128 + SIGTERM) << "rank 0 was not stopped after rank 1 failed";
  std::filesystem::remove_all(dir);
}

TEST(AllowedCpus, AreThisProcessesAscending) {
  const std::vector<int> cpus = allowedCpus();
  ASSERT_FALSE(cpus.empty());
  for (std::size_t i = 1; i < cpus.size(); ++i) EXPECT_LT(cpus[i - 1], cpus[i]);
}

// Parses /proc's Cpus_allowed_list ("0-2,5") into CPUs.
std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    const std::size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    pos = end + 1;
  }
  return cpus;
}

class LaunchBindTest : public ::testing::TestWithParam<bool> {};

TEST_P(LaunchBindTest, EveryRankRunsOnItsShareOrUnbound) {
  const bool bind = GetParam();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("meridian-bind-" + std::to_string(::getpid()) + (bind ? "-on" : "-off"));
  std::filesystem::create_directories(dir);
  const std::vector<int> allowed = allowedCpus();
  const int ranks = static_cast<int>(allowed.size()) * 2;  // more ranks than CPUs: they share
  LocalLaunchOptions o;
  o.ranks = ranks;
  o.bindCpus = bind;
  o.argv = {"/bin/sh", "-c",
            "sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status > \"$0/rank$MERIDIAN_RANK\"",
            dir.string()};
  const Result<int> worst = launchLocalRanks(o);
  ASSERT_TRUE(worst.isOk()) << worst.status().toString();
  ASSERT_EQ(worst.value(), 0);
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::string line;
    ASSERT_TRUE(std::getline(in, line)) << "rank " << r << " wrote nothing";
    EXPECT_EQ(parseCpuList(line), bind ? rankCpus(allowed, r, ranks) : allowed) << "rank " << r << ": " << line;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Bind, LaunchBindTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Bound" : "Unbound"; });

}  // namespace
}  // namespace meridian
