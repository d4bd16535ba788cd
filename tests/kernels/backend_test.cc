// Checks the CPU backend, the reference for every other backend: each op against a plain
// double-precision reference on odd sizes, softmax cross-entropy and the optimizers against
// hand-worked values, the derivatives against finite differences, and the staging calls.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/reduce.h"
#include "tests/kernels/backend_test_util.h"

namespace meridian::kernels {
namespace {

using testing::BackendBuffer;
using testing::GemmCase;
using testing::gemmCases;
using testing::expectNear;
using testing::randomFloats;
using testing::randomLabels;

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = makeCpuBackend(1);
};

// ---- GEMM ------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C in double, reading op(A)[i][p] and op(B)[p][j] through the
// strides; `scale` gets each element's magnitude (0 for padding, which must stay as it was).
std::vector<double> gemmReference(const GemmCase& g, double alpha, double beta, std::vector<double>* scale) {
  std::vector<double> out(g.c.begin(), g.c.end());
  scale->assign(g.c.size(), 0.0);
  for (int i = 0; i < g.m; ++i) {
    for (int j = 0; j < g.n; ++j) {
      double sum = 0;
      double magnitude = 0;
      for (int p = 0; p < g.k; ++p) {
        const double x = g.a[static_cast<std::size_t>(g.transA ? p * g.lda + i : i * g.lda + p)];
        const double y = g.b[static_cast<std::size_t>(g.transB ? j * g.ldb + p : p * g.ldb + j)];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      const auto at = static_cast<std::size_t>(i * g.ldc + j);
      const double cIn = g.c[at];
      out[at] = alpha * sum + beta * cIn;
      (*scale)[at] = std::fabs(alpha) * magnitude + std::fabs(beta * cIn);
    }
  }
  return out;
}

TEST_F(CpuBackendTest, GemmMatchesDoubleReferenceForEveryTransposeWithPaddedStrides) {
  for (const GemmCase& g : gemmCases({{7, 5, 3}, {1, 1, 1}, {13, 17, 11}, {33, 9, 65}, {4, 6, 0}}, 1)) {
    SCOPED_TRACE(g.describe());
    BackendBuffer<float> a(*backend_, g.a), b(*backend_, g.b), c(*backend_, g.c);
    backend_->gemm(g.transA, g.transB, g.m, g.n, g.k, 1.25f, a.get(), g.lda, b.get(), g.ldb, -0.5f, c.get(), g.ldc);
    std::vector<double> scale;
    const auto want = gemmReference(g, 1.25, -0.5, &scale);
    const auto got = c.download();
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 * scale[i]) << "element " << i;
    }
  }
}

TEST_F(CpuBackendTest, GemmWithEmptyOutputIsANoOpAndBadStridesAreRejected) {
  backend_->gemm(false, false, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, nullptr, 5);
  backend_->gemm(false, false, 5, 0, 3, 1.0f, nullptr, 3, nullptr, 1, 0.0f, nullptr, 1);
  BackendBuffer<float> a(*backend_, 16), b(*backend_, 16), c(*backend_, 16);
  EXPECT_THROW(backend_->gemm(false, false, 2, 2, 3, 1.0f, a.get(), 2, b.get(), 2, 0.0f, c.get(), 2),
               std::invalid_argument);  // lda 2 < k 3
  EXPECT_THROW(backend_->gemm(false, true, 2, 2, 3, 1.0f, a.get(), 3, b.get(), 2, 0.0f, c.get(), 2),
               std::invalid_argument);  // ldb 2 < k 3 (B stored n x k)
  EXPECT_THROW(backend_->gemm(false, false, 2, 4, 2, 1.0f, a.get(), 2, b.get(), 4, 0.0f, c.get(), 3),
               std::invalid_argument);  // ldc 3 < n 4
  EXPECT_THROW(backend_->gemm(false, false, -1, 2, 2, 1.0f, a.get(), 2, b.get(), 2, 0.0f, c.get(), 2),
               std::invalid_argument);
}

