// The CUDA backend's kernels (launchers declared in backend_cuda_kernels.h): grid-stride
// element-wise kernels over the per-element formulas of backend_math.h and half_bits.h, the
// same ones the CPU backend uses; column sums for biasGrad; and softmax cross-entropy as one
// block per row followed by a one-block reduction. backend_cuda.cc drives them.
#include "kernels/backend_cuda_kernels.h"

#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/backend_math.h"
#include "kernels/half_bits.h"

namespace meridian::kernels::cuda {
namespace {

// ---- Element-wise kernels --------------------------------------------------------------

constexpr int kThreads = 256;

template <typename Op>
__global__ void forEachElement(std::size_t n, Op op) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) op(i);
}

struct AddBiasOp {
  float* y;
  const float* bias;
  std::size_t cols;
  __device__ void operator()(std::size_t i) const { y[i] += bias[i % cols]; }
};

template <bool kGelu>
struct ActivationForwardOp {
  const float* x;
  float* y;
  __device__ void operator()(std::size_t i) const {
    y[i] = kGelu ? detail::gelu(x[i]) : detail::relu(x[i]);
  }
};

template <bool kGelu>
struct ActivationBackwardOp {
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(std::size_t i) const {
    dx[i] = kGelu ? dy[i] * detail::geluDerivative(x[i]) : detail::reluBackward(x[i], dy[i]);
  }
};

// One col element: i = row * rowWidth + (ky * kernel + kx) * channels + c, row = (n, y, x).
struct Im2colOp {
  const float* x;
  float* col;
  ImageShape s;
  int kernel;
  __device__ void operator()(std::size_t i) const {
    const auto c = static_cast<std::size_t>(s.channels);
    const auto side = static_cast<std::size_t>(s.side);
    const auto k = static_cast<std::size_t>(kernel);
    const std::size_t rowWidth = k * k * c;
    const std::size_t row = i / rowWidth, within = i % rowWidth;
    const std::size_t ch = within % c, tap = within / c;
    const auto kx = static_cast<long long>(tap % k), ky = static_cast<long long>(tap / k);
    const std::size_t pixel = row % (side * side), n = row / (side * side);
    const long long pad = kernel / 2;
    const long long iy = static_cast<long long>(pixel / side) + ky - pad;
    const long long ix = static_cast<long long>(pixel % side) + kx - pad;
    const auto sideL = static_cast<long long>(side);
    col[i] = iy >= 0 && iy < sideL && ix >= 0 && ix < sideL
                 ? x[((n * side + static_cast<std::size_t>(iy)) * side + static_cast<std::size_t>(ix)) * c + ch]
                 : 0.0f;
  }
};

// One input element: the col entries copied from it, added in ascending (ky, kx) order as
// the CPU backend does.
struct Col2imOp {
  const float* col;
  float* dx;
  ImageShape s;
  int kernel;
  __device__ void operator()(std::size_t i) const {
    const auto c = static_cast<std::size_t>(s.channels);
    const auto side = static_cast<long long>(s.side);
    const std::size_t rowWidth = static_cast<std::size_t>(kernel) * static_cast<std::size_t>(kernel) * c;
    const std::size_t ch = i % c, pixel = i / c;
    const auto sq = static_cast<std::size_t>(side * side);
    const std::size_t n = pixel / sq;
    const auto iy = static_cast<long long>((pixel % sq) / static_cast<std::size_t>(side));
    const auto ix = static_cast<long long>(pixel % static_cast<std::size_t>(side));
    const long long pad = kernel / 2;
    float sum = 0.0f;
    for (int ky = 0; ky < kernel; ++ky) {
      const long long y = iy - ky + pad;
      if (y < 0 || y >= side) continue;
      for (int kx = 0; kx < kernel; ++kx) {
        const long long px = ix - kx + pad;
        if (px < 0 || px >= side) continue;
        const std::size_t row = n * sq + static_cast<std::size_t>(y * side + px);
        sum += col[row * rowWidth + static_cast<std::size_t>(ky * kernel + kx) * c + ch];
      }
    }
    dx[i] = sum;
  }
};

struct MaxPoolOp {
  const float* x;
  float* y;
  std::uint8_t* argmax;
  ImageShape s;
  __device__ void operator()(std::size_t i) const { y[i] = detail::maxPool2Element(x, s, i, argmax[i]); }
};

