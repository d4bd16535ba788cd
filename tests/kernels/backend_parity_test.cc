// Holds the CUDA backend to the CPU reference: every op runs on both with the same inputs
// (sizes 0, 1, around the 256-thread block and large) and the results are compared: GEMM to
// 1e-5 of its magnitude, element-wise ops to 1e-6, casts to the bit, the loss sum to 1e-5
// and the correct count exactly. Label gpu; without a device every case skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/backend_test_util.h"

namespace meridian::kernels {
namespace {

using testing::BackendBuffer;
using testing::GemmCase;
using testing::gemmCases;
using testing::expectNear;
using testing::randomFloats;
using testing::randomLabels;

constexpr std::array<std::size_t, 7> kSizes{0, 1, 255, 256, 257, 4099, (1u << 20) + 3};
constexpr double kRel = 1e-6;
constexpr double kAbs = 1e-6;

class BackendParityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cudaAvailable()) {
      std::string why = makeCudaBackend().status().message();
      const std::string prefix = "no CUDA device: ";
      if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      GTEST_SKIP() << prefix << why;
    }
    auto gpu = makeCudaBackend();
    ASSERT_TRUE(gpu.isOk()) << gpu.status().toString();
    gpu_ = std::move(gpu).value();
    cpu_ = makeCpuBackend(1);
  }

  // f(backend) on the CPU, then on the GPU: {cpu result, gpu result}.
  template <typename F>
  auto onBoth(F f) {
    auto cpu = f(*cpu_);
    auto gpu = f(*gpu_);
    return std::pair{std::move(cpu), std::move(gpu)};
  }

  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
};

template <typename T>
void expectBitEqual(const std::vector<T>& cpu, const std::vector<T>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(std::memcmp(&cpu[i], &gpu[i], sizeof(T)), 0)
        << "element " << i << ": cpu " << cpu[i] << ", gpu " << gpu[i];
  }
}

double maxAbs(const std::vector<float>& v) {
  float m = 0;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return static_cast<double>(m);
}

TEST_F(BackendParityTest, GemmMatchesForEveryTransposeWithPaddedStrides) {
  const float alpha = 0.75f, beta = -1.5f;
  const auto cases = gemmCases({{1, 1, 1}, {7, 5, 3}, {65, 33, 129}, {257, 130, 70}, {128, 256, 512}, {3, 5, 0}}, 100);
  for (const GemmCase& g : cases) {
    SCOPED_TRACE(g.describe());
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> a(b, g.a), bb(b, g.b), c(b, g.c);
      b.gemm(g.transA, g.transB, g.m, g.n, g.k, alpha, a.get(), g.lda, bb.get(), g.ldb, beta, c.get(), g.ldc);
      return c.download();
    });
    // The magnitude any element of C can reach; rounding is relative to it.
    const double scale = 0.75 * g.k * maxAbs(g.a) * maxAbs(g.b) + 1.5 * maxAbs(g.c);
    expectNear(gpu, cpu, 0, 1e-5 * scale);
  }
}

TEST_F(BackendParityTest, BiasOpsMatch) {
  const std::array<std::pair<int, int>, 6> shapes{{{0, 5}, {5, 0}, {1, 1}, {257, 3}, {3, 257}, {1000, 130}}};
  for (const auto& [rows, cols] : shapes) {
    SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
    const auto hostY = randomFloats(static_cast<std::size_t>(rows * cols), 200);
    const auto hostBias = randomFloats(static_cast<std::size_t>(cols), 201);
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> y(b, hostY), bias(b, hostBias), dbias(b, hostBias);
      b.addBias(y.get(), bias.get(), rows, cols);
      b.biasGrad(y.get(), dbias.get(), rows, cols);
      return std::pair{y.download(), dbias.download()};
    });
    expectNear(gpu.first, cpu.first, kRel, kAbs);
    expectNear(gpu.second, cpu.second, kRel, kAbs);
  }
}