// ---- Bias ------------------------------------------------------------------------------

TEST_F(CpuBackendTest, AddBiasAndBiasGradMatchReference) {
  const int rows = 9, cols = 13;
  const auto hostY = randomFloats(rows * cols, 11);
  const auto hostBias = randomFloats(cols, 12);
  BackendBuffer<float> y(*backend_, hostY), bias(*backend_, hostBias), dbias(*backend_, cols);
  backend_->addBias(y.get(), bias.get(), rows, cols);
  std::vector<double> wantY(hostY.size());
  std::vector<double> wantSums(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const double y0 = hostY[r * cols + c], b0 = hostBias[c];
      wantY[r * cols + c] = y0 + b0;
      wantSums[c] += y0;
    }
  }
  expectNear(y.download(), wantY, 1e-6, 1e-6);

  BackendBuffer<float> dy(*backend_, hostY);
  backend_->biasGrad(dy.get(), dbias.get(), rows, cols);
  expectNear(dbias.download(), wantSums, 1e-5, 1e-5);
  // Overwrites rather than accumulates; no rows gives zeros.
  backend_->biasGrad(dy.get(), dbias.get(), 0, cols);
  expectNear(dbias.download(), std::vector<double>(cols, 0.0), 0, 0);
}

// ---- Activations ------------------------------------------------------------------------

double geluDouble(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST_F(CpuBackendTest, ActivationsMatchReferenceAndDerivativesMatchFiniteDifferences) {
  const std::size_t n = 1001;
  auto hostX = randomFloats(n, 21, -6.0f, 6.0f);
  hostX[0] = 0.0f;
  hostX[1] = -20.0f;
  hostX[2] = 20.0f;
  const auto hostDy = randomFloats(n, 22);
  BackendBuffer<float> x(*backend_, hostX), dy(*backend_, hostDy), y(*backend_, n), dx(*backend_, n);

  std::vector<double> relu(n), gelu(n), reluGrad(n), geluGrad(n);
  const double h = 1e-4;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = hostX[i], g = hostDy[i];
    relu[i] = v > 0 ? v : 0;
    gelu[i] = geluDouble(v);
    // Central differences; ReLU's kink at 0 takes the derivative 0 (x > 0 is the rule).
    reluGrad[i] = g * (v > 0 ? (std::max(v + h, 0.0) - std::max(v - h, 0.0)) / (2 * h) : 0.0);
    geluGrad[i] = g * (geluDouble(v + h) - geluDouble(v - h)) / (2 * h);
  }
  backend_->activationForward(Activation::kRelu, x.get(), y.get(), n);
  expectNear(y.download(), relu, 0, 0);
  backend_->activationForward(Activation::kGelu, x.get(), y.get(), n);
  expectNear(y.download(), gelu, 1e-6, 1e-6);
  backend_->activationBackward(Activation::kRelu, x.get(), dy.get(), dx.get(), n);
  expectNear(dx.download(), reluGrad, 1e-6, 1e-6);
  backend_->activationBackward(Activation::kGelu, x.get(), dy.get(), dx.get(), n);
  expectNear(dx.download(), geluGrad, 1e-5, 1e-5);

  // In place: y = act(y), dx = dy * act'(x) into dy.
  backend_->copy(y.get(), x.get(), n);
  backend_->activationForward(Activation::kGelu, y.get(), y.get(), n);
  expectNear(y.download(), gelu, 1e-6, 1e-6);
  backend_->activationBackward(Activation::kGelu, x.get(), dy.get(), dy.get(), n);
  expectNear(dy.download(), geluGrad, 1e-5, 1e-5);
}

// ---- Softmax cross-entropy ----------------------------------------------------------------

