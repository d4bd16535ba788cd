// The CUDA backend: backend_cpu.cc's twin on one GPU. GEMM goes through cuBLAS (plain FP32,
// no TF32, so it matches OpenBLAS to rounding); the other ops are the kernels of
// backend_cuda_kernels.cu. tests/kernels/backend_parity_test.cc holds it to the CPU backend.
//
// Streams: math and copies run in order on the compute stream; stageToHost copies run on a
// second (copy) stream, each behind an event recorded on the compute stream, so gradients
// travel to the host while later compute runs. A backend is owned by its creator and used
// by one thread at a time, any thread: each call makes the backend's device current.
// Every CUDA call is checked; a failure throws std::runtime_error naming the call.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/backend_checks.h"
#include "kernels/backend_cuda_kernels.h"

namespace meridian::kernels {
namespace {

// ---- Error checks and owners ---------------------------------------------------------

void checkCuda(cudaError_t err, const std::string& call) {
  if (err != cudaSuccess) {
    throw std::runtime_error("meridian::kernels: " + call + " failed: " + cudaGetErrorString(err));
  }
}

void checkCublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("meridian::kernels: ") + call + " failed: " + cublasGetStatusString(status));
  }
}

#define MERIDIAN_CUDA_CHECK(call) checkCuda((call), #call)
#define MERIDIAN_CUBLAS_CHECK(call) checkCublas((call), #call)

// Deleters run in destructors, where an error can only be dropped.
struct StreamDeleter {
  void operator()(cudaStream_t s) const { static_cast<void>(cudaStreamDestroy(s)); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const { static_cast<void>(cudaEventDestroy(e)); }
};
struct CublasDeleter {
  void operator()(cublasHandle_t h) const { static_cast<void>(cublasDestroy(h)); }
};
struct DeviceMemoryDeleter {
  void operator()(void* p) const { static_cast<void>(cudaFree(p)); }
};
struct HostMemoryDeleter {
  void operator()(void* p) const { static_cast<void>(cudaFreeHost(p)); }
};
using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using EventPtr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
using CublasPtr = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter>;
using DeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;
using HostMemory = std::unique_ptr<void, HostMemoryDeleter>;

StreamPtr makeStream() {
  cudaStream_t s = nullptr;
  MERIDIAN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamPtr(s);
}

EventPtr makeEvent() {
  cudaEvent_t e = nullptr;
  MERIDIAN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventPtr(e);
}

// cudaMalloc / cudaHostAlloc result: out of memory is std::bad_alloc (Backend's contract).
void checkAlloc(cudaError_t err, const char* call) {
  if (err == cudaErrorMemoryAllocation) {
    static_cast<void>(cudaGetLastError());
    throw std::bad_alloc();
  }
  checkCuda(err, call);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int ordinal) : device_(ordinal) {
    MERIDIAN_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    MERIDIAN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = "cuda:" + std::to_string(device_) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ")";
    compute_ = makeStream();
    copy_ = makeStream();
    computeDone_ = makeEvent();
    // A few resident blocks per SM; grid-stride loops cover the rest.
    launch_ = cuda::Launch{compute_.get(), static_cast<std::size_t>(std::max(prop.multiProcessorCount, 1)) * 8};
    cublasHandle_t handle = nullptr;
    MERIDIAN_CUBLAS_CHECK(cublasCreate(&handle));
    blas_.reset(handle);
    MERIDIAN_CUBLAS_CHECK(cublasSetStream(handle, compute_.get()));
    // Plain FP32: no TF32 tensor cores, so results match the CPU backend to rounding.
    MERIDIAN_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    void* totals = nullptr;
    checkAlloc(cudaMalloc(&totals, sizeof(cuda::SoftmaxTotals)), "cudaMalloc");
    deviceTotals_.reset(totals);
    checkAlloc(cudaHostAlloc(&totals, sizeof(cuda::SoftmaxTotals), cudaHostAllocDefault), "cudaHostAlloc");
    hostTotals_.reset(totals);
  }

  ~CudaBackend() override {
    // Let queued work finish before its streams and buffers go; errors can only be dropped.
    static_cast<void>(cudaSetDevice(device_));
    static_cast<void>(cudaStreamSynchronize(compute_.get()));
    static_cast<void>(cudaStreamSynchronize(copy_.get()));
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::kCuda; }
  std::string describe() const override { return name_; }

