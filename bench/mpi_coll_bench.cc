// mpi-coll-bench: OpenMPI's side of the side-by-side comparison. Prints the same table
// as meridian-bench (f32 sum, nccl-tests conventions) for MPI's collectives, with
// buffers allocated once and touched before timing, so both sides are measured alike.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/sweep.h"

namespace {

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CLI::App app{"OpenMPI collectives, nccl-tests style"};
  std::string ops = "all_reduce", minText = "8", maxText = "64M", label = "openmpi";
  int factor = 2, iters = 20, warmup = 5;
  app.add_option("--ops", ops, "all_reduce, reduce_scatter, all_gather, broadcast, reduce (comma list)");
  app.add_option("--min-bytes,-b", minText);
  app.add_option("--max-bytes,-e", maxText);
  app.add_option("--factor,-f", factor);
  app.add_option("--iters,-n", iters);
  app.add_option("--warmup,-w", warmup);
  app.add_option("--label", label, "Name printed in the header");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  const auto minParsed = meridian::bench::parseSize(minText), maxParsed = meridian::bench::parseSize(maxText);
  if (!minParsed || !maxParsed) {
    if (rank == 0) std::fprintf(stderr, "mpi-coll-bench: bad size '%s' or '%s'\n", minText.c_str(), maxText.c_str());
    MPI_Finalize();
    return 2;
  }
  std::size_t minBytes = *minParsed, maxBytes = *maxParsed;
  std::vector<float> send(maxBytes / 4 + static_cast<std::size_t>(n), 1.0f), recv(send.size(), 0.0f);
  if (rank == 0) {
    std::printf("# mpi-coll-bench (%s): %d ranks, dtype f32, op sum\n", label.c_str(), n);
    std::printf("# %-14s %12s %12s %5s %6s %6s %11s %12s %12s %7s\n", "op", "size(B)", "count", "type", "redop", "iters",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    std::fflush(stdout);  // every rank is up: a launcher can tell a hung launch from a slow run
  }
  std::size_t start = 0;
  int failures = 0;
  while (start <= ops.size()) {
    std::size_t comma = ops.find(',', start);
    std::string op = ops.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    for (std::size_t bytes = minBytes; bytes <= maxBytes; bytes *= static_cast<std::size_t>(factor)) {
      std::size_t count = bytes / 4;
      if (op == "all_gather" || op == "reduce_scatter") count -= count % static_cast<std::size_t>(n);
      const int c = static_cast<int>(count), block = c / n;
      auto once = [&] {
        if (op == "all_reduce") {
          MPI_Allreduce(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (op == "reduce_scatter") {
          MPI_Reduce_scatter_block(send.data(), recv.data(), block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (op == "all_gather") {
          MPI_Allgather(send.data(), block, MPI_FLOAT, recv.data(), block, MPI_FLOAT, MPI_COMM_WORLD);
        } else if (op == "broadcast") {
          MPI_Bcast(send.data(), c, MPI_FLOAT, 0, MPI_COMM_WORLD);
        } else if (op == "reduce") {
          MPI_Reduce(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        }
      };
      if (op != "all_reduce" && op != "reduce_scatter" && op != "all_gather" && op != "broadcast" && op != "reduce") {
        if (rank == 0) std::fprintf(stderr, "mpi-coll-bench: unknown op %s\n", op.c_str());
        MPI_Finalize();
        return 2;
      }
      // Correctness: every rank sends 1.0, so sums equal n.
      std::fill(send.begin(), send.end(), 1.0f);
      once();
      std::size_t wrong = 0;
      if (op == "all_reduce" || (op == "reduce" && rank == 0)) {
        for (int i = 0; i < c; ++i) wrong += recv[static_cast<std::size_t>(i)] != static_cast<float>(n);
      } else if (op == "reduce_scatter") {
        for (int i = 0; i < block; ++i) wrong += recv[static_cast<std::size_t>(i)] != static_cast<float>(n);
      }
      for (int i = 0; i < warmup; ++i) once();
      int it = meridian::bench::itersFor(count * 4, iters);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < it; ++i) once();
      double us = (MPI_Wtime() - t0) * 1e6 / it, maxUs = 0;
      unsigned long w = wrong, sumWrong = 0;
      MPI_Reduce(&us, &maxUs, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&w, &sumWrong, 1, MPI_UNSIGNED_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        double nn = n;
        double factorBus = op == "all_reduce" ? 2 * (nn - 1) / nn
                           : (op == "reduce_scatter" || op == "all_gather") ? (nn - 1) / nn : 1.0;
        double algbw = static_cast<double>(count * 4) / (maxUs * 1e3);
        std::printf("  %-14s %12zu %12zu %5s %6s %6d %11.1f %12.3f %12.3f %7lu\n", op.c_str(), count * 4, count, "f32",
                    "sum", it, maxUs, algbw, algbw * factorBus, sumWrong);
        std::fflush(stdout);
        failures += sumWrong != 0;
      }
      if (bytes == 0) break;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 3;
}