TEST_F(CpuBackendTest, SoftmaxCrossEntropyMatchesHandComputedValues) {
  const int classes = 3;
  const std::vector<float> hostLogits{
      1, 2, 3,              // label 2: loss log(e + e^2 + e^3) - 3; arg-max 2 (correct)
      1000, 1000, 1000,     // label 1: loss log 3, no overflow; tie -> index 0 (wrong)
      0, 5, 5,              // label 2: loss log(1 + 2e^5) - 5; tie -> index 1 (wrong)
      1000, 0, -1000,       // label 0: loss ~0 (e^-1000 underflows); correct
  };
  const std::vector<std::int32_t> hostLabels{2, 1, 2, 0};
  const std::array<double, 4> rowLoss{0.40760596444438013, 1.0986122886681098, 0.696510491782079, 0.0};
  BackendBuffer<float> logits(*backend_, hostLogits), dlogits(*backend_, hostLogits.size());
  BackendBuffer<std::int32_t> labels(*backend_, hostLabels);

  const LossStats noGrad = backend_->softmaxCrossEntropy(logits.get(), labels.get(), 4, classes, nullptr, 1.0f);
  EXPECT_NEAR(noGrad.lossSum, rowLoss[0] + rowLoss[1] + rowLoss[2] + rowLoss[3], 1e-6);
  EXPECT_EQ(noGrad.correct, 2);

  const LossStats stats = backend_->softmaxCrossEntropy(logits.get(), labels.get(), 4, classes, dlogits.get(), 0.5f);
  EXPECT_NEAR(stats.lossSum, noGrad.lossSum, 1e-12);
  EXPECT_EQ(stats.correct, 2);
  const double s = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  const double e5 = 1.0 + 2.0 * std::exp(5.0);
  const std::vector<double> want{
      0.5 * std::exp(-2.0) / s, 0.5 * std::exp(-1.0) / s, 0.5 * (1.0 / s - 1.0),
      0.5 / 3.0, 0.5 * (1.0 / 3.0 - 1.0), 0.5 / 3.0,
      0.5 / e5, 0.5 * std::exp(5.0) / e5, 0.5 * (std::exp(5.0) / e5 - 1.0),
      0.0, 0.0, 0.0,  // softmax (1, ~0, ~0) minus one-hot at 0
  };
  expectNear(dlogits.download(), want, 1e-6, 1e-7);

  // dlogits may be the logits themselves.
  const LossStats inPlace = backend_->softmaxCrossEntropy(logits.get(), labels.get(), 4, classes, logits.get(), 0.5f);
  EXPECT_NEAR(inPlace.lossSum, noGrad.lossSum, 1e-12);
  EXPECT_EQ(inPlace.correct, 2);
  expectNear(logits.download(), want, 1e-6, 1e-7);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyMatchesDoubleReferenceOnRandomRows) {
  const int rows = 37, classes = 13;
  const auto hostLogits = randomFloats(rows * classes, 31, -8.0f, 8.0f);
  const auto hostLabels = randomLabels(rows, classes, 32);
  BackendBuffer<float> logits(*backend_, hostLogits), dlogits(*backend_, hostLogits.size());
  BackendBuffer<std::int32_t> labels(*backend_, hostLabels);
  const float gradScale = 1.0f / rows;
  const LossStats stats =
      backend_->softmaxCrossEntropy(logits.get(), labels.get(), rows, classes, dlogits.get(), gradScale);

  double lossSum = 0;
  std::int64_t correct = 0;
  std::vector<double> want(hostLogits.size());
  for (int r = 0; r < rows; ++r) {
    const float* x = &hostLogits[static_cast<std::size_t>(r * classes)];
    int argMax = 0;
    for (int c = 1; c < classes; ++c) argMax = x[c] > x[argMax] ? c : argMax;
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(x[c]));
    lossSum += std::log(sum) - static_cast<double>(x[hostLabels[r]]);
    correct += argMax == hostLabels[r] ? 1 : 0;
    for (int c = 0; c < classes; ++c) {
      const double softmax = std::exp(static_cast<double>(x[c])) / sum;
      want[r * classes + c] = static_cast<double>(gradScale) * (softmax - (c == hostLabels[r] ? 1 : 0));
    }
  }
  EXPECT_NEAR(stats.lossSum, lossSum, 1e-6 * lossSum);
  EXPECT_EQ(stats.correct, correct);
  expectNear(dlogits.download(), want, 1e-5, 1e-8);
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyRejectsLabelsOutOfRangeBeforeWriting) {
  const std::vector<float> hostLogits{1, 2, 3, 4, 5, 6};
  BackendBuffer<float> logits(*backend_, hostLogits), dlogits(*backend_, 6);
  for (const std::int32_t bad : {3, -1}) {
    BackendBuffer<std::int32_t> labels(*backend_, std::vector<std::int32_t>{0, bad});
    try {
      backend_->softmaxCrossEntropy(logits.get(), labels.get(), 2, 3, dlogits.get(), 1.0f);
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("label " + std::to_string(bad) + " of row 1 is outside [0, 3)"),
                std::string::npos)
          << e.what();
    }
    expectNear(dlogits.download(), std::vector<float>(6, 0.0f), 0, 0);
  }
  BackendBuffer<std::int32_t> labels(*backend_, std::vector<std::int32_t>{0});
  EXPECT_THROW(backend_->softmaxCrossEntropy(logits.get(), labels.get(), 1, 0, nullptr, 1.0f), std::invalid_argument);
  const LossStats none = backend_->softmaxCrossEntropy(logits.get(), labels.get(), 0, 3, nullptr, 1.0f);
  EXPECT_EQ(none.lossSum, 0.0);
  EXPECT_EQ(none.correct, 0);
}

