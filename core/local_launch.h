// Starts N copies of a program as local ranks (MERIDIAN_RANK, MERIDIAN_WORLD_SIZE,
// MERIDIAN_STORE on a free loopback port, and a fresh random MERIDIAN_SECRET unless a
// job secret is set), waits for all, and returns the worst exit
// code. If one rank fails, the others get SIGTERM after a grace period (only the PIDs
// started here); if the launcher dies, however, every rank gets SIGTERM at once
// (PR_SET_PDEATHSIG). Used by `meridian-bench --ranks N` and `meridian-train --ranks N`.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/fd.h"
#include "core/status.h"

namespace meridian {

struct LocalLaunchOptions {
  int ranks = 1;
  std::vector<std::string> argv;  // argv[0] is the program (looked up in PATH without a '/')
  std::vector<std::pair<std::string, std::string>> extraEnv;
  std::chrono::seconds failureGrace{10};
  // Where rank 0 hosts the store ("host:port"); empty: a free loopback port, which the
  // launcher binds and listens on itself and hands to rank 0 (MERIDIAN_STORE_FD), so that
  // nobody can take the port between its choice and the store's start.
  std::string store;
  // With `store`: a socket already listening on its port, handed to rank 0 the same way
  // (opened with close-on-exec; the caller keeps it open until launchLocalRanks returns).
  // -1: rank 0 binds `store` itself.
  int storeListenFd = -1;
  // Every rank on a host of its own (MERIDIAN_LOCAL_RANK 0 of 1) rather than all on this one.
  bool separateHosts = false;
  // Per rank: more environment, and a step run in the child before exec (e.g. entering a
  // network namespace; it returns an error text, empty when fine).
  std::function<std::vector<std::pair<std::string, std::string>>(int rank)> rankEnv;
  std::function<std::string(int rank)> childSetup;
  // Per rank: a prefix for every line the rank prints (stdout and stderr, merged); empty: no
  // prefixing, the ranks write straight to this process's stdout and stderr.
  std::vector<std::string> outputPrefixes;
  // Bind every rank to its own share of the CPUs this process may use (rankCpus), as
  // mpirun --bind-to core does: ranks that the scheduler moves between cores lose their
  // caches and fall out of step with each other. A rank whose binding fails says so and
  // runs unbound.
  bool bindCpus = false;
  // The job goes on without a rank that failed (an elastic job): the others are not stopped,
  // and the launch succeeds when the ranks that did not fail exited 0 (a rank ends well only
  // once the job reached its end); the failed ranks are said once each.
  bool elastic = false;
  // Ranks taken down on purpose (meridian-lab kill/drain NODE). `takenDown` is asked once
  // when a rank exits: true means it was taken down, so its exit is no failure whatever its
  // code and nobody is stopped for it. `released` is then asked often while the others run:
  // once true, the rank starts again as a joiner of the running job (MERIDIAN_JOIN=on,
  // MERIDIAN_RANK its old rank, which it asks back). Nothing restarts once every rank has
  // ended. Unset: no rank is ever taken down.
  std::function<bool(int rank)> takenDown;
  std::function<bool(int rank)> released;
};

// The CPUs this process may run on (sched_getaffinity), ascending; at least one.
std::vector<int> allowedCpus();
// Rank r's share of `allowed` (C CPUs) among R ranks: the block [rC/R, (r+1)C/R) when R <= C,
// else the one CPU at floor(rC/R), so that neighbouring ranks share a CPU in groups of R/C.
// Needs 0 <= r < R and C >= 1 (CheckError otherwise: a caller's bug).
std::vector<int> rankCpus(const std::vector<int>& allowed, int rank, int ranks);

// The host's online cores (at least 1): the cores its local ranks share, whatever mask
// each rank is bound to.
int hostCores();
// Whether this host runs more local ranks (MERIDIAN_LOCAL_WORLD_SIZE, as every launcher
// Meridian knows sets it) than hostCores(): ranks then take turns on the cores, and a
// waiting thread should yield rather than spin. Read once.
bool localRanksOutnumberCores();

// Returns the worst exit status (0 when every rank succeeded; 128+signal for a signal), or
// an error when the options are wrong (kInvalidArgument) or a rank could not be started
// (kInternal; the ranks already started are stopped first). Never throws.
Result<int> launchLocalRanks(const LocalLaunchOptions& options);

// The command line to start this program again as each rank: /proc/self/exe and argv[1..],
// without the options in `drop` (each taking a value, as "--opt v" or "--opt=v").
std::vector<std::string> relaunchArgv(int argc, char** argv, const std::vector<std::string>& drop);

// A TCP socket listening (close-on-exec) on a loopback port the kernel chose, and the port.
struct LoopbackListener {
  UniqueFd fd;
  int port = 0;
};
Result<LoopbackListener> listenOnFreeLoopbackPort();

}  // namespace meridian
