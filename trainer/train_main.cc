// meridian-train: data-parallel training of the Fashion-MNIST MLP over Meridian.
//
//   meridian-train --ranks 4                      4 local ranks it starts itself
//   mpirun -n 4 meridian-train                    any launcher (OpenMPI, Slurm, torchrun,
//   MERIDIAN_RANK=.. MERIDIAN_WORLD_SIZE=.. ...   meridian-lab's node environment)
//
// Rank 0 prints a progress line per --log-every steps and a summary at the end. Every rank
// serves its metrics to Prometheus (MERIDIAN_METRICS_ADDR).
#include "monitoring/exporter.h"
#include "trainer/train_cli.h"

int main(int argc, char** argv) {
  using namespace meridian;
  return trainer::trainCli(argc, argv, nullptr,
                           [](const bootstrap::LaunchInfo& info, collectives::Communicator* comm) {
                             std::shared_ptr<void> exporter = monitoring::startExporterFromEnv(info.localRank);
                             if (comm != nullptr) comm->labelMetrics();
                             return exporter;
                           });
}