// ---- Optimizers --------------------------------------------------------------------------

// Two SGD steps on w = 1 with g = 0.5 both times, lr 0.1, worked by hand.
TEST_F(CpuBackendTest, SgdTakesHandWorkedSteps) {
  struct Case {
    const char* name;
    SgdParams p;
    float afterOne, afterTwo;
  };
  const std::array<Case, 4> cases{{
      // w -= 0.1 * 0.5, twice.
      {"plain", {.lr = 0.1f, .momentum = 0.0f, .weightDecay = 0.0f, .nesterov = false}, 0.95f, 0.9f},
      // v = 0.5 -> w 0.95; v = 0.45 + 0.5 = 0.95 -> w 0.855.
      {"momentum", {.lr = 0.1f, .momentum = 0.9f, .weightDecay = 0.0f, .nesterov = false}, 0.95f, 0.855f},
      // v = 0.5, w -= 0.1 (0.5 + 0.45) -> 0.905; v = 0.95, w -= 0.1 (0.5 + 0.855) -> 0.7695.
      {"nesterov", {.lr = 0.1f, .momentum = 0.9f, .weightDecay = 0.0f, .nesterov = true}, 0.905f, 0.7695f},
      // g' = 0.5 + 0.1 * 1 = 0.6 -> v 0.6, w 0.94; g' = 0.594 -> v 1.134, w 0.8266.
      {"weight decay", {.lr = 0.1f, .momentum = 0.9f, .weightDecay = 0.1f, .nesterov = false}, 0.94f, 0.8266f},
  }};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    BackendBuffer<float> w(*backend_, std::vector<float>{1.0f}), g(*backend_, std::vector<float>{0.5f});
    BackendBuffer<float> velocity(*backend_, 1);
    backend_->sgdStep(w.get(), g.get(), velocity.get(), 1, c.p);
    EXPECT_NEAR(w.download()[0], c.afterOne, 1e-6);
    backend_->sgdStep(w.get(), g.get(), velocity.get(), 1, c.p);
    EXPECT_NEAR(w.download()[0], c.afterTwo, 1e-6);
  }
}

