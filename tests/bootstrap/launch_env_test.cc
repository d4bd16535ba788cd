// Launcher detection (each launcher's variables, precedence, bad values) and rendezvous
// at the store that rank 0 hosts.
#include "bootstrap/launch_env.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace {

using std::chrono::milliseconds;
namespace tcp = transport::tcp;

constexpr const char* kSecret = "meridian-test-secret";

// Every variable detectLaunch reads.
constexpr const char* kLaunchVars[] = {
    "MERIDIAN_RANK", "MERIDIAN_WORLD_SIZE", "MERIDIAN_STORE", "MERIDIAN_STORE_FD", "MERIDIAN_LOCAL_RANK",
    "MERIDIAN_LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NODEID",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
};

// Clears every launcher variable for the test and restores the environment afterwards.
class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kLaunchVars) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }

  static LaunchInfo detectOk() {
    auto info = detectLaunch();
    EXPECT_TRUE(info) << info.status().toString();
    return info ? info.value() : LaunchInfo{};
  }
  static void expectInvalidNaming(const char* fragment) {
    auto info = detectLaunch();
    ASSERT_FALSE(info) << "detected launcher " << info->launcher;
    EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(info.status().message().find(fragment), std::string::npos) << info.status().message();
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST_F(LaunchEnvTest, NoLauncherMeansOneProcessWithAKernelPickedStorePort) {
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.worldSize, 1);
  EXPECT_EQ(info.localRank, 0);
  EXPECT_EQ(info.localWorldSize, 1);
  EXPECT_EQ(info.storeAddress, "127.0.0.1:0");
}

TEST_F(LaunchEnvTest, MeridianKnobsAreReadAndWinOverEveryLauncher) {
  set("MERIDIAN_RANK", "2");
  set("MERIDIAN_WORLD_SIZE", "4");
  set("MERIDIAN_STORE", "10.1.2.3:5000");
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("RANK", "1");
  set("WORLD_SIZE", "8");
  set("SLURM_PROCID", "3");
  set("SLURM_NTASKS", "8");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "meridian");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.worldSize, 4);
  EXPECT_EQ(info.localRank, -1);
  EXPECT_EQ(info.localWorldSize, -1);
  EXPECT_EQ(info.storeAddress, "10.1.2.3:5000");
}

TEST_F(LaunchEnvTest, MeridianRankWithoutWorldSizeIsInvalid) {
  set("MERIDIAN_RANK", "0");
  expectInvalidNaming("MERIDIAN_WORLD_SIZE");
}

TEST_F(LaunchEnvTest, MeridianKnobsWithoutStoreAcrossUnknownHostsAskForMeridianStore) {
  set("MERIDIAN_RANK", "1");
  set("MERIDIAN_WORLD_SIZE", "2");
  expectInvalidNaming("MERIDIAN_STORE");
}

TEST_F(LaunchEnvTest, MeridianLocalKnobsMakeAllLocalRanksUseTheLoopbackStore) {
  set("MERIDIAN_RANK", "2");
  set("MERIDIAN_WORLD_SIZE", "4");
  set("MERIDIAN_LOCAL_RANK", "2");
  set("MERIDIAN_LOCAL_WORLD_SIZE", "4");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.localRank, 2);
  EXPECT_EQ(info.localWorldSize, 4);
  EXPECT_EQ(info.storeAddress, kDefaultLocalStore);
  set("MERIDIAN_LOCAL_RANK", "5");
  expectInvalidNaming("local rank");
  set("MERIDIAN_LOCAL_RANK", "-2");
  expectInvalidNaming("MERIDIAN_LOCAL_RANK");
}

TEST_F(LaunchEnvTest, OpenMpiVariablesAreRead) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  set("MERIDIAN_STORE", "node0:29500");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.worldSize, 8);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localWorldSize, 4);
  EXPECT_EQ(info.storeAddress, "node0:29500");
}

TEST_F(LaunchEnvTest, AllRanksOnThisHostDefaultToTheLoopbackStore) {
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  EXPECT_EQ(detectOk().storeAddress, kDefaultLocalStore);
}

TEST_F(LaunchEnvTest, RanksOnSeveralHostsWithoutStoreAskForMeridianStore) {
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  expectInvalidNaming("set MERIDIAN_STORE");
}

