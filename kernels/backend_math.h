// Per-element formulas shared by the CPU backend (backend_cpu.cc) and its CUDA kernels
// (backend_cuda_kernels.cu): both compute every element with the same expression, so the
// parity test can hold them to a few ulps. Host and device; internal to kernels/.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/image_shape.h"

#if defined(__CUDACC__)
#define MERIDIAN_MATH_INLINE __host__ __device__ __forceinline__
#else
#define MERIDIAN_MATH_INLINE [[gnu::always_inline]] inline
#endif

namespace meridian::kernels::detail {

// ---- Activations ---------------------------------------------------------------------

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

MERIDIAN_MATH_INLINE float tanhF32(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}

MERIDIAN_MATH_INLINE float sqrtF32(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
MERIDIAN_MATH_INLINE float gelu(float x) {
  const float t = tanhF32(kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
MERIDIAN_MATH_INLINE float geluDerivative(float x) {
  const float x2 = x * x;
  const float t = tanhF32(kGeluSqrt2OverPi * (x + kGeluCubic * x2 * x));
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x2);
}

MERIDIAN_MATH_INLINE float relu(float x) { return x > 0.0f ? x : 0.0f; }
MERIDIAN_MATH_INLINE float reluBackward(float x, float dy) { return x > 0.0f ? dy : 0.0f; }

// Softmax cross-entropy gradient of one logit: (e / sum - onehot) * gradScale, where
// e = exp(x - rowMax) and inverseSum = 1 / sum over the row.
MERIDIAN_MATH_INLINE float softmaxGrad(float e, float inverseSum, bool isLabel, float gradScale) {
  return (e * inverseSum - (isLabel ? 1.0f : 0.0f)) * gradScale;
}

// ---- Pooling -------------------------------------------------------------------------

MERIDIAN_MATH_INLINE std::size_t imageElements(const ImageShape& s) {
  return static_cast<std::size_t>(s.batch) * static_cast<std::size_t>(s.side) * static_cast<std::size_t>(s.side) *
         static_cast<std::size_t>(s.channels);
}
MERIDIAN_MATH_INLINE std::size_t pooledElements(const ImageShape& s) { return imageElements(s) / 4; }

// Output element i of 2 x 2 max pooling (stride 2) over x: the maximum of its window, read in
// slot order (0: top left, 1: top right, 2: bottom left, 3: bottom right); a later slot wins
// only when strictly greater, so the first wins a tie. slot receives the winner.
MERIDIAN_MATH_INLINE float maxPool2Element(const float* x, const ImageShape& s, std::size_t i, std::uint8_t& slot) {
  const auto c = static_cast<std::size_t>(s.channels);
  const auto half = static_cast<std::size_t>(s.side) / 2;
  const std::size_t ch = i % c;
  const std::size_t pixel = i / c;  // (n * half + oy) * half + ox
  const std::size_t ox = pixel % half;
  const std::size_t rowIndex = pixel / half;  // n * half + oy, so the input row is 2 * rowIndex
  const auto side = static_cast<std::size_t>(s.side);
  const float* topLeft = x + ((2 * rowIndex) * side + 2 * ox) * c + ch;
  const float window[4] = {topLeft[0], topLeft[c], topLeft[side * c], topLeft[side * c + c]};
  float best = window[0];
  std::uint8_t bestSlot = 0;
  for (std::uint8_t k = 1; k < 4; ++k) {
    if (window[k] > best) {
      best = window[k];
      bestSlot = k;
    }
  }
  slot = bestSlot;
  return best;
}

// Input element i's gradient through the pooling: its window's output gradient when it was
// that window's maximum, else 0.
MERIDIAN_MATH_INLINE float maxPool2BackwardElement(const float* dy, const std::uint8_t* argmax, const ImageShape& s,
                                                   std::size_t i) {
  const auto c = static_cast<std::size_t>(s.channels);
  const auto side = static_cast<std::size_t>(s.side);
  const std::size_t ch = i % c;
  const std::size_t pixel = i / c;  // (n * side + iy) * side + ix
  const std::size_t ix = pixel % side;
  const std::size_t rowIndex = pixel / side;  // n * side + iy; side is even, so iy % 2 == rowIndex % 2
  const std::size_t out = ((rowIndex / 2) * (side / 2) + ix / 2) * c + ch;
  const auto slot = static_cast<std::uint8_t>((rowIndex % 2) * 2 + ix % 2);
  return argmax[out] == slot ? dy[out] : 0.0f;
}

// ---- Optimizers ----------------------------------------------------------------------

// backend.h's SgdParams, element by element.
MERIDIAN_MATH_INLINE void sgdUpdate(float& w, float g, float& velocity, float lr, float momentum, float weightDecay,
                                    bool nesterov) {
  const float grad = g + weightDecay * w;
  velocity = momentum * velocity + grad;
  w -= lr * (nesterov ? grad + momentum * velocity : velocity);
}

// AdamW's per-step constants, computed once on the host by adamwStepFactors
// (backend_checks.h), the bias corrections folded in in double: the step divides once and
// takes one square root per element (the form of Kingma & Ba's section 2 that PyTorch also
// uses), rather than dividing both moments by their corrections first.
struct AdamWStepFactors {
  float lrTimesDecay;  // decoupled decay: w -= lr * weightDecay * w
  float beta1, oneMinusBeta1;
  float beta2, oneMinusBeta2;
  float stepSize;                // lr / (1 - beta1^step)
  float inverseSqrtCorrection2;  // 1 / sqrt(1 - beta2^step)
  float eps;
};

// Decay first, then w -= stepSize * m / (sqrt(v) / sqrt(1 - beta2^step) + eps), which is
// the bias-corrected m-hat / (sqrt(v-hat) + eps) step.
MERIDIAN_MATH_INLINE void adamwUpdate(float& w, float g, float& m, float& v, const AdamWStepFactors& f) {
  w -= f.lrTimesDecay * w;
  m = f.beta1 * m + f.oneMinusBeta1 * g;
  v = f.beta2 * v + f.oneMinusBeta2 * g * g;
  w -= f.stepSize * m / (sqrtF32(v) * f.inverseSqrtCorrection2 + f.eps);
}

}  // namespace meridian::kernels::detail