// w = 1, lr 0.1, betas 0.9/0.999, eps 1e-8, decay 0.01; g = 0.5 then -0.25.
// Step 1: w = 0.999 (decay); m = 0.05, v = 0.00025; m-hat 0.5, v-hat 0.25 -> w = 0.899000002.
// Step 2: w = 0.898101002; m = 0.02, v = 0.00031225; m-hat 0.02/0.19, v-hat 0.00031225/0.001999
// -> w = 0.8714672987.
TEST_F(CpuBackendTest, AdamWTakesHandWorkedSteps) {
  const AdamWParams p{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weightDecay = 0.01f};
  BackendBuffer<float> w(*backend_, std::vector<float>{1.0f}), m(*backend_, 1), v(*backend_, 1);
  BackendBuffer<float> g1(*backend_, std::vector<float>{0.5f}), g2(*backend_, std::vector<float>{-0.25f});
  backend_->adamwStep(w.get(), g1.get(), m.get(), v.get(), 1, p, 1);
  EXPECT_NEAR(w.download()[0], 0.899000002, 1e-6);
  // 1 - 0.999f is 0.00099999 in float: the moments carry that (and it cancels in v-hat).
  EXPECT_NEAR(m.download()[0], 0.05, 1e-7);
  EXPECT_NEAR(v.download()[0], 0.00025, 0.00025 * 2e-5);
  backend_->adamwStep(w.get(), g2.get(), m.get(), v.get(), 1, p, 2);
  EXPECT_NEAR(w.download()[0], 0.8714672987, 1e-6);
  EXPECT_NEAR(m.download()[0], 0.02, 1e-7);
  EXPECT_NEAR(v.download()[0], 0.00031225, 0.00031225 * 2e-5);
  EXPECT_THROW(backend_->adamwStep(w.get(), g2.get(), m.get(), v.get(), 1, p, 0), std::invalid_argument);
}

// ---- Vector ops and casts ---------------------------------------------------------------------

TEST_F(CpuBackendTest, VectorOpsMatchReference) {
  const std::size_t n = 257;
  const auto hostA = randomFloats(n, 41), hostB = randomFloats(n, 42);
  BackendBuffer<float> a(*backend_, hostA), b(*backend_, hostB), out(*backend_, n);
  std::vector<double> want(n);

  backend_->subtract(a.get(), b.get(), out.get(), n);
  const std::vector<double> a64(hostA.begin(), hostA.end()), b64(hostB.begin(), hostB.end());
  for (std::size_t i = 0; i < n; ++i) want[i] = a64[i] - b64[i];
  expectNear(out.download(), want, 1e-6, 1e-7);
  backend_->copy(out.get(), b.get(), n);
  backend_->subtract(a.get(), out.get(), out.get(), n);  // out == b's copy
  expectNear(out.download(), want, 1e-6, 1e-7);

  backend_->copy(out.get(), a.get(), n);
  backend_->axpy(-1.5f, b.get(), out.get(), n);
  for (std::size_t i = 0; i < n; ++i) want[i] = a64[i] - 1.5 * b64[i];
  expectNear(out.download(), want, 1e-6, 1e-6);

  backend_->copy(out.get(), a.get(), n);
  backend_->accumulate(out.get(), b.get(), n);
  for (std::size_t i = 0; i < n; ++i) want[i] = a64[i] + b64[i];
  expectNear(out.download(), want, 1e-6, 1e-7);

  backend_->scale(out.get(), n, 0.25f);
  for (double& x : want) x *= 0.25;
  expectNear(out.download(), want, 1e-6, 1e-7);

  // Zero-length calls touch nothing.
  backend_->scale(nullptr, 0, 2.0f);
  backend_->axpy(2.0f, nullptr, nullptr, 0);
  backend_->copy(nullptr, nullptr, 0);
  backend_->accumulate(nullptr, nullptr, 0);
  backend_->activationForward(Activation::kGelu, nullptr, nullptr, 0);
  backend_->addBias(nullptr, nullptr, 0, 5);
}