  // ---- Memory ----

  void* alloc(std::size_t bytes) override {
    use();
    void* p = nullptr;
    checkAlloc(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc");  // 256-byte aligned
    // Zeroed in stream order, before any work issued after this call.
    if (bytes > 0) MERIDIAN_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_.get()));
    return p;
  }

  void free(void* p) override {
    if (p == nullptr) return;
    use();
    MERIDIAN_CUDA_CHECK(cudaFree(p));  // synchronises the device first, so no kernel still uses p
  }

  void copyToDevice(void* dst, const void* hostSrc, std::size_t bytes) override {
    copyOnCompute(dst, hostSrc, bytes, cudaMemcpyHostToDevice);
  }
  void copyToHost(void* hostDst, const void* src, std::size_t bytes) override {
    copyOnCompute(hostDst, src, bytes, cudaMemcpyDeviceToHost);
  }

  void synchronize() override {
    use();
    MERIDIAN_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    MERIDIAN_CUDA_CHECK(cudaStreamSynchronize(copy_.get()));
  }

  // ---- Staging ----

  void* allocHost(std::size_t bytes) override {
    use();
    void* p = nullptr;
    checkAlloc(cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(p, 0, bytes);
    return p;
  }

  void freeHost(void* p) override {
    if (p == nullptr) return;
    use();
    MERIDIAN_CUDA_CHECK(cudaFreeHost(p));
  }

  // Overlaps later compute when hostDst is page-locked (allocHost); into pageable memory CUDA
  // finishes the copy before returning. Later compute must not overwrite src before the
  // copy landed (waitStaged).
  std::uint64_t stageToHost(void* hostDst, const void* src, std::size_t bytes) override {
    use();
    std::lock_guard<std::mutex> lock(stagedMu_);
    EventPtr landed = takeEvent();
    if (bytes > 0) {
      MERIDIAN_CUDA_CHECK(cudaEventRecord(computeDone_.get(), compute_.get()));
      MERIDIAN_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), computeDone_.get(), 0));
      MERIDIAN_CUDA_CHECK(cudaMemcpyAsync(hostDst, src, bytes, cudaMemcpyDeviceToHost, copy_.get()));
    }
    MERIDIAN_CUDA_CHECK(cudaEventRecord(landed.get(), copy_.get()));
    staged_.push_back(Staged{++lastTicket_, std::move(landed)});
    return lastTicket_;
  }

  // The copy stream runs in order, so the newest copy at or before `ticket` covers the rest.
  // Called from a thread of its own (the trainer's launcher) while the owner keeps staging:
  // the bookkeeping is locked, the wait is not.
  void waitStaged(std::uint64_t ticket) override {
    cudaEvent_t newest = nullptr;
    {
      std::lock_guard<std::mutex> lock(stagedMu_);
      if (ticket > lastTicket_) {
        detail::throwInvalid("waitStaged: ticket " + std::to_string(ticket) + " was never issued (last " +
                             std::to_string(lastTicket_) + ")");
      }
      for (const Staged& s : staged_)
        if (s.ticket <= ticket) newest = s.landed.get();
    }
    if (newest == nullptr) return;  // already waited for
    use();
    MERIDIAN_CUDA_CHECK(cudaEventSynchronize(newest));
    std::lock_guard<std::mutex> lock(stagedMu_);
    while (!staged_.empty() && staged_.front().ticket <= ticket) {
      spareEvents_.push_back(std::move(staged_.front().landed));
      staged_.pop_front();
    }
  }

  // On the compute stream, after the work issued before it (which may still read dst), and
  // waited for: the host buffer is free again when this returns.
  void stageToDevice(void* dst, const void* hostSrc, std::size_t bytes) override {
    copyOnCompute(dst, hostSrc, bytes, cudaMemcpyHostToDevice);
  }

  // ---- Math ----

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same buffers with
  // the operands swapped and m and n exchanged; the row strides become leading dimensions.
  void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
            int ldb, float beta, float* c, int ldc) override {
    detail::checkGemm(transA, transB, m, n, k, lda, ldb, ldc);
    if (m == 0 || n == 0) return;
    use();
    MERIDIAN_CUBLAS_CHECK(cublasSgemm(blas_.get(), transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      transA ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta, c,
                                      ldc));
  }

  void addBias(float* y, const float* bias, int rows, int cols) override {
    detail::checkShape("addBias", rows, cols);
    launched(cuda::addBias(on(), y, bias, rows, cols), "addBias");
  }

  void biasGrad(const float* dy, float* dbias, int rows, int cols) override {
    detail::checkShape("biasGrad", rows, cols);
    launched(cuda::biasGrad(on(), dy, dbias, rows, cols), "biasGrad");
  }

  void activationForward(Activation act, const float* x, float* y, std::size_t n) override {
    launched(cuda::activationForward(on(), act == Activation::kGelu, x, y, n), "activationForward");
  }

  void activationBackward(Activation act, const float* x, const float* dy, float* dx, std::size_t n) override {
    launched(cuda::activationBackward(on(), act == Activation::kGelu, x, dy, dx, n), "activationBackward");
  }

  void im2col(const float* x, const ImageShape& shape, int kernel, float* col) override {
    detail::checkImage("im2col", shape, kernel, false);
    launched(cuda::im2col(on(), x, shape, kernel, col), "im2col");
  }
  void col2im(const float* col, const ImageShape& shape, int kernel, float* dx) override {
    detail::checkImage("col2im", shape, kernel, false);
    launched(cuda::col2im(on(), col, shape, kernel, dx), "col2im");
  }
  void maxPool2Forward(const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax) override {
    detail::checkImage("maxPool2Forward", shape, 1, true);
    launched(cuda::maxPool2Forward(on(), x, shape, y, argmax), "maxPool2Forward");
  }
  void maxPool2Backward(const float* dy, const std::uint8_t* argmax, const ImageShape& shape, float* dx) override {
    detail::checkImage("maxPool2Backward", shape, 1, true);
    launched(cuda::maxPool2Backward(on(), dy, argmax, shape, dx), "maxPool2Backward");
  }

  LossStats softmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows, int classes,
                                float* dlogits, float gradScale) override;

  void sgdStep(float* w, const float* g, float* velocity, std::size_t n, const SgdParams& p) override {
    launched(cuda::sgdStep(on(), w, g, velocity, n, p.lr, p.momentum, p.weightDecay, p.nesterov), "sgdStep");
  }

  void adamwStep(float* w, const float* g, float* m, float* v, std::size_t n, const AdamWParams& p,
                 std::int64_t step) override {
    const detail::AdamWStepFactors f = detail::adamwStepFactors(p, step);
    launched(cuda::adamwStep(on(), w, g, m, v, n, f), "adamwStep");
  }

  void scale(float* x, std::size_t n, float factor) override { launched(cuda::scale(on(), x, n, factor), "scale"); }
  void axpy(float alpha, const float* x, float* y, std::size_t n) override {
    launched(cuda::axpy(on(), alpha, x, y, n), "axpy");
  }
  void subtract(const float* a, const float* b, float* out, std::size_t n) override {
    launched(cuda::subtract(on(), a, b, out, n), "subtract");
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (n == 0 || dst == src) return;
    use();
    MERIDIAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, compute_.get()));
  }
  void accumulate(float* dst, const float* src, std::size_t n) override {
    launched(cuda::accumulate(on(), dst, src, n), "accumulate");
  }

  void castToBF16(const float* src, std::uint16_t* dst, std::size_t n) override {
    launched(cuda::castToBF16(on(), src, dst, n), "castToBF16");
  }
  void castFromBF16(const std::uint16_t* src, float* dst, std::size_t n) override {
    launched(cuda::castFromBF16(on(), src, dst, n), "castFromBF16");
  }
  void castToF16(const float* src, std::uint16_t* dst, std::size_t n) override {
    launched(cuda::castToF16(on(), src, dst, n), "castToF16");
  }
  void castFromF16(const std::uint16_t* src, float* dst, std::size_t n) override {
    launched(cuda::castFromF16(on(), src, dst, n), "castFromF16");
  }

 private:
  struct Staged {
    std::uint64_t ticket;
    EventPtr landed;  // recorded on the copy stream after the ticket's copy
  };

  // Makes this backend's device current on the calling thread.
  void use() const { MERIDIAN_CUDA_CHECK(cudaSetDevice(device_)); }

  // The launch settings, with the device made current.
  const cuda::Launch& on() const {
    use();
    return launch_;
  }

  static void launched(cudaError_t err, const char* op) { checkCuda(err, std::string(op) + " kernel launch"); }

  // Queued behind the compute stream's work and waited for.
  void copyOnCompute(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    use();
    MERIDIAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, compute_.get()));
    MERIDIAN_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }

  EventPtr takeEvent() {
    if (spareEvents_.empty()) return makeEvent();
    EventPtr e = std::move(spareEvents_.back());
    spareEvents_.pop_back();
    return e;
  }

  void reserveScratch(int rows) {
    if (rows <= scratchRows_) return;
    const int grown = std::max(rows, scratchRows_ * 2);
    void* p = nullptr;
    checkAlloc(cudaMalloc(&p, cuda::softmaxScratchBytes(grown)), "cudaMalloc");
    scratch_.reset(p);  // cudaFree synchronises the device, so the old scratch is idle
    scratchRows_ = grown;
  }

  int device_;
  std::string name_;
  StreamPtr compute_;
  StreamPtr copy_;
  EventPtr computeDone_;  // re-recorded on the compute stream by each stageToHost
  cuda::Launch launch_{};
  CublasPtr blas_;
  std::mutex stagedMu_;  // stageToHost and waitStaged may run on two threads
  std::uint64_t lastTicket_ = 0;
  std::deque<Staged> staged_;  // copies not yet waited for, oldest first
  std::vector<EventPtr> spareEvents_;
  DeviceMemory scratch_;  // softmaxCrossEntropy's per-row results
  int scratchRows_ = 0;
  DeviceMemory deviceTotals_;  // cuda::SoftmaxTotals
  HostMemory hostTotals_;      // page-locked copy of it
};

