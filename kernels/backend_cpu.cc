// The CPU backend: the reference every other backend is checked against. GEMM goes through
// OpenBLAS; everything else is a plain loop over the shared formulas of backend_math.h,
// written so GCC can vectorise it. Work runs at once on the caller's thread.
#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "kernels/backend.h"
#include "kernels/backend_checks.h"
#include "kernels/backend_math.h"
#include "kernels/reduce.h"

namespace meridian::kernels {
namespace {

constexpr std::size_t kAlignBytes = 256;
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// Zeroed, 256-byte aligned; at least one alignment unit so every call returns a distinct
// pointer (0 bytes included). From 2 MiB on, whole transparent huge pages where the kernel
// has them (madvise mode): one page-table entry per 2 MiB for the TLB, and for the peers
// that read a gradient buffer directly (process_vm_readv pins the pages it copies).
void* alignedZeroed(std::size_t bytes) {
  auto roundUp = [bytes](std::size_t unit) { return std::max(unit, (bytes + unit - 1) / unit * unit); };
  const bool huge = bytes >= kHugePageBytes;
  const std::size_t align = huge ? kHugePageBytes : kAlignBytes;
  const std::size_t rounded = roundUp(align);
  if (rounded < bytes) throw std::bad_alloc();  // overflow
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (huge) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: small pages otherwise
  // Zero what may be used; the rounding past it stays untouched (not resident).
  std::memset(p, 0, roundUp(kAlignBytes));
  return p;
}

void copyBytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  std::memmove(dst, src, bytes);
}

// AdamW's loop is bound by its division and square root more than by memory (on 4 SSE
// lanes with three divisions it ran at 3.3 GB/s of parameters in cache and out of it alike):
// it is built twice, with AVX2 (8 lanes) and for the x86-64 baseline (SSE2), and the loader
// picks the one the CPU runs. AVX2 alone
// does not enable fused multiply-adds, so both clones compute every element with the same
// IEEE operations: ranks of one job on different CPUs keep bit-identical weights.
#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target_clones("avx2", "default")]]
#endif
void adamwLoop(float* w, const float* g, float* m, float* v, std::size_t n, const detail::AdamWStepFactors& f) {
  for (std::size_t i = 0; i < n; ++i) detail::adamwUpdate(w[i], g[i], m[i], v[i], f);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int blasThreads) {
    if (blasThreads > 0) openblas_set_num_threads(blasThreads);
  }

  Device device() const override { return Device::kCpu; }

  std::string describe() const override {
    const int threads = openblas_get_num_threads();
    return "cpu (OpenBLAS, " + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
  }

  // ---- Memory: all of it is host memory ----

  void* alloc(std::size_t bytes) override { return alignedZeroed(bytes); }
  void free(void* p) override { std::free(p); }
  void copyToDevice(void* dst, const void* hostSrc, std::size_t bytes) override { copyBytes(dst, hostSrc, bytes); }
  void copyToHost(void* hostDst, const void* src, std::size_t bytes) override { copyBytes(hostDst, src, bytes); }
  void synchronize() override {}

  void* allocHost(std::size_t bytes) override { return alignedZeroed(bytes); }
  void freeHost(void* p) override { std::free(p); }
  // The copy is done when this returns; the ticket only keeps the CUDA backend's contract.
  std::uint64_t stageToHost(void* hostDst, const void* src, std::size_t bytes) override {
    copyBytes(hostDst, src, bytes);
    return ++lastTicket_;
  }
  void waitStaged(std::uint64_t ticket) override {
    if (ticket > lastTicket_) {
      detail::throwInvalid("waitStaged: ticket " + std::to_string(ticket) + " was never issued (last " +
                           std::to_string(lastTicket_) + ")");
    }
  }
  void stageToDevice(void* dst, const void* hostSrc, std::size_t bytes) override { copyBytes(dst, hostSrc, bytes); }

  // ---- Math ----