TEST_F(BackendParityTest, ActivationsMatch) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto hostX = randomFloats(n, 300 + n, -8.0f, 8.0f);
    const auto hostDy = randomFloats(n, 301 + n);
    for (const Activation act : {Activation::kRelu, Activation::kGelu}) {
      const auto [cpu, gpu] = onBoth([&](Backend& b) {
        BackendBuffer<float> x(b, hostX), dy(b, hostDy), y(b, n), dx(b, n);
        b.activationForward(act, x.get(), y.get(), n);
        b.activationBackward(act, x.get(), dy.get(), dx.get(), n);
        return std::pair{y.download(), dx.download()};
      });
      expectNear(gpu.first, cpu.first, kRel, kAbs);
      expectNear(gpu.second, cpu.second, kRel, kAbs);
    }
  }
}

TEST_F(BackendParityTest, SoftmaxCrossEntropyMatches) {
  const std::array<std::pair<int, int>, 7> shapes{{{0, 10}, {1, 1}, {7, 10}, {256, 3}, {33, 257}, {300, 1000},
                                                   {4096, 10}}};
  for (const auto& [rows, classes] : shapes) {
    SCOPED_TRACE(::testing::Message() << rows << " rows x " << classes << " classes");
    auto hostLogits = randomFloats(static_cast<std::size_t>(rows * classes), 400, -10.0f, 10.0f);
    if (rows > 1) std::fill_n(hostLogits.begin() + classes, classes, 1000.0f);  // huge, and all tied
    const auto hostLabels = randomLabels(static_cast<std::size_t>(rows), classes, 401);
    const float gradScale = rows > 0 ? 1.0f / static_cast<float>(rows) : 1.0f;
    for (const bool inPlace : {false, true}) {
      const auto [cpu, gpu] = onBoth([&](Backend& b) {
        BackendBuffer<float> logits(b, hostLogits), dlogits(b, hostLogits.size());
        BackendBuffer<std::int32_t> labels(b, hostLabels);
        float* out = inPlace ? logits.get() : dlogits.get();
        const LossStats noGrad = b.softmaxCrossEntropy(logits.get(), labels.get(), rows, classes, nullptr, 1.0f);
        const LossStats stats = b.softmaxCrossEntropy(logits.get(), labels.get(), rows, classes, out, gradScale);
        EXPECT_EQ(noGrad.lossSum, stats.lossSum);
        EXPECT_EQ(noGrad.correct, stats.correct);
        return std::pair{stats, inPlace ? logits.download() : dlogits.download()};
      });
      EXPECT_NEAR(gpu.first.lossSum, cpu.first.lossSum, 1e-5 * std::fabs(cpu.first.lossSum));
      EXPECT_EQ(gpu.first.correct, cpu.first.correct);
      expectNear(gpu.second, cpu.second, kRel, kAbs);
    }
  }
}

TEST_F(BackendParityTest, SoftmaxCrossEntropyRejectsABadLabelLikeTheCpu) {
  const auto hostLogits = randomFloats(4 * 5, 450);
  for (const std::int32_t bad : {5, -1, 1 << 30}) {
    const std::vector<std::int32_t> hostLabels{0, 4, bad, 1};
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> logits(b, hostLogits), dlogits(b, hostLogits.size());
      BackendBuffer<std::int32_t> labels(b, hostLabels);
      try {
        b.softmaxCrossEntropy(logits.get(), labels.get(), 4, 5, dlogits.get(), 1.0f);
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    });
    EXPECT_EQ(gpu, cpu);
    EXPECT_NE(cpu.find("label " + std::to_string(bad) + " of row 2"), std::string::npos) << cpu;
  }
}

