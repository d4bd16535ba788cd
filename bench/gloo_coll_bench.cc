// gloo-coll-bench: Gloo's side of the side-by-side comparison. Prints the same table as
// meridian-bench and mpi-coll-bench (f32 sum, nccl-tests conventions, same columns) for
// Gloo's ring allreduce over its TCP transport, so one awk parses all three.
//
// One process per rank, started by whatever launcher (meridian-lab exec-all in the lab):
// the rank and world size come from --rank/--size or the lab's MERIDIAN_LAB_RANK and
// MERIDIAN_LAB_NODES, the ranks meet through a gloo::rendezvous::FileStore in a directory
// all of them can see (--store-dir, fresh per run), and the transport binds to one
// address (--addr, default the lab's wan-a address): Gloo's TCP transport uses a single
// interface, which is what a Gloo user gets on a multi-homed host.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/sweep.h"

namespace {

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

std::string envString(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

void allreduceInto(const std::shared_ptr<gloo::Context>& ctx, float* in, float* out, std::size_t count,
                   std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(ctx);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setInput(in, count);
  opts.setOutput(out, count);
  opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

// One double per rank reduced in place with fn (max of the times, sum of wrong counts).
double reduceScalar(const std::shared_ptr<gloo::Context>& ctx, double v,
                    void (*fn)(void*, const void*, const void*, std::size_t)) {
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(fn);
  gloo::allreduce(opts);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gloo allreduce (ring, TCP transport), nccl-tests style"};
  std::string minText = "8", maxText = "64M", label = "gloo", storeDir, addr = envString("MERIDIAN_LAB_ADDR_WAN_A");
  int factor = 2, iters = 20, warmup = 5, timeoutSec = 600;
  int rank = envInt("MERIDIAN_LAB_RANK", -1), size = envInt("MERIDIAN_LAB_NODES", 0);
  app.add_option("--min-bytes,-b", minText);
  app.add_option("--max-bytes,-e", maxText);
  app.add_option("--factor,-f", factor);
  app.add_option("--iters,-n", iters,
                 "Timed iterations per size (about 128 MiB of data per size at most, at least min(n, 5))");
  app.add_option("--warmup,-w", warmup);
  app.add_option("--label", label, "Name printed in the header");
  app.add_option("--rank", rank, "This process's rank (default: $MERIDIAN_LAB_RANK)");
  app.add_option("--size", size, "Number of ranks (default: $MERIDIAN_LAB_NODES)");
  app.add_option("--store-dir", storeDir, "Directory shared by all ranks for the rendezvous (empty, one per run)")
      ->required();
  app.add_option("--addr", addr, "Address the TCP transport binds to (default: $MERIDIAN_LAB_ADDR_WAN_A)");
  app.add_option("--timeout", timeoutSec, "Seconds any one collective may take");
  CLI11_PARSE(app, argc, argv);
  if (size < 1 || rank < 0 || rank >= size) {
    std::fprintf(stderr, "gloo-coll-bench: need 0 <= rank < size (got rank %d, size %d; set --rank/--size)\n", rank,
                 size);
    return 2;
  }
  if (addr.empty()) {
    std::fprintf(stderr, "gloo-coll-bench: no address to bind (--addr, or run it in the lab)\n");
    return 2;
  }
  const auto minParsed = meridian::bench::parseSize(minText), maxParsed = meridian::bench::parseSize(maxText);
  if (!minParsed || !maxParsed) {
    std::fprintf(stderr, "gloo-coll-bench: bad size '%s' or '%s' (a number with an optional k/M/G)\n",
                 minText.c_str(), maxText.c_str());
    return 2;
  }
  const std::size_t minBytes = *minParsed, maxBytes = *maxParsed;
  if (minBytes < 4 || minBytes > maxBytes || factor < 2 || iters < 1) {
    std::fprintf(stderr, "gloo-coll-bench: need 4 <= min-bytes <= max-bytes, factor >= 2, iters >= 1\n");
    return 2;
  }
  const auto timeout = std::chrono::milliseconds(1000LL * timeoutSec);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = addr;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(store, device);
    const std::shared_ptr<gloo::Context> context = ctx;

    std::vector<float> send(maxBytes / 4), recv(send.size(), 0.0f);
    if (rank == 0) {
      std::printf("# gloo-coll-bench (%s): %d ranks, dtype f32, op sum, ring allreduce, tcp on %s\n", label.c_str(),
                  size, addr.c_str());
      std::printf("# %-14s %12s %12s %5s %6s %6s %11s %12s %12s %7s\n", "op", "size(B)", "count", "type", "redop",
                  "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    int failures = 0;
    for (std::size_t bytes = minBytes; bytes <= maxBytes; bytes *= static_cast<std::size_t>(factor)) {
      const std::size_t count = bytes / 4;
      // Correctness: element i of rank r is r + 1 + i % 3, so the sum is n(n+1)/2 + n (i % 3),
      // exact in f32 and different per element, so a misplaced segment shows.
      for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 3));
      allreduceInto(context, send.data(), recv.data(), count, timeout);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += recv[i] != static_cast<float>(size * (size + 1) / 2 + size * static_cast<int>(i % 3));
      }
      for (int i = 0; i < warmup; ++i) allreduceInto(context, send.data(), recv.data(), count, timeout);
      const int it = meridian::bench::itersFor(bytes, iters);
      gloo::BarrierOptions barrier(context);
      gloo::barrier(barrier);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < it; ++i) allreduceInto(context, send.data(), recv.data(), count, timeout);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / it;
      // The slowest rank's time and everyone's wrong elements, as the other two tools report.
      const double maxUs = reduceScalar(context, us, &gloo::max<double>);
      const auto sumWrong =
          static_cast<unsigned long>(reduceScalar(context, static_cast<double>(wrong), &gloo::sum<double>));
      if (rank == 0) {
        const double n = size;
        const double algbw = static_cast<double>(count * 4) / (maxUs * 1e3);
        std::printf("  %-14s %12zu %12zu %5s %6s %6d %11.1f %12.3f %12.3f %7lu\n", "all_reduce", count * 4, count,
                    "f32", "sum", it, maxUs, algbw, algbw * 2 * (n - 1) / n, sumWrong);
        std::fflush(stdout);
      }
      failures += sumWrong != 0;
    }
    return failures == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo-coll-bench: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