struct MaxPoolBackwardOp {
  const float* dy;
  const std::uint8_t* argmax;
  float* dx;
  ImageShape s;
  __device__ void operator()(std::size_t i) const { dx[i] = detail::maxPool2BackwardElement(dy, argmax, s, i); }
};

struct SgdOp {
  float* w;
  const float* g;
  float* velocity;
  float lr, momentum, weightDecay;
  bool nesterov;
  __device__ void operator()(std::size_t i) const {
    detail::sgdUpdate(w[i], g[i], velocity[i], lr, momentum, weightDecay, nesterov);
  }
};

struct AdamWOp {
  float* w;
  const float* g;
  float* m;
  float* v;
  detail::AdamWStepFactors f;
  __device__ void operator()(std::size_t i) const { detail::adamwUpdate(w[i], g[i], m[i], v[i], f); }
};

struct ScaleOp {
  float* x;
  float factor;
  __device__ void operator()(std::size_t i) const { x[i] *= factor; }
};

struct AxpyOp {
  float alpha;
  const float* x;
  float* y;
  __device__ void operator()(std::size_t i) const { y[i] += alpha * x[i]; }
};

struct SubtractOp {
  const float* a;
  const float* b;
  float* out;
  __device__ void operator()(std::size_t i) const { out[i] = a[i] - b[i]; }
};

struct AccumulateOp {
  float* dst;
  const float* src;
  __device__ void operator()(std::size_t i) const { dst[i] += src[i]; }
};

template <bool kBF16>
struct NarrowOp {
  const float* src;
  std::uint16_t* dst;
  __device__ void operator()(std::size_t i) const {
    dst[i] = kBF16 ? floatToBF16Inline(src[i]) : floatToF16Inline(src[i]);
  }
};

template <bool kBF16>
struct WidenOp {
  const std::uint16_t* src;
  float* dst;
  __device__ void operator()(std::size_t i) const {
    dst[i] = kBF16 ? bf16ToFloatInline(src[i]) : f16ToFloatInline(src[i]);
  }
};

