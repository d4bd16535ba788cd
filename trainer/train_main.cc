// meridian-train: data-parallel training of the Fashion-MNIST MLP over Meridian.
//
//   meridian-train --ranks 4                      4 local ranks it starts itself
//   mpirun -n 4 meridian-train                    any launcher (OpenMPI, Slurm, torchrun,
//   MERIDIAN_RANK=.. MERIDIAN_WORLD_SIZE=.. ...   meridian-lab's node environment)
//
// Rank 0 prints a progress line per --log-every steps and a summary at the end.
#include "trainer/train_cli.h"

int main(int argc, char** argv) { return meridian::trainer::trainCli(argc, argv, nullptr); }