TEST_F(CpuBackendTest, CastsMatchTheScalarReference) {
  auto host = randomFloats(1003, 51, -70000.0f, 70000.0f);
  const std::array<float, 8> special{0.0f, -0.0f, 1e-8f, -6e-6f, 65504.0f, 65520.0f, INFINITY, NAN};
  std::copy(special.begin(), special.end(), host.begin());
  BackendBuffer<float> src(*backend_, host), back(*backend_, host.size());
  BackendBuffer<std::uint16_t> half(*backend_, host.size());

  backend_->castToBF16(src.get(), half.get(), host.size());
  const auto bf16 = half.download();
  backend_->castFromBF16(half.get(), back.get(), host.size());
  const auto fromBf16 = back.download();
  backend_->castToF16(src.get(), half.get(), host.size());
  const auto f16 = half.download();
  backend_->castFromF16(half.get(), back.get(), host.size());
  const auto fromF16 = back.download();
  for (std::size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(bf16[i], floatToBF16(host[i])) << i;
    ASSERT_EQ(f16[i], floatToF16(host[i])) << i;
    const float wantBf16 = bf16ToFloat(bf16[i]), wantF16 = f16ToFloat(f16[i]);
    ASSERT_EQ(std::memcmp(&fromBf16[i], &wantBf16, sizeof(float)), 0) << i;
    ASSERT_EQ(std::memcmp(&fromF16[i], &wantF16, sizeof(float)), 0) << i;
  }
}

// ---- Memory and staging --------------------------------------------------------------------

// ---- Convolution and pooling ------------------------------------------------------------

// x[n][y][x][c] of an NHWC tensor, 0 outside the image.
float pixel(const std::vector<float>& x, const ImageShape& s, int n, int y, int px, int c) {
  if (y < 0 || y >= s.side || px < 0 || px >= s.side) return 0.0f;
  return x[static_cast<std::size_t>(((n * s.side + y) * s.side + px) * s.channels + c)];
}

// A direct convolution in double (stride 1, padding k / 2) of x with W [k*k*C x out].
std::vector<double> convReference(const std::vector<float>& x, const ImageShape& s, int k, const std::vector<float>& w,
                                  int out) {
  std::vector<double> y(static_cast<std::size_t>(s.batch * s.side * s.side * out), 0.0);
  const int pad = k / 2;
  for (int n = 0; n < s.batch; ++n)
    for (int oy = 0; oy < s.side; ++oy)
      for (int ox = 0; ox < s.side; ++ox)
        for (int o = 0; o < out; ++o) {
          double sum = 0;
          for (int ky = 0; ky < k; ++ky)
            for (int kx = 0; kx < k; ++kx)
              for (int c = 0; c < s.channels; ++c)
                sum += static_cast<double>(pixel(x, s, n, oy + ky - pad, ox + kx - pad, c)) *
                       static_cast<double>(w[static_cast<std::size_t>(((ky * k + kx) * s.channels + c) * out + o)]);
          y[static_cast<std::size_t>(((n * s.side + oy) * s.side + ox) * out + o)] = sum;
        }
  return y;
}

struct ConvCase {
  ImageShape shape;
  int kernel;
};

constexpr std::array<ConvCase, 5> kConvCases{{{{1, 1, 1}, 1}, {{2, 4, 3}, 3}, {{3, 6, 2}, 5}, {{1, 3, 4}, 7},
                                              {{2, 28, 1}, 5}}};

// im2col followed by GEMM is the direct convolution, for kernels narrower and wider than the
// image (so padding covers whole window rows).
TEST_F(CpuBackendTest, Im2colGemmIsTheDirectConvolution) {
  for (const ConvCase& cc : kConvCases) {
    const ImageShape s = cc.shape;
    const int k = cc.kernel, out = 3;
    SCOPED_TRACE(::testing::Message() << "batch " << s.batch << " side " << s.side << " channels " << s.channels
                                      << " kernel " << k);
    const std::size_t pixels = static_cast<std::size_t>(s.batch * s.side * s.side);
    const std::size_t rowWidth = static_cast<std::size_t>(k * k * s.channels);
    const auto hostX = randomFloats(pixels * static_cast<std::size_t>(s.channels), 600);
    const auto hostW = randomFloats(rowWidth * out, 601);
    // Garbage in col first: im2col must write every element, zeros included.
    BackendBuffer<float> x(*backend_, hostX), w(*backend_, hostW),
        col(*backend_, std::vector<float>(pixels * rowWidth, 7.0f)), y(*backend_, pixels * out);
    backend_->im2col(x.get(), s, k, col.get());
    backend_->gemm(false, false, static_cast<int>(pixels), out, static_cast<int>(rowWidth), 1.0f, col.get(),
                   static_cast<int>(rowWidth), w.get(), out, 0.0f, y.get(), out);
    const std::vector<double> want = convReference(hostX, s, k, hostW, out);
    const std::vector<float> got = y.download();
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * static_cast<double>(1 + rowWidth)) << "output " << i;
  }
}