// dbias[col] = sum of column col, one thread per column adding rows in order (as the CPU
// backend does, so the two agree to the bit).
__global__ void columnSums(const float* dy, float* dbias, int rows, int cols) {
  const int col = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (col >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += dy[static_cast<std::size_t>(r) * cols + col];
  dbias[col] = sum;
}

// ---- Softmax cross-entropy -----------------------------------------------------------------

constexpr int kRowThreadsMax = 256;  // a power of two: the tree reductions halve it
constexpr int kNoIndex = INT_MAX;  // no arg-max yet

// What the per-row kernel leaves for sumRows: the row's loss, and 1 (arg-max is the label),
// 0 (it is not) or -1 (the label is out of range: the row is skipped, nothing read there).
constexpr int kBadLabel = -1;

// One block per row. Pass 1: max and arg-max (the lowest index wins a tie) and the label's
// logit, all read before pass 2 writes dlogits (which may alias logits). Pass 2: e = exp(x -
// max) into dlogits and their sum. Pass 3: each thread turns its own e into the gradient.
__global__ void softmaxXentRows(const float* logits, const std::int32_t* labels, int classes, float* dlogits,
                                float gradScale, double* rowLoss, int* rowStatus) {
  __shared__ float sValue[kRowThreadsMax];
  __shared__ int sIndex[kRowThreadsMax];
  const int tid = static_cast<int>(threadIdx.x);
  const std::size_t row = blockIdx.x;
  const std::size_t offset = row * static_cast<std::size_t>(classes);
  const float* x = logits + offset;
  const int label = labels[row];
  const bool labelOk = label >= 0 && label < classes;

  float best = 0.0f;
  int bestIndex = kNoIndex;
  for (int c = tid; c < classes; c += blockDim.x) {
    if (bestIndex == kNoIndex || x[c] > best) {
      best = x[c];
      bestIndex = c;
    }
  }
  sValue[tid] = best;
  sIndex[tid] = bestIndex;
  __syncthreads();
  for (int half = static_cast<int>(blockDim.x) / 2; half > 0; half /= 2) {
    if (tid < half) {
      const float v = sValue[tid + half];
      const int i = sIndex[tid + half];
      if (i != kNoIndex && (sIndex[tid] == kNoIndex || v > sValue[tid] || (v == sValue[tid] && i < sIndex[tid]))) {
        sValue[tid] = v;
        sIndex[tid] = i;
      }
    }
    __syncthreads();
  }
  const float maxLogit = sValue[0];
  const int argMax = sIndex[0];
  const float labelLogit = labelOk ? x[label] : 0.0f;
  __syncthreads();  // every thread has read sValue[0] and x[label] before they are overwritten

  float sum = 0.0f;
  for (int c = tid; c < classes; c += blockDim.x) {
    const float e = expf(x[c] - maxLogit);
    if (dlogits != nullptr) dlogits[offset + c] = e;
    sum += e;
  }
  sValue[tid] = sum;
  __syncthreads();
  for (int half = static_cast<int>(blockDim.x) / 2; half > 0; half /= 2) {
    if (tid < half) sValue[tid] += sValue[tid + half];
    __syncthreads();
  }
  const float sumExp = sValue[0];

  if (dlogits != nullptr) {
    const float inverseSum = 1.0f / sumExp;
    for (int c = tid; c < classes; c += blockDim.x) {
      dlogits[offset + c] = detail::softmaxGrad(dlogits[offset + c], inverseSum, c == label, gradScale);
    }
  }
  if (tid == 0) {
    rowLoss[row] = labelOk ? log(static_cast<double>(sumExp)) -
                                 (static_cast<double>(labelLogit) - static_cast<double>(maxLogit))
                           : 0.0;
    rowStatus[row] = labelOk ? (argMax == label ? 1 : 0) : kBadLabel;
  }
}

// One block: the loss sum (double), the correct count and the first row with a bad label.
__global__ void sumRows(const double* rowLoss, const int* rowStatus, int rows, SoftmaxTotals* totals) {
  __shared__ double sLoss[kRowThreadsMax];
  __shared__ long long sCorrect[kRowThreadsMax];
  __shared__ int sBadRow[kRowThreadsMax];
  const int tid = static_cast<int>(threadIdx.x);
  double loss = 0.0;
  long long correct = 0;
  int badRow = kNoBadRow;
  for (int r = tid; r < rows; r += blockDim.x) {
    if (rowStatus[r] == kBadLabel) {
      badRow = min(badRow, r);
    } else {
      loss += rowLoss[r];
      correct += rowStatus[r];
    }
  }
  sLoss[tid] = loss;
  sCorrect[tid] = correct;
  sBadRow[tid] = badRow;
  __syncthreads();
  for (int half = static_cast<int>(blockDim.x) / 2; half > 0; half /= 2) {
    if (tid < half) {
      sLoss[tid] += sLoss[tid + half];
      sCorrect[tid] += sCorrect[tid + half];
      sBadRow[tid] = min(sBadRow[tid], sBadRow[tid + half]);
    }
    __syncthreads();
  }
  if (tid == 0) *totals = SoftmaxTotals{sLoss[0], sCorrect[0], sBadRow[0]};
}

// The smallest power of two >= classes, within [32, kRowThreadsMax].
unsigned rowThreads(int classes) {
  unsigned threads = 32;
  while (threads < kRowThreadsMax && threads < static_cast<unsigned>(classes)) threads *= 2;
  return threads;
}

template <typename Op>
cudaError_t launchEach(const Launch& l, std::size_t n, const Op& op) {
  if (n == 0) return cudaSuccess;
  std::size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > l.maxBlocks) blocks = l.maxBlocks;
  forEachElement<<<static_cast<unsigned>(blocks), kThreads, 0, l.stream>>>(n, op);
  return cudaGetLastError();
}

std::size_t elements(int rows, int cols) { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }

}  // namespace

cudaError_t addBias(const Launch& l, float* y, const float* bias, int rows, int cols) {
  return launchEach(l, elements(rows, cols), AddBiasOp{y, bias, static_cast<std::size_t>(cols)});
}

