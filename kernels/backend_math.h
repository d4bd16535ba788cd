// Per-element formulas shared by the CPU backend (backend_cpu.cc) and its CUDA kernels
// (backend_cuda_kernels.cu): both compute every element with the same expression, so the
// parity test can hold them to a few ulps. Host and device; internal to kernels/.
#pragma once

#include <cmath>

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
