// Launchers for the CUDA backend's kernels (backend_cuda_kernels.cu), one per Backend op that
// is not a cuBLAS or memcpy call. Plain C++ so backend_cuda.cc, which owns the streams and
// buffers, builds with the host compiler and the project's warnings; nvcc sees no fmt/spdlog
// headers. Each launcher queues its kernels on `stream` and returns cudaGetLastError();
// counts are elements, and a count of 0 launches nothing. Internal to kernels/.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/backend_math.h"

namespace meridian::kernels::cuda {

struct Launch {
  cudaStream_t stream;
  std::size_t maxBlocks;  // grid-stride kernels use at most this many blocks
};

cudaError_t addBias(const Launch& l, float* y, const float* bias, int rows, int cols);
cudaError_t biasGrad(const Launch& l, const float* dy, float* dbias, int rows, int cols);
cudaError_t activationForward(const Launch& l, bool gelu, const float* x, float* y, std::size_t n);
cudaError_t activationBackward(const Launch& l, bool gelu, const float* x, const float* dy, float* dx,
                               std::size_t n);
cudaError_t im2col(const Launch& l, const float* x, const ImageShape& shape, int kernel, float* col);
cudaError_t col2im(const Launch& l, const float* col, const ImageShape& shape, int kernel, float* dx);
cudaError_t maxPool2Forward(const Launch& l, const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax);
cudaError_t maxPool2Backward(const Launch& l, const float* dy, const std::uint8_t* argmax, const ImageShape& shape,
                             float* dx);
cudaError_t sgdStep(const Launch& l, float* w, const float* g, float* velocity, std::size_t n, float lr,
                    float momentum, float weightDecay, bool nesterov);
cudaError_t adamwStep(const Launch& l, float* w, const float* g, float* m, float* v, std::size_t n,
                      const detail::AdamWStepFactors& f);
cudaError_t scale(const Launch& l, float* x, std::size_t n, float factor);
cudaError_t axpy(const Launch& l, float alpha, const float* x, float* y, std::size_t n);
cudaError_t subtract(const Launch& l, const float* a, const float* b, float* out, std::size_t n);
cudaError_t accumulate(const Launch& l, float* dst, const float* src, std::size_t n);
cudaError_t castToBF16(const Launch& l, const float* src, std::uint16_t* dst, std::size_t n);
cudaError_t castFromBF16(const Launch& l, const std::uint16_t* src, float* dst, std::size_t n);
cudaError_t castToF16(const Launch& l, const float* src, std::uint16_t* dst, std::size_t n);
cudaError_t castFromF16(const Launch& l, const std::uint16_t* src, float* dst, std::size_t n);

// Softmax cross-entropy, reduced on the device into `totals`.
struct SoftmaxTotals {
  double lossSum;
  long long correct;
  int firstBadRow;  // kNoBadRow when every label is in [0, classes)
};
constexpr int kNoBadRow = INT_MAX;

// Device scratch softmaxCrossEntropy needs for `rows` rows (totals, per-row loss and status).
std::size_t softmaxScratchBytes(int rows);
// rows > 0, classes > 0. A row whose label is out of range is skipped (its label is never
// used as an index; its dlogits are softmax without the one-hot) and reported in totals.
cudaError_t softmaxCrossEntropy(const Launch& l, const float* logits, const std::int32_t* labels, int rows,
                                int classes, float* dlogits, float gradScale, void* scratch,
                                SoftmaxTotals* deviceTotals);

}  // namespace meridian::kernels::cuda
