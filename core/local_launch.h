// Starts N copies of a program as local ranks (MERIDIAN_RANK, MERIDIAN_WORLD_SIZE,
// MERIDIAN_STORE on a free loopback port, and a fresh random MERIDIAN_SECRET unless a
// job secret is set), waits for all, and returns the worst exit
// code. If one rank fails, the others get SIGTERM after a grace period (only the PIDs
// started here). Used by `meridian-bench --ranks N` and `meridian-train --ranks N`.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace meridian {

struct LocalLaunchOptions {
  int ranks = 1;
  std::vector<std::string> argv;  // argv[0] is the program; "/proc/self/exe" re-runs this one
  std::vector<std::pair<std::string, std::string>> extraEnv;
  std::chrono::seconds failureGrace{10};
};

// Returns the worst exit status (0 when every rank succeeded; 128+signal for a signal).
int launchLocalRanks(const LocalLaunchOptions& options);

// A loopback TCP port that was free a moment ago (bound to 0, then released).
int pickFreeLoopbackPort();

}  // namespace meridian