// col2im is im2col's adjoint: <im2col(x), g> = <x, col2im(g)> for random x and g.
TEST_F(CpuBackendTest, Col2imIsTheAdjointOfIm2col) {
  for (const ConvCase& cc : kConvCases) {
    const ImageShape s = cc.shape;
    const int k = cc.kernel;
    SCOPED_TRACE(::testing::Message() << "side " << s.side << " kernel " << k);
    const std::size_t n = static_cast<std::size_t>(s.batch * s.side * s.side * s.channels);
    const std::size_t cols = static_cast<std::size_t>(s.batch * s.side * s.side) * static_cast<std::size_t>(k * k * s.channels);
    const auto hostX = randomFloats(n, 610), hostG = randomFloats(cols, 611);
    BackendBuffer<float> x(*backend_, hostX), g(*backend_, hostG), col(*backend_, cols),
        dx(*backend_, std::vector<float>(n, 7.0f));
    backend_->im2col(x.get(), s, k, col.get());
    backend_->col2im(g.get(), s, k, dx.get());
    const std::vector<float> colHost = col.download(), dxHost = dx.download();
    double left = 0, right = 0, scale = 0;
    for (std::size_t i = 0; i < cols; ++i) left += static_cast<double>(colHost[i]) * static_cast<double>(hostG[i]);
    for (std::size_t i = 0; i < n; ++i) {
      right += static_cast<double>(hostX[i]) * static_cast<double>(dxHost[i]);
      scale += std::fabs(static_cast<double>(hostX[i]) * static_cast<double>(dxHost[i]));
    }
    EXPECT_NEAR(left, right, 1e-5 * (1 + scale));
  }
}

TEST_F(CpuBackendTest, MaxPoolPicksTheFirstMaximumAndRoutesItsGradientThere) {
  // One 4 x 4 image, 2 channels. Channel 0: distinct values; channel 1: a tie in every window.
  const ImageShape s{1, 4, 2};
  std::vector<float> hostX(32);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      hostX[static_cast<std::size_t>((y * 4 + x) * 2)] = static_cast<float>((y * 7 + x * 3) % 11) - 5.0f;
      hostX[static_cast<std::size_t>((y * 4 + x) * 2 + 1)] = (x + y) % 2 == 1 ? 2.0f : -1.0f;  // slots 1 and 2 tie
    }
  BackendBuffer<float> x(*backend_, hostX), y(*backend_, 8), dy(*backend_, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}),
      dx(*backend_, std::vector<float>(32, 9.0f));
  BackendBuffer<std::uint8_t> argmax(*backend_, 8);
  backend_->maxPool2Forward(x.get(), s, y.get(), argmax.get());
  backend_->maxPool2Backward(dy.get(), argmax.get(), s, dx.get());
  const auto yHost = y.download(), dxHost = dx.download();
  const auto slots = argmax.download();
  for (int oy = 0; oy < 2; ++oy)
    for (int ox = 0; ox < 2; ++ox)
      for (int c = 0; c < 2; ++c) {
        const auto o = static_cast<std::size_t>((oy * 2 + ox) * 2 + c);
        float best = -1e9f;
        int bestSlot = -1;
        for (int slot = 0; slot < 4; ++slot) {
          const float v = pixel(hostX, s, 0, 2 * oy + slot / 2, 2 * ox + slot % 2, c);
          if (v > best) best = v, bestSlot = slot;
        }
        EXPECT_EQ(yHost[o], best) << o;
        EXPECT_EQ(slots[o], bestSlot) << o;
        if (c == 1) {
          EXPECT_EQ(slots[o], 1) << "a tie goes to the first slot";
        }
        for (int slot = 0; slot < 4; ++slot) {
          const auto i = static_cast<std::size_t>((((2 * oy + slot / 2) * 4) + 2 * ox + slot % 2) * 2 + c);
          EXPECT_EQ(dxHost[i], slot == bestSlot ? static_cast<float>(o + 1) : 0.0f) << "input " << i;
        }
      }
}

