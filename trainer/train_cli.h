// meridian-train's command line: options, launching local ranks, joining the job, the
// progress and summary output. main() of meridian-train is this with external = null; the
// comparison binaries (bench/mpi_train_main.cc) pass their own collectives instead.
#pragma once

#include <functional>
#include <memory>

#include "collectives/communicator.h"
#include "bootstrap/launch_env.h"
#include "trainer/sync.h"

namespace meridian::trainer {

// Called in every rank process once it joined the job (comm null for a world of one or with
// an external SyncComm); whatever it returns is kept alive until the rank is done (e.g. the
// metrics exporter, which the trainer layer may not depend on).
using RankHook = std::function<std::shared_ptr<void>(const bootstrap::LaunchInfo&, collectives::Communicator*)>;

// Parses argv, runs this rank (or, with --ranks N, starts N local ranks) and returns the
// exit code: 0 done, 2 bad input, 1 a failure while training.
int trainCli(int argc, char** argv, SyncComm* external, const RankHook& onJoined = nullptr);

}  // namespace meridian::trainer
