// nccl-allreduce-check: real NCCL (ncclAllReduce) between two ranks on one GPU, each posing as
// its own host (NCCL_HOSTID differs), so NCCL's shared-memory and P2P transports refuse them
// and every byte goes through the network plugin (NCCL_NET_PLUGIN=meridian, NCCL_NET=Meridian).
// Rank 0 writes the NCCL unique id to --id-file, rank 1 reads it. Per size: one checked
// allreduce (float sum of known values), then --iters timed ones; rank 0 prints busbw.
//
//   NCCL_HOSTID=a nccl-allreduce-check --rank 0 --id-file /tmp/id &
//   NCCL_HOSTID=b nccl-allreduce-check --rank 1 --id-file /tmp/id
// (scripts/gpu-check.sh runs it with the plugin and NCCL_DEBUG=INFO.)
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/file_util.h"

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "nccl-allreduce-check: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}
bool ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  std::fprintf(stderr, "nccl-allreduce-check: %s: %s\n", what, ncclGetErrorString(r));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ncclAllReduce between two ranks on one GPU, through the net plugin"};
  int rank = 0, iters = 20;
  std::string idFile;
  std::size_t maxBytes = std::size_t{256} << 20;
  app.add_option("--rank", rank, "0 or 1")->required()->check(CLI::Range(0, 1));
  app.add_option("--id-file", idFile, "Where rank 0 leaves the NCCL unique id")->required();
  app.add_option("--iters", iters, "Timed allreduces per size")->check(CLI::Range(1, 10000));
  app.add_option("--max-bytes", maxBytes, "Largest size (from 4 KiB, x4 each step)");
  CLI11_PARSE(app, argc, argv);

  ncclUniqueId id;
  if (rank == 0) {
    if (!ok(ncclGetUniqueId(&id), "ncclGetUniqueId")) return 1;
    const meridian::Status written =
        meridian::writeFileAtomically(idFile, std::string_view(id.internal, sizeof(id.internal)));
    if (!written.isOk()) {
      std::fprintf(stderr, "nccl-allreduce-check: %s\n", written.message().c_str());
      return 1;
    }
  } else {
    for (int i = 0; i < 600 && !std::filesystem::exists(idFile); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream f(idFile, std::ios::binary);
    if (!f.read(id.internal, sizeof(id.internal))) {
      std::fprintf(stderr, "nccl-allreduce-check: no unique id in %s\n", idFile.c_str());
      return 1;
    }
  }
  if (!ok(cudaSetDevice(0), "cudaSetDevice")) return 1;
  ncclComm_t comm;
  if (!ok(ncclCommInitRank(&comm, 2, id, rank), "ncclCommInitRank")) return 1;
  cudaStream_t stream;
  if (!ok(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  if (rank == 0) std::printf("# %12s %12s %12s %8s\n", "bytes", "time(us)", "busbw(GB/s)", "check");
  int failures = 0;
  for (std::size_t bytes = 4096; bytes <= maxBytes; bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    float* buf = nullptr;
    if (!ok(cudaMalloc(&buf, bytes), "cudaMalloc")) return 1;
    // Rank r holds r + 1 + (i % 7): the sum is 3 + 2 * (i % 7).
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
    if (!ok(cudaMemcpy(buf, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy")) return 1;
    if (!ok(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, stream), "ncclAllReduce")) return 1;
    if (!ok(cudaStreamSynchronize(stream), "sync")) return 1;
    if (!ok(cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += host[i] != static_cast<float>(3 + 2 * static_cast<int>(i % 7));
    failures += wrong != 0;
    const auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) {
      if (!ok(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, stream), "ncclAllReduce")) return 1;
    }
    if (!ok(cudaStreamSynchronize(stream), "sync")) return 1;
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters;
    // busbw of an allreduce over n ranks: algbw x 2(n-1)/n = algbw for two ranks.
    if (rank == 0) {
      std::printf("  %12zu %12.1f %12.4f %8s\n", bytes, us, static_cast<double>(bytes) / us / 1e3,
                  wrong == 0 ? "ok" : "WRONG");
    }
    cudaFree(buf);
  }
  ncclCommDestroy(comm);
  if (rank == 0) std::filesystem::remove(idFile);
  return failures == 0 ? 0 : 1;
}