TEST_F(LaunchEnvTest, OpenMpiWinsOverSlurmAndTorchrun) {
  set("OMPI_COMM_WORLD_RANK", "6");
  set("OMPI_COMM_WORLD_SIZE", "7");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "1");
  set("RANK", "0");
  set("WORLD_SIZE", "1");
  set("MERIDIAN_STORE", "10.0.0.1:1234");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.worldSize, 7);
}

TEST_F(LaunchEnvTest, TorchrunVariablesUseMasterAddrAndPort) {
  set("RANK", "3");
  set("WORLD_SIZE", "16");
  set("LOCAL_RANK", "3");
  set("LOCAL_WORLD_SIZE", "8");
  set("MASTER_ADDR", "trainer-0");
  set("MASTER_PORT", "29500");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.worldSize, 16);
  EXPECT_EQ(info.localRank, 3);
  EXPECT_EQ(info.localWorldSize, 8);
  EXPECT_EQ(info.storeAddress, "trainer-0:29500");
}

TEST_F(LaunchEnvTest, MeridianStoreOverridesMasterAddr) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "trainer-0");
  set("MASTER_PORT", "29500");
  set("MERIDIAN_STORE", "10.0.0.9:7000");
  EXPECT_EQ(detectOk().storeAddress, "10.0.0.9:7000");
}

TEST_F(LaunchEnvTest, TorchrunUnderSrunWinsOverSlurmWhoseProcIdCountsAgents) {
  set("SLURM_PROCID", "1");  // the second torchrun agent
  set("SLURM_NTASKS", "2");
  set("RANK", "13");
  set("WORLD_SIZE", "16");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "29500");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 13);
  EXPECT_EQ(info.worldSize, 16);
}

TEST_F(LaunchEnvTest, SlurmVariablesWithMasterAddrAndTasksPerNode) {
  set("SLURM_PROCID", "6");
  set("SLURM_NTASKS", "7");
  set("SLURM_LOCALID", "0");
  set("SLURM_NNODES", "4");
  set("SLURM_NODEID", "3");
  set("SLURM_TASKS_PER_NODE", "2(x3),1");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "29400");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.worldSize, 7);
  EXPECT_EQ(info.localRank, 0);
  EXPECT_EQ(info.localWorldSize, 1);
  EXPECT_EQ(info.storeAddress, "10.0.0.1:29400");

  set("SLURM_NODEID", "1");
  set("SLURM_LOCALID", "1");
  set("SLURM_PROCID", "3");
  set("SLURM_STEP_TASKS_PER_NODE", "2(x3),1");
  set("SLURM_TASKS_PER_NODE", "garbage that the step list shadows");
  EXPECT_EQ(detectOk().localWorldSize, 2);
}

TEST_F(LaunchEnvTest, SlurmOnOneNodeIsAllLocalAndDefaultsToTheLoopbackStore) {
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "4");
  set("SLURM_LOCALID", "2");
  set("SLURM_NNODES", "1");
  LaunchInfo info = detectOk();
  EXPECT_EQ(info.localWorldSize, 4);
  EXPECT_EQ(info.storeAddress, kDefaultLocalStore);
}

TEST_F(LaunchEnvTest, SlurmAcrossNodesWithoutStoreAskForMeridianStore) {
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "4");
  set("SLURM_NNODES", "2");
  expectInvalidNaming("MERIDIAN_STORE");
}

TEST_F(LaunchEnvTest, MalformedSlurmTasksPerNodeIsInvalidNamingIt) {
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "4");
  set("SLURM_NNODES", "2");
  set("SLURM_NODEID", "0");
  set("SLURM_TASKS_PER_NODE", "2(y2)");
  expectInvalidNaming("SLURM_TASKS_PER_NODE");
  set("SLURM_TASKS_PER_NODE", "2");
  set("SLURM_NODEID", "1");
  expectInvalidNaming("SLURM_NODEID is 1");
}

TEST_F(LaunchEnvTest, MasterAddrWithoutPortIsInvalid) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.0.0.1");
  expectInvalidNaming("MASTER_PORT");
}

TEST_F(LaunchEnvTest, BadStoreAddressesAreInvalidNamingTheirSource) {
  set("MERIDIAN_RANK", "0");
  set("MERIDIAN_WORLD_SIZE", "2");
  set("MERIDIAN_STORE", "no-port-here");
  expectInvalidNaming("MERIDIAN_STORE");
  set("MERIDIAN_STORE", "10.0.0.1:0");
  expectInvalidNaming("port 0");
  ::unsetenv("MERIDIAN_STORE");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "http");
  expectInvalidNaming("MASTER_ADDR/MASTER_PORT");
}