// Convolution's gathers copy or add in the same order on both backends: bit-equal results.
TEST_F(BackendParityTest, ImageOpsMatchToTheBit) {
  const std::array<std::pair<ImageShape, int>, 5> cases{{{{1, 1, 1}, 1}, {{3, 6, 2}, 5}, {{2, 28, 1}, 5},
                                                         {{64, 14, 16}, 5}, {{5, 4, 33}, 7}}};
  for (const auto& [s, k] : cases) {
    SCOPED_TRACE(::testing::Message() << "batch " << s.batch << " side " << s.side << " channels " << s.channels
                                      << " kernel " << k);
    const std::size_t n = static_cast<std::size_t>(s.batch) * s.side * s.side * s.channels;
    const std::size_t cols = n * static_cast<std::size_t>(k * k);
    auto hostX = randomFloats(n, 700);
    if (n >= 4) std::fill_n(hostX.begin(), 4, 0.5f);  // ties
    const auto hostG = randomFloats(cols, 701);
    const ImageShape pooled = s.side % 2 == 0 ? s : ImageShape{0, 2, 1};
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> x(b, hostX), g(b, hostG), col(b, cols), dx(b, n), y(b, n / 4), dxPool(b, n);
      BackendBuffer<std::uint8_t> argmax(b, n / 4);
      b.im2col(x.get(), s, k, col.get());
      b.col2im(g.get(), s, k, dx.get());
      b.maxPool2Forward(x.get(), pooled, y.get(), argmax.get());
      b.maxPool2Backward(x.get(), argmax.get(), pooled, dxPool.get());
      return std::tuple{col.download(), dx.download(), y.download(), argmax.download(), dxPool.download()};
    });
    expectBitEqual(std::get<0>(gpu), std::get<0>(cpu));
    expectBitEqual(std::get<1>(gpu), std::get<1>(cpu));
    expectBitEqual(std::get<2>(gpu), std::get<2>(cpu));
    expectBitEqual(std::get<3>(gpu), std::get<3>(cpu));
    expectBitEqual(std::get<4>(gpu), std::get<4>(cpu));
  }
}

TEST_F(BackendParityTest, OptimizersMatchOverThreeSteps) {
  const std::array<SgdParams, 3> sgds{{{.lr = 0.05f, .momentum = 0.0f, .weightDecay = 0.0f, .nesterov = false},
                                       {.lr = 0.05f, .momentum = 0.9f, .weightDecay = 1e-3f, .nesterov = false},
                                       {.lr = 0.05f, .momentum = 0.9f, .weightDecay = 1e-3f, .nesterov = true}}};
  const AdamWParams adamw{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weightDecay = 0.01f};
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto hostW = randomFloats(n, 500 + n);
    const std::array<std::vector<float>, 3> grads{randomFloats(n, 501 + n), randomFloats(n, 502 + n),
                                                  randomFloats(n, 503 + n)};
    for (const SgdParams& p : sgds) {
      const auto [cpu, gpu] = onBoth([&](Backend& b) {
        BackendBuffer<float> w(b, hostW), velocity(b, n);
        for (const auto& hostG : grads) {
          BackendBuffer<float> g(b, hostG);
          b.sgdStep(w.get(), g.get(), velocity.get(), n, p);
        }
        return std::pair{w.download(), velocity.download()};
      });
      expectNear(gpu.first, cpu.first, kRel, kAbs);
      expectNear(gpu.second, cpu.second, kRel, kAbs);
    }
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> w(b, hostW), m(b, n), v(b, n);
      std::int64_t step = 0;
      for (const auto& hostG : grads) {
        BackendBuffer<float> g(b, hostG);
        b.adamwStep(w.get(), g.get(), m.get(), v.get(), n, adamw, ++step);
      }
      return std::array{w.download(), m.download(), v.download()};
    });
    for (std::size_t i = 0; i < cpu.size(); ++i) expectNear(gpu[i], cpu[i], kRel, kAbs);
  }
}

TEST_F(BackendParityTest, VectorOpsMatch) {
  for (const std::size_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto hostA = randomFloats(n, 600 + n), hostB = randomFloats(n, 601 + n);
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<float> a(b, hostA), bb(b, hostB), out(b, n), acc(b, hostA);
      b.subtract(a.get(), bb.get(), out.get(), n);
      b.subtract(out.get(), bb.get(), out.get(), n);  // out == a
      b.axpy(-0.75f, bb.get(), out.get(), n);
      b.scale(out.get(), n, 1.0f / 3.0f);
      b.accumulate(acc.get(), out.get(), n);
      b.copy(a.get(), acc.get(), n);
      return std::pair{out.download(), a.download()};
    });
    expectNear(gpu.first, cpu.first, kRel, kAbs);
    expectNear(gpu.second, cpu.second, kRel, kAbs);
  }
}