cudaError_t biasGrad(const Launch& l, const float* dy, float* dbias, int rows, int cols) {
  if (cols == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  columnSums<<<blocks, kThreads, 0, l.stream>>>(dy, dbias, rows, cols);
  return cudaGetLastError();
}

cudaError_t activationForward(const Launch& l, bool gelu, const float* x, float* y, std::size_t n) {
  return gelu ? launchEach(l, n, ActivationForwardOp<true>{x, y})
              : launchEach(l, n, ActivationForwardOp<false>{x, y});
}

cudaError_t activationBackward(const Launch& l, bool gelu, const float* x, const float* dy, float* dx,
                               std::size_t n) {
  return gelu ? launchEach(l, n, ActivationBackwardOp<true>{x, dy, dx})
              : launchEach(l, n, ActivationBackwardOp<false>{x, dy, dx});
}

cudaError_t im2col(const Launch& l, const float* x, const ImageShape& shape, int kernel, float* col) {
  const auto k = static_cast<std::size_t>(kernel);
  return launchEach(l, detail::imageElements(shape) * k * k, Im2colOp{x, col, shape, kernel});
}
cudaError_t col2im(const Launch& l, const float* col, const ImageShape& shape, int kernel, float* dx) {
  return launchEach(l, detail::imageElements(shape), Col2imOp{col, dx, shape, kernel});
}
cudaError_t maxPool2Forward(const Launch& l, const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax) {
  return launchEach(l, detail::pooledElements(shape), MaxPoolOp{x, y, argmax, shape});
}
cudaError_t maxPool2Backward(const Launch& l, const float* dy, const std::uint8_t* argmax, const ImageShape& shape,
                             float* dx) {
  return launchEach(l, detail::imageElements(shape), MaxPoolBackwardOp{dy, argmax, dx, shape});
}

cudaError_t sgdStep(const Launch& l, float* w, const float* g, float* velocity, std::size_t n, float lr,
                    float momentum, float weightDecay, bool nesterov) {
  return launchEach(l, n, SgdOp{w, g, velocity, lr, momentum, weightDecay, nesterov});
}

cudaError_t adamwStep(const Launch& l, float* w, const float* g, float* m, float* v, std::size_t n,
                      const detail::AdamWStepFactors& f) {
  return launchEach(l, n, AdamWOp{w, g, m, v, f});
}

cudaError_t scale(const Launch& l, float* x, std::size_t n, float factor) {
  return launchEach(l, n, ScaleOp{x, factor});
}
cudaError_t axpy(const Launch& l, float alpha, const float* x, float* y, std::size_t n) {
  return launchEach(l, n, AxpyOp{alpha, x, y});
}
cudaError_t subtract(const Launch& l, const float* a, const float* b, float* out, std::size_t n) {
  return launchEach(l, n, SubtractOp{a, b, out});
}
cudaError_t accumulate(const Launch& l, float* dst, const float* src, std::size_t n) {
  return launchEach(l, n, AccumulateOp{dst, src});
}
cudaError_t castToBF16(const Launch& l, const float* src, std::uint16_t* dst, std::size_t n) {
  return launchEach(l, n, NarrowOp<true>{src, dst});
}
cudaError_t castFromBF16(const Launch& l, const std::uint16_t* src, float* dst, std::size_t n) {
  return launchEach(l, n, WidenOp<true>{src, dst});
}
cudaError_t castToF16(const Launch& l, const float* src, std::uint16_t* dst, std::size_t n) {
  return launchEach(l, n, NarrowOp<false>{src, dst});
}
cudaError_t castFromF16(const Launch& l, const std::uint16_t* src, float* dst, std::size_t n) {
  return launchEach(l, n, WidenOp<false>{src, dst});
}

// Scratch: per-row loss (double), then per-row status (int).
std::size_t softmaxScratchBytes(int rows) {
  return static_cast<std::size_t>(rows) * (sizeof(double) + sizeof(int));
}

cudaError_t softmaxCrossEntropy(const Launch& l, const float* logits, const std::int32_t* labels, int rows,
                                int classes, float* dlogits, float gradScale, void* scratch,
                                SoftmaxTotals* deviceTotals) {
  auto* rowLoss = static_cast<double*>(scratch);
  auto* rowStatus = reinterpret_cast<int*>(rowLoss + rows);
  softmaxXentRows<<<static_cast<unsigned>(rows), rowThreads(classes), 0, l.stream>>>(logits, labels, classes, dlogits,
                                                                                    gradScale, rowLoss, rowStatus);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  sumRows<<<1, kRowThreadsMax, 0, l.stream>>>(rowLoss, rowStatus, rows, deviceTotals);
  return cudaGetLastError();
}

}  // namespace meridian::kernels::cuda