TEST_F(CpuBackendTest, ImageOpsRejectBadShapes) {
  float buf[64] = {};
  std::uint8_t slots[16] = {};
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message([&] { backend_->im2col(buf, {1, 2, 1}, 2, buf); }).find("kernel 2 must be odd"), std::string::npos);
  EXPECT_NE(message([&] { backend_->col2im(buf, {1, 0, 1}, 3, buf); }).find("bad image shape"), std::string::npos);
  EXPECT_NE(message([&] { backend_->im2col(buf, {-1, 2, 1}, 1, buf); }).find("bad image shape"), std::string::npos);
  EXPECT_NE(message([&] { backend_->maxPool2Forward(buf, {1, 3, 1}, buf, slots); }).find("even side"),
            std::string::npos);
  EXPECT_NE(message([&] { backend_->maxPool2Backward(buf, slots, {1, 2, 0}, buf); }).find("bad image shape"),
            std::string::npos);
  // An empty batch is fine and touches nothing.
  backend_->im2col(nullptr, {0, 5, 3}, 3, nullptr);
  backend_->maxPool2Forward(nullptr, {0, 4, 3}, nullptr, nullptr);
}

TEST_F(CpuBackendTest, AllocReturnsZeroedAlignedMemoryAndStagingRoundTrips) {
  EXPECT_NE(backend_->describe().find("OpenBLAS"), std::string::npos) << backend_->describe();
  EXPECT_EQ(backend_->device(), Device::kCpu);
  const std::size_t n = 1001;
  for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, n * sizeof(float)}) {
    void* p = backend_->alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
    const auto* bytesP = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < bytes; ++i) ASSERT_EQ(bytesP[i], 0) << i;
    backend_->free(p);
  }
  // From 2 MiB on, huge-page aligned, and zeroed to the last byte asked for.
  const std::size_t big = (std::size_t{2} << 20) + 12345;
  auto* p = static_cast<unsigned char*>(backend_->alloc(big));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (std::size_t{2} << 20), 0u);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[big - 1], 0);
  p[big - 1] = 1;  // the whole size is usable
  backend_->free(p);
  backend_->free(nullptr);
  backend_->freeHost(nullptr);

  const auto host = randomFloats(n, 61);
  BackendBuffer<float> device(*backend_, n);
  auto* pinned = static_cast<float*>(backend_->allocHost(n * sizeof(float)));
  std::memcpy(pinned, host.data(), n * sizeof(float));
  backend_->stageToDevice(device.get(), pinned, n * sizeof(float));
  std::memset(pinned, 0, n * sizeof(float));
  backend_->scale(device.get(), n, 2.0f);  // compute after the copy sees the staged data
  const std::uint64_t first = backend_->stageToHost(pinned, device.get(), n * sizeof(float));
  const std::uint64_t second = backend_->stageToHost(pinned, device.get(), 0);
  EXPECT_GT(second, first);
  backend_->waitStaged(second);
  EXPECT_THROW(backend_->waitStaged(second + 1), std::invalid_argument);  // never issued
  backend_->synchronize();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(pinned[i], 2.0f * host[i]) << i;
  backend_->freeHost(pinned);
}

}  // namespace
}  // namespace meridian::kernels