TEST_F(LaunchEnvTest, RanksOutsideTheWorldAreInvalidNamingTheVariables) {
  set("OMPI_COMM_WORLD_RANK", "4");
  set("OMPI_COMM_WORLD_SIZE", "4");
  expectInvalidNaming("OMPI_COMM_WORLD_RANK=4");
  set("OMPI_COMM_WORLD_RANK", "-1");
  expectInvalidNaming("OMPI_COMM_WORLD_RANK=-1");
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "0");
  expectInvalidNaming("OMPI_COMM_WORLD_SIZE=0");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "5");
  expectInvalidNaming("OMPI_COMM_WORLD_LOCAL_SIZE=5");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  expectInvalidNaming("OMPI_COMM_WORLD_LOCAL_RANK=2");
  set("MERIDIAN_RANK", "9");
  set("MERIDIAN_WORLD_SIZE", "3");
  expectInvalidNaming("MERIDIAN_RANK=9");
}

TEST_F(LaunchEnvTest, GarbageNumbersAreInvalidNamingTheVariable) {
  struct Case {
    const char* name;
    const char* value;
  };
  const Case cases[] = {
      {"MERIDIAN_RANK", "zero"},   {"MERIDIAN_WORLD_SIZE", "4x"},     {"OMPI_COMM_WORLD_RANK", "1.5"},
      {"OMPI_COMM_WORLD_SIZE", " 4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "-"}, {"RANK", "99999999999"},
      {"WORLD_SIZE", "0x10"},      {"LOCAL_WORLD_SIZE", "eight"},     {"SLURM_PROCID", "1e3"},
      {"SLURM_NTASKS", "4 "},      {"SLURM_NNODES", "many"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (const char* name : kLaunchVars) ::unsetenv(name);
    // A complete, valid configuration of the launcher the variable belongs to...
    const std::string_view n = c.name;
    if (n.starts_with("MERIDIAN")) {
      set("MERIDIAN_RANK", "0");
      set("MERIDIAN_WORLD_SIZE", "4");
    } else if (n.starts_with("OMPI")) {
      set("OMPI_COMM_WORLD_RANK", "0");
      set("OMPI_COMM_WORLD_SIZE", "4");
    } else if (n.starts_with("SLURM")) {
      set("SLURM_PROCID", "0");
      set("SLURM_NTASKS", "4");
    } else {
      set("RANK", "0");
      set("WORLD_SIZE", "4");
    }
    set("MERIDIAN_STORE", "10.0.0.1:1234");
    ASSERT_TRUE(detectLaunch()) << "the valid base configuration failed";
    // ...spoilt by one garbage value.
    set(c.name, c.value);
    expectInvalidNaming(c.name);
  }
}

// ---- Rendezvous --------------------------------------------------------------------

TEST_F(LaunchEnvTest, OneProcessHostsAndJoinsItsOwnStore) {
  LaunchInfo info = detectOk();
  std::unique_ptr<StoreServer> server;
  auto store = rendezvous(info, kSecret, deadlineAfter(milliseconds(10000)), &server);
  ASSERT_TRUE(store) << store.status().toString();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(storeBarrier(*store.value(), "solo", 1, deadlineAfter(milliseconds(10000))));
}

TEST_F(LaunchEnvTest, ThreeRanksMeetAtTheStoreRankZeroHosts) {
  LaunchInfo rank0;
  rank0.rank = 0;
  rank0.worldSize = 3;
  rank0.storeAddress = "localhost:0";  // a name: rank 0 binds every interface
  rank0.launcher = "test";
  std::unique_ptr<StoreServer> server;
  const TimePoint deadline = deadlineAfter(milliseconds(30000));
  auto store0 = rendezvous(rank0, kSecret, deadline, &server);
  ASSERT_TRUE(store0) << store0.status().toString();
  ASSERT_NE(server, nullptr);

  std::vector<Status> results(3);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r) {
    threads.emplace_back([&, r] {
      LaunchInfo info = rank0;
      info.rank = r;
      info.storeAddress = fmt::format("127.0.0.1:{}", server->port());
      std::unique_ptr<StoreServer> unused;
      auto store = rendezvous(info, kSecret, deadline, &unused);
      if (!store) {
        results[static_cast<std::size_t>(r)] = store.status();
      } else if (unused != nullptr) {
        results[static_cast<std::size_t>(r)] = internalError("rank {} started a server", r);
      } else {
        results[static_cast<std::size_t>(r)] = storeBarrier(*store.value(), "meet", 3, deadline);
      }
    });
  }
  results[0] = storeBarrier(*store0.value(), "meet", 3, deadline);
  for (auto& t : threads) t.join();
  for (const Status& st : results) EXPECT_TRUE(st) << st.toString();
}

TEST_F(LaunchEnvTest, RankZeroFailsClearlyWhenTheStorePortIsTaken) {
  auto taken = StoreServer::start("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(taken);
  LaunchInfo info;
  info.rank = 0;
  info.worldSize = 2;
  info.storeAddress = fmt::format("127.0.0.1:{}", taken.value()->port());
  std::unique_ptr<StoreServer> server;
  auto store = rendezvous(info, kSecret, deadlineAfter(milliseconds(5000)), &server);
  ASSERT_FALSE(store);
  EXPECT_NE(store.status().message().find("MERIDIAN_STORE"), std::string::npos) << store.status().message();
  EXPECT_EQ(server, nullptr);
}

// Regression (issue 26): the --ranks launcher chose a free port, released it and let rank 0
// bind it again, so another process could take it in between. Now the launcher keeps it
// bound and rank 0 serves on the very socket.
TEST_F(LaunchEnvTest, RankZeroAdoptsTheListeningSocketItsLauncherHandsOver) {
  auto listener = tcp::listenOn("127.0.0.1", 0, /*nonBlocking=*/false);
  ASSERT_TRUE(listener) << listener.status().toString();
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(listener->get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::uint16_t port = ntohs(a.sin_port);
  set("MERIDIAN_STORE_FD", std::to_string(listener->release()).c_str());
  LaunchInfo info;
  info.rank = 0;
  info.worldSize = 1;
  info.storeAddress = fmt::format("127.0.0.1:{}", port);
  info.launcher = "test";
  std::unique_ptr<StoreServer> server;
  auto store = rendezvous(info, kSecret, deadlineAfter(milliseconds(10000)), &server);
  ASSERT_TRUE(store) << store.status().toString();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->port(), port);
  EXPECT_EQ(std::getenv("MERIDIAN_STORE_FD"), nullptr) << "taken once, not left for a later rendezvous";
  EXPECT_TRUE(storeBarrier(*store.value(), "adopted", 1, deadlineAfter(milliseconds(10000))));
}

TEST_F(LaunchEnvTest, RankZeroRefusesAStoreFdThatIsNotAListeningSocket) {
  int ends[2] = {-1, -1};
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  UniqueFd readEnd(ends[0]), writeEnd(ends[1]);
  set("MERIDIAN_STORE_FD", std::to_string(readEnd.get()).c_str());
  LaunchInfo info;
  info.rank = 0;
  info.worldSize = 1;
  info.storeAddress = "127.0.0.1:0";
  std::unique_ptr<StoreServer> server;
  auto store = rendezvous(info, kSecret, deadlineAfter(milliseconds(5000)), &server);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("MERIDIAN_STORE_FD=" + std::to_string(readEnd.get())), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find("not a socket"), std::string::npos) << store.status().message();
  EXPECT_EQ(server, nullptr);
  EXPECT_NE(::fcntl(readEnd.get(), F_GETFD), -1) << "what is not the store's socket is left alone";
  set("MERIDIAN_STORE_FD", "-5");
  store = rendezvous(info, kSecret, deadlineAfter(milliseconds(5000)), &server);
  ASSERT_FALSE(store);
  EXPECT_NE(store.status().message().find("MERIDIAN_STORE_FD='-5'"), std::string::npos) << store.status().message();
}

TEST_F(LaunchEnvTest, RendezvousRejectsBadArguments) {
  LaunchInfo info;
  info.rank = 0;
  info.worldSize = 2;
  info.storeAddress = "127.0.0.1:0";
  EXPECT_EQ(rendezvous(info, kSecret, deadlineAfter(milliseconds(100)), nullptr).status().code(),
            StatusCode::kInvalidArgument);
  info.rank = 1;
  std::unique_ptr<StoreServer> server;
  EXPECT_EQ(rendezvous(info, kSecret, deadlineAfter(milliseconds(100)), &server).status().code(),
            StatusCode::kInvalidArgument);
  info.rank = 2;
  info.storeAddress = "127.0.0.1:1";
  EXPECT_EQ(rendezvous(info, kSecret, deadlineAfter(milliseconds(100)), &server).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meridian::bootstrap
