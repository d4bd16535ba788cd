// meridian-train's command line: options, launching local ranks, joining the job, the
// progress and summary output. main() of meridian-train is this with external = null; the
// comparison binaries (bench/mpi_train_main.cc) pass their own collectives instead.
#pragma once

#include "trainer/sync.h"

namespace meridian::trainer {

// Parses argv, runs this rank (or, with --ranks N, starts N local ranks) and returns the
// exit code: 0 done, 2 bad input, 1 a failure while training.
int trainCli(int argc, char** argv, SyncComm* external);

}  // namespace meridian::trainer