TEST_F(BackendParityTest, CastsMatchToTheBit) {
  // Every 16-bit pattern widened, and floats around every rounding edge narrowed.
  std::vector<std::uint16_t> patterns(1 << 16);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<std::uint16_t>(i);
  auto floats = randomFloats((1u << 20) + 7, 700, -70000.0f, 70000.0f);
  const std::array<float, 10> special{0.0f, -0.0f, 1e-8f, -6e-6f, 5.9604645e-8f, 65504.0f, 65520.0f, INFINITY,
                                      -INFINITY, NAN};
  std::copy(special.begin(), special.end(), floats.begin());
  // Then mostly subnormal halves.
  for (std::size_t i = special.size(); i < 4096; ++i) floats[i] = std::ldexp(floats[i], -30);
  for (const bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    const auto [cpu, gpu] = onBoth([&](Backend& b) {
      BackendBuffer<std::uint16_t> halves(b, patterns), narrowed(b, floats.size());
      BackendBuffer<float> src(b, floats), widened(b, patterns.size());
      if (bf16) {
        b.castFromBF16(halves.get(), widened.get(), patterns.size());
        b.castToBF16(src.get(), narrowed.get(), floats.size());
      } else {
        b.castFromF16(halves.get(), widened.get(), patterns.size());
        b.castToF16(src.get(), narrowed.get(), floats.size());
      }
      b.castToBF16(src.get(), narrowed.get(), 0);
      return std::pair{widened.download(), narrowed.download()};
    });
    expectBitEqual(cpu.first, gpu.first);
    expectBitEqual(cpu.second, gpu.second);
  }
}

TEST_F(BackendParityTest, StagingFollowsComputeOrderAndTicketsCoverEarlierCopies) {
  EXPECT_EQ(gpu_->device(), Device::kCuda);
  EXPECT_EQ(gpu_->describe().rfind("cuda:", 0), 0u) << gpu_->describe();
  const std::size_t n = (1u << 20) + 3;
  const std::vector<float> ones(n, 1.0f);
  BackendBuffer<float> x(*gpu_, n);
  auto* staged = static_cast<float*>(gpu_->allocHost(n * sizeof(float)));
  auto* first = static_cast<float*>(gpu_->allocHost(n * sizeof(float)));
  auto* second = static_cast<float*>(gpu_->allocHost(n * sizeof(float)));
  std::copy(ones.begin(), ones.end(), staged);
  gpu_->stageToDevice(x.get(), staged, n * sizeof(float));
  std::fill_n(staged, n, 0.0f);  // free once stageToDevice returned
  gpu_->scale(x.get(), n, 2.0f);
  const std::uint64_t t1 = gpu_->stageToHost(first, x.get(), n * sizeof(float));
  BackendBuffer<float> y(*gpu_, n);
  gpu_->copy(y.get(), x.get(), n);
  gpu_->scale(y.get(), n, 3.0f);
  const std::uint64_t t2 = gpu_->stageToHost(second, y.get(), n * sizeof(float));
  const std::uint64_t t3 = gpu_->stageToHost(second, y.get(), 0);
  EXPECT_LT(t1, t2);
  EXPECT_LT(t2, t3);
  gpu_->waitStaged(t3);  // covers t1 and t2
  gpu_->waitStaged(t1);  // already landed
  for (std::size_t i = 0; i < n; i += 997) {
    ASSERT_EQ(first[i], 2.0f) << i;
    ASSERT_EQ(second[i], 6.0f) << i;
  }
  EXPECT_THROW(gpu_->waitStaged(t3 + 1), std::invalid_argument);
  gpu_->synchronize();
  gpu_->freeHost(staged);
  gpu_->freeHost(first);
  gpu_->freeHost(second);

  // Fresh memory is zeroed; zero-length calls launch nothing.
  void* p = gpu_->alloc(4099);
  std::vector<unsigned char> bytes(4099, 0xff);
  gpu_->copyToHost(bytes.data(), p, bytes.size());
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](unsigned char c) { return c == 0; }));
  gpu_->free(p);
  gpu_->scale(nullptr, 0, 2.0f);
  gpu_->addBias(nullptr, nullptr, 0, 7);
  gpu_->gemm(false, false, 0, 4, 4, 1.0f, nullptr, 4, nullptr, 4, 0.0f, nullptr, 4);
  gpu_->synchronize();
}

}  // namespace
}  // namespace meridian::kernels
