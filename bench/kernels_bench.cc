// Throughput of the CPU kernels (reduceInto f32/bf16 sum and the four casts) from 4 KiB to
// 64 MiB, and of the optimizer steps over parameter buffers of the trainer's sizes. The size
// argument and bytes/s count the bytes of the input buffer (the parameters for the
// optimizers), not the traffic.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/reduce.h"

namespace meridian::kernels {
namespace {

constexpr std::int64_t kMinBytes = 4 << 10;
constexpr std::int64_t kMaxBytes = 64 << 20;

void benchReduceIntoSum(benchmark::State& state, DataType type) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / dataTypeSize(type);
  // Small values that stay finite however many times they are summed into dst.
  std::vector<std::uint8_t> dst(bytes, 0);
  std::vector<std::uint8_t> src(bytes, 0);
  for (auto _ : state) {
    reduceInto(dst.data(), src.data(), count, type, ReduceOp::kSum);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

template <typename Src, typename Dst, void (*kCast)(const Src*, Dst*, std::size_t)>
void benchCast(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(Src);
  std::vector<Src> src(count, Src{1});
  std::vector<Dst> dst(count);
  for (auto _ : state) {
    kCast(src.data(), dst.data(), count);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
}

// One optimizer step over `range(0)` bytes of parameters (AdamW: parameters, gradients and
// both moments; SGD: parameters, gradients and the velocity), on the CPU backend.
void benchAdamW(benchmark::State& state) {
  const std::size_t count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  auto backend = makeCpuBackend(1);
  std::vector<float> w(count, 0.5f), g(count, 1e-3f), m(count, 0.0f), v(count, 0.0f);
  const AdamWParams p;
  std::int64_t step = 0;
  for (auto _ : state) {
    backend->adamwStep(w.data(), g.data(), m.data(), v.data(), count, p, ++step);
    benchmark::DoNotOptimize(w.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void benchSgd(benchmark::State& state) {
  const std::size_t count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  auto backend = makeCpuBackend(1);
  std::vector<float> w(count, 0.5f), g(count, 1e-3f), velocity(count, 0.0f);
  const SgdParams p;
  for (auto _ : state) {
    backend->sgdStep(w.data(), g.data(), velocity.data(), count, p);
    benchmark::DoNotOptimize(w.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// 256 KiB (stays in cache), the default model's first layer (3.1 MiB) and the whole default
// model (7.5 MB: 1,863,690 parameters).
BENCHMARK(benchAdamW)->Arg(256 << 10)->Arg(784 * 1024 * 4)->Arg(1863690 * 4);
BENCHMARK(benchSgd)->Arg(256 << 10)->Arg(784 * 1024 * 4)->Arg(1863690 * 4);

BENCHMARK_CAPTURE(benchReduceIntoSum, f32, DataType::kF32)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);
BENCHMARK_CAPTURE(benchReduceIntoSum, bf16, DataType::kBF16)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);
BENCHMARK(benchCast<float, std::uint16_t, castF32ToBF16>)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);
BENCHMARK(benchCast<std::uint16_t, float, castBF16ToF32>)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);
BENCHMARK(benchCast<float, std::uint16_t, castF32ToF16>)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);
BENCHMARK(benchCast<std::uint16_t, float, castF16ToF32>)
    ->RangeMultiplier(4)
    ->Range(kMinBytes, kMaxBytes);

}  // namespace
}  // namespace meridian::kernels

BENCHMARK_MAIN();
