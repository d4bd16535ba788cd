// Argument checks and per-call constants shared by the CPU and CUDA backends (host side),
// so both reject the same calls with the same std::invalid_argument text. Internal to kernels/.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/backend.h"
#include "kernels/backend_math.h"

namespace meridian::kernels::detail {

[[noreturn]] inline void throwInvalid(const std::string& what) {
  throw std::invalid_argument("meridian::kernels: " + what);
}

// AdamW's constants for `step` (counted from 1).
inline AdamWStepFactors adamwStepFactors(const AdamWParams& p, std::int64_t step) {
  if (step < 1) {
    throwInvalid("adamwStep: step counts from 1, got " + std::to_string(step));
  }
  const double t = static_cast<double>(step);
  const double correction1 = 1.0 - std::pow(static_cast<double>(p.beta1), t);
  const double correction2 = 1.0 - std::pow(static_cast<double>(p.beta2), t);
  return AdamWStepFactors{
      .lrTimesDecay = p.lr * p.weightDecay,
      .beta1 = p.beta1,
      .oneMinusBeta1 = 1.0f - p.beta1,
      .beta2 = p.beta2,
      .oneMinusBeta2 = 1.0f - p.beta2,
      .stepSize = static_cast<float>(static_cast<double>(p.lr) / correction1),
      .inverseSqrtCorrection2 = static_cast<float>(1.0 / std::sqrt(correction2)),
      .eps = p.eps,
  };
}

inline void checkShape(const char* op, int rows, int cols) {
  if (rows < 0 || cols < 0) {
    throwInvalid(std::string(op) + ": negative shape " + std::to_string(rows) + " x " + std::to_string(cols));
  }
}

// Row-major strides: A is stored m x k (k x m when transposed), B k x n (n x k), C m x n.
inline void checkGemm(bool transA, bool transB, int m, int n, int k, int lda, int ldb, int ldc) {
  if (m < 0 || n < 0 || k < 0) {
    throwInvalid("gemm: negative size m=" + std::to_string(m) + " n=" + std::to_string(n) +
                 " k=" + std::to_string(k));
  }
  const auto checkStride = [](const char* name, int ld, int storedCols) {
    const int minimum = storedCols > 1 ? storedCols : 1;
    if (ld < minimum) {
      throwInvalid(std::string("gemm: ") + name + "=" + std::to_string(ld) + " is below the " +
                   std::to_string(minimum) + " columns stored");
    }
  };
  checkStride("lda", lda, transA ? m : k);
  checkStride("ldb", ldb, transB ? k : n);
  checkStride("ldc", ldc, n);
}

// Image ops: a non-negative batch, positive side and channels, an odd kernel of at most
// kMaxKernel, and an even side for pooling.
constexpr int kMaxKernel = 31;

inline void checkImage(const char* op, const ImageShape& s, int kernel, bool pooled) {
  if (s.batch < 0 || s.side < 1 || s.channels < 1) {
    throwInvalid(std::string(op) + ": bad image shape batch=" + std::to_string(s.batch) + " side=" +
                 std::to_string(s.side) + " channels=" + std::to_string(s.channels));
  }
  if (kernel < 1 || kernel % 2 == 0 || kernel > kMaxKernel) {
    throwInvalid(std::string(op) + ": kernel " + std::to_string(kernel) + " must be odd, in 1.." +
                 std::to_string(kMaxKernel));
  }
  if (pooled && s.side % 2 != 0) {
    throwInvalid(std::string(op) + ": 2 x 2 pooling needs an even side, got " + std::to_string(s.side));
  }
}

inline void checkSoftmaxShape(int rows, int classes) {
  checkShape("softmaxCrossEntropy", rows, classes);
  if (rows > 0 && classes == 0) throwInvalid("softmaxCrossEntropy: 0 classes");
}

[[noreturn]] inline void throwBadLabel(std::int64_t row, std::int32_t label, int classes) {
  throwInvalid("softmaxCrossEntropy: label " + std::to_string(label) + " of row " + std::to_string(row) +
               " is outside [0, " + std::to_string(classes) + ")");
}

}  // namespace meridian::kernels::detail