  void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) override {
    detail::checkGemm(transA, transB, m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void addBias(float* y, const float* bias, int rows, int cols) override {
    detail::checkShape("addBias", rows, cols);
    const auto width = static_cast<std::size_t>(cols);
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
      float* __restrict row = y + r * width;
      for (std::size_t col = 0; col < width; ++col) row[col] += bias[col];
    }
  }

  // Row by row in float, the order the CUDA kernel's per-column threads sum in too.
  void biasGrad(const float* dy, float* dbias, int rows, int cols) override {
    detail::checkShape("biasGrad", rows, cols);
    const auto width = static_cast<std::size_t>(cols);
    float* __restrict out = dbias;
    std::fill(out, out + width, 0.0f);
    for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
      const float* __restrict row = dy + r * width;
      for (std::size_t col = 0; col < width; ++col) out[col] += row[col];
    }
  }

  void activationForward(Activation act, const float* x, float* y, std::size_t n) override {
    if (act == Activation::kRelu) {
      for (std::size_t i = 0; i < n; ++i) y[i] = detail::relu(x[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) y[i] = detail::gelu(x[i]);
    }
  }

  void activationBackward(Activation act, const float* x, const float* dy, float* dx, std::size_t n) override {
    if (act == Activation::kRelu) {
      for (std::size_t i = 0; i < n; ++i) dx[i] = detail::reluBackward(x[i], dy[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::geluDerivative(x[i]);
    }
  }

  void im2col(const float* x, const ImageShape& shape, int kernel, float* col) override;
  void col2im(const float* col, const ImageShape& shape, int kernel, float* dx) override;
  void maxPool2Forward(const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax) override;
  void maxPool2Backward(const float* dy, const std::uint8_t* argmax, const ImageShape& shape, float* dx) override;

  LossStats softmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows, int classes,
                                float* dlogits, float gradScale) override;

  void sgdStep(float* w, const float* g, float* velocity, std::size_t n, const SgdParams& p) override {
    // Locals, so the stores to w cannot alias the parameters (and the loop vectorises).
    const float lr = p.lr, momentum = p.momentum, weightDecay = p.weightDecay;
    const bool nesterov = p.nesterov;
    for (std::size_t i = 0; i < n; ++i) {
      detail::sgdUpdate(w[i], g[i], velocity[i], lr, momentum, weightDecay, nesterov);
    }
  }

  void adamwStep(float* w, const float* g, float* m, float* v, std::size_t n, const AdamWParams& p,
                 std::int64_t step) override {
    const detail::AdamWStepFactors f = detail::adamwStepFactors(p, step);
    adamwLoop(w, g, m, v, n, f);
  }

  void scale(float* x, std::size_t n, float factor) override {
    for (std::size_t i = 0; i < n; ++i) x[i] *= factor;
  }
  void axpy(float alpha, const float* x, float* y, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
  void subtract(const float* a, const float* b, float* out, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) out[i] = a[i] - b[i];
  }
  void copy(float* dst, const float* src, std::size_t n) override { copyBytes(dst, src, n * sizeof(float)); }
  void accumulate(float* dst, const float* src, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  void castToBF16(const float* src, std::uint16_t* dst, std::size_t n) override { castF32ToBF16(src, dst, n); }
  void castFromBF16(const std::uint16_t* src, float* dst, std::size_t n) override { castBF16ToF32(src, dst, n); }
  void castToF16(const float* src, std::uint16_t* dst, std::size_t n) override { castF32ToF16(src, dst, n); }
  void castFromF16(const std::uint16_t* src, float* dst, std::size_t n) override { castF16ToF32(src, dst, n); }

 private:
  std::uint64_t lastTicket_ = 0;
};

// One output pixel's row at a time: for each window row ky, the kernel's columns that fall
// inside the image are one contiguous run of the input row, copied whole; the rest is 0.
void CpuBackend::im2col(const float* x, const ImageShape& shape, int kernel, float* col) {
  detail::checkImage("im2col", shape, kernel, false);
  const int side = shape.side, pad = kernel / 2;
  const auto c = static_cast<std::size_t>(shape.channels);
  const std::size_t rowWidth = static_cast<std::size_t>(kernel) * static_cast<std::size_t>(kernel) * c;
  float* out = col;
  for (int n = 0; n < shape.batch; ++n) {
    const float* image = x + static_cast<std::size_t>(n) * static_cast<std::size_t>(side) * static_cast<std::size_t>(side) * c;
    for (int y = 0; y < side; ++y) {
      for (int px = 0; px < side; ++px, out += rowWidth) {
        for (int ky = 0; ky < kernel; ++ky) {
          float* dst = out + static_cast<std::size_t>(ky) * static_cast<std::size_t>(kernel) * c;
          const int iy = y + ky - pad;
          if (iy < 0 || iy >= side) {
            std::fill(dst, dst + static_cast<std::size_t>(kernel) * c, 0.0f);
            continue;
          }
          const int kxFirst = std::max(0, pad - px), kxEnd = std::min(kernel, side + pad - px);
          std::fill(dst, dst + static_cast<std::size_t>(kxFirst) * c, 0.0f);
          if (kxEnd > kxFirst) {
            const float* src = image + (static_cast<std::size_t>(iy) * static_cast<std::size_t>(side) +
                                        static_cast<std::size_t>(px + kxFirst - pad)) * c;
            std::copy(src, src + static_cast<std::size_t>(kxEnd - kxFirst) * c, dst + static_cast<std::size_t>(kxFirst) * c);
          }
          std::fill(dst + static_cast<std::size_t>(std::max(kxEnd, kxFirst)) * c, dst + static_cast<std::size_t>(kernel) * c, 0.0f);
        }
      }
    }
  }
}

// A gather, pixel by pixel: the col rows whose windows cover (iy, ix), in ascending (ky, kx)
// order, the order the CUDA kernel adds in (one thread per element), so the two agree to the bit.
void CpuBackend::col2im(const float* col, const ImageShape& shape, int kernel, float* dx) {
  detail::checkImage("col2im", shape, kernel, false);
  const int side = shape.side, pad = kernel / 2;
  const auto c = static_cast<std::size_t>(shape.channels);
  const std::size_t rowWidth = static_cast<std::size_t>(kernel) * static_cast<std::size_t>(kernel) * c;
  float* __restrict out = dx;
  for (int n = 0; n < shape.batch; ++n) {
    for (int iy = 0; iy < side; ++iy) {
      for (int ix = 0; ix < side; ++ix, out += c) {
        std::fill(out, out + c, 0.0f);
        for (int ky = 0; ky < kernel; ++ky) {
          const int y = iy - ky + pad;
          if (y < 0 || y >= side) continue;
          for (int kx = 0; kx < kernel; ++kx) {
            const int px = ix - kx + pad;
            if (px < 0 || px >= side) continue;
            const std::size_t row = (static_cast<std::size_t>(n) * static_cast<std::size_t>(side) + static_cast<std::size_t>(y)) *
                                        static_cast<std::size_t>(side) + static_cast<std::size_t>(px);
            const float* __restrict src = col + row * rowWidth + static_cast<std::size_t>(ky * kernel + kx) * c;
            for (std::size_t ch = 0; ch < c; ++ch) out[ch] += src[ch];
          }
        }
      }
    }
  }
}

void CpuBackend::maxPool2Forward(const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax) {
  detail::checkImage("maxPool2Forward", shape, 1, true);
  const std::size_t outputs = detail::pooledElements(shape);
  for (std::size_t i = 0; i < outputs; ++i) y[i] = detail::maxPool2Element(x, shape, i, argmax[i]);
}

void CpuBackend::maxPool2Backward(const float* dy, const std::uint8_t* argmax, const ImageShape& shape, float* dx) {
  detail::checkImage("maxPool2Backward", shape, 1, true);
  const std::size_t inputs = detail::imageElements(shape);
  for (std::size_t i = 0; i < inputs; ++i) dx[i] = detail::maxPool2BackwardElement(dy, argmax, shape, i);
}

// Per row: max and arg-max (the lowest index wins a tie), then e_c = exp(x_c - max) summed in
// double; loss = log(sum) - (x_label - max). Every label is checked before anything is
// written, and each row's logits are read before its dlogits are written, so dlogits may
// alias logits.
LossStats CpuBackend::softmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows, int classes,
                                          float* dlogits, float gradScale) {
  detail::checkSoftmaxShape(rows, classes);
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= classes) detail::throwBadLabel(r, labels[r], classes);
  }
  const auto width = static_cast<std::size_t>(classes);
  LossStats stats;
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    const float* x = logits + r * width;
    const auto label = static_cast<std::size_t>(labels[r]);
    float maxLogit = x[0];
    std::size_t argMax = 0;
    for (std::size_t c = 1; c < width; ++c) {
      if (x[c] > maxLogit) {
        maxLogit = x[c];
        argMax = c;
      }
    }
    const float labelLogit = x[label];
    double sumExp = 0;
    if (dlogits == nullptr) {
      for (std::size_t c = 0; c < width; ++c) sumExp += static_cast<double>(std::exp(x[c] - maxLogit));
    } else {
      float* d = dlogits + r * width;
      for (std::size_t c = 0; c < width; ++c) {
        d[c] = std::exp(x[c] - maxLogit);  // x[c] is read before d[c] is written
        sumExp += static_cast<double>(d[c]);
      }
      const auto inverseSum = static_cast<float>(1.0 / sumExp);
      for (std::size_t c = 0; c < width; ++c) d[c] = detail::softmaxGrad(d[c], inverseSum, c == label, gradScale);
    }
    stats.lossSum += std::log(sumExp) - (static_cast<double>(labelLogit) - static_cast<double>(maxLogit));
    stats.correct += argMax == label ? 1 : 0;
  }
  return stats;
}

}  // namespace

std::unique_ptr<Backend> makeCpuBackend(int blasThreads) { return std::make_unique<CpuBackend>(blasThreads); }

}  // namespace meridian::kernels