LossStats CudaBackend::softmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows, int classes,
                                           float* dlogits, float gradScale) {
  detail::checkSoftmaxShape(rows, classes);
  if (rows == 0) return LossStats{};
  use();
  reserveScratch(rows);
  auto* deviceTotals = static_cast<cuda::SoftmaxTotals*>(deviceTotals_.get());
  launched(cuda::softmaxCrossEntropy(launch_, logits, labels, rows, classes, dlogits, gradScale, scratch_.get(),
                                     deviceTotals),
           "softmaxCrossEntropy");
  auto* totals = static_cast<cuda::SoftmaxTotals*>(hostTotals_.get());
  copyOnCompute(totals, deviceTotals, sizeof(cuda::SoftmaxTotals), cudaMemcpyDeviceToHost);
  if (totals->firstBadRow != cuda::kNoBadRow) {
    // The kernel skipped that row; name it and its label the way the CPU backend does.
    std::int32_t label = 0;
    copyOnCompute(&label, labels + totals->firstBadRow, sizeof(label), cudaMemcpyDeviceToHost);
    detail::throwBadLabel(totals->firstBadRow, label, classes);
  }
  return LossStats{totals->lossSum, static_cast<std::int64_t>(totals->correct)};
}

}  // namespace

// The entry points backend_loader.cc finds with dlsym (this file is built into
// libmeridian_kernels_cuda.so, loaded only when a CUDA backend is asked for).
extern "C" __attribute__((visibility("default"))) int meridianCudaDeviceCount(char* error, std::size_t errorBytes) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // a missing driver is an answer here, not a fault
    std::snprintf(error, errorBytes, "cudaGetDeviceCount failed: %s", cudaGetErrorString(err));
    return -1;
  }
  return count;
}

extern "C" __attribute__((visibility("default"))) Backend* meridianMakeCudaBackend(int ordinal, char* error,
                                                                                std::size_t errorBytes) {
  try {
    return new CudaBackend(ordinal);
  } catch (const std::exception& e) {
    std::snprintf(error, errorBytes, "%s", e.what());
    return nullptr;
  }
}

}  // namespace meridian::kernels
