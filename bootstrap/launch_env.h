// Who am I and where is the store: reads rank, world size and the store address from
// Meridian's knobs or the launcher's variables, then meets the other ranks at the store.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store.h"
#include "core/clock.h"
#include "core/status.h"

namespace meridian::bootstrap {

// Used when the launcher names no store and every rank runs on this host.
inline constexpr const char* kDefaultLocalStore = "127.0.0.1:29400";

struct LaunchInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = -1;       // rank among the processes on this host; -1 when the launcher does not say
  int localWorldSize = -1;  // processes on this host; -1 when the launcher does not say
  std::string storeAddress;  // "host:port" of the store rank 0 hosts; port 0 only for a world of 1
  std::string launcher;      // "meridian", "openmpi", "torchrun", "slurm" or "none"
};

// Reads, first match wins:
//   MERIDIAN_RANK / MERIDIAN_WORLD_SIZE (both required when either is set);
//   OpenMPI  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE;
//   torchrun RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE;
//   Slurm    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (+ tasks per node for the local size);
//   nothing: a single process (rank 0 of 1).
// torchrun is checked before Slurm because `srun torchrun ...` sets both, and then
// SLURM_PROCID counts torchrun agents, not ranks. The store is MERIDIAN_STORE, else
// MASTER_ADDR:MASTER_PORT, else kDefaultLocalStore when every rank is on this host
// (127.0.0.1:0 for a world of 1), else kInvalidArgument asking for MERIDIAN_STORE.
// Malformed or out-of-range numbers are kInvalidArgument naming the variable.
Result<LaunchInfo> detectLaunch();

// Rank 0 starts a StoreServer on the store address (bound to that IPv4 address, or to
// 0.0.0.0 when the host is a name) and hands it to *serverOut, which must outlive the
// job's use of the store; every rank, rank 0 included, connects a TcpStore to it. Rank 0
// with port 0 lets the kernel pick (a world of 1, or tests that pass the port on).
Result<std::unique_ptr<Store>> rendezvous(const LaunchInfo& info, const std::string& secret, TimePoint deadline,
                                          std::unique_ptr<StoreServer>* serverOut);

// The local IPv4 address the kernel would use to reach host:port (no packet is sent);
// 127.0.0.1 when it cannot tell.
std::string localAddressToward(const std::string& hostPort);

// This rank's paths: MERIDIAN_PATHS, else the one address that reaches the store.
std::vector<std::string> localPathAddresses(const LaunchInfo& info);

// The addresses alone: "ip:port" (a path naming its data port) becomes "ip".
std::vector<std::string> withoutPorts(std::vector<std::string> addresses);

}  // namespace meridian::bootstrap
