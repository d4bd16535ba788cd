// Backend: the memory and math of one device, behind one interface, so the trainer is
// written once for CPU and GPU. The CPU backend (backend_cpu.cc, GEMM through OpenBLAS) is
// the reference; the CUDA backend (backend_cuda.cu, GEMM through cuBLAS) is its twin and is
// checked against it element by element (tests/kernels/backend_parity_test.cc, label gpu).
//
// Memory: every pointer passed to a math call lives in the backend's memory (host memory
// for CPU, device memory for CUDA) and comes from alloc(). Matrices are row-major.
//
// Ordering: math calls and copies run in issue order on the backend's compute stream
// (CUDA: asynchronously; CPU: at once on the caller's thread). Calls that hand data to the
// host (copyToHost, loss(), waitStaged) wait for the work they depend on. A backend is used
// by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "kernels/image_shape.h"

namespace meridian::kernels {

enum class Device : std::uint8_t { kCpu, kCuda };
enum class Activation : std::uint8_t { kRelu, kGelu };  // GELU: the tanh approximation

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.9f;     // v = momentum * v + (g + weightDecay * w); w -= lr * v
  float weightDecay = 0.0f;  // L2 added to the gradient
  bool nesterov = false;     // w -= lr * (g' + momentum * v) with g' = g + weightDecay * w
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0.01f;  // decoupled: w -= lr * weightDecay * w, before the Adam update
};

// Sum of the per-row cross-entropy losses and the number of rows whose arg-max logit is
// the label (ties: the lowest index wins).
struct LossStats {
  double lossSum = 0;
  std::int64_t correct = 0;
};


class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // "cpu (OpenBLAS, 1 thread)", "cuda:0 (NVIDIA H200, sm_90)".
  virtual std::string describe() const = 0;

  // ---- Memory ----------------------------------------------------------------------
  // `bytes` of zeroed backend memory, aligned to 256 bytes; throws std::bad_alloc.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void free(void* p) = 0;  // null is fine
  // Host <-> backend copies; both wait until the copy is done (copyToHost also waits for
  // the compute work issued before it).
  virtual void copyToDevice(void* dst, const void* hostSrc, std::size_t bytes) = 0;
  virtual void copyToHost(void* hostDst, const void* src, std::size_t bytes) = 0;
  // Waits for all work issued so far.
  virtual void synchronize() = 0;

  // ---- Staging for communication ------------------------------------------------------
  // Page-locked host memory (CUDA: cudaHostAlloc; CPU: ordinary aligned memory).
  virtual void* allocHost(std::size_t bytes) = 0;
  virtual void freeHost(void* p) = 0;
  // Copies `bytes` from backend memory to host memory on a separate copy stream, after the
  // compute work issued so far (CUDA: an event on the compute stream orders it), without
  // blocking the caller or later compute. Returns a ticket for waitStaged.
  virtual std::uint64_t stageToHost(void* hostDst, const void* src, std::size_t bytes) = 0;
  // Blocks until the copy of `ticket` (and every earlier one) landed in host memory. May be
  // called from one other thread while the owning thread keeps issuing work.
  virtual void waitStaged(std::uint64_t ticket) = 0;
  // Host to backend memory, ordered before any compute issued after it; the host buffer
  // may be reused when this returns.
  virtual void stageToDevice(void* dst, const void* hostSrc, std::size_t bytes) = 0;

  // ---- Math ------------------------------------------------------------------------
  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n; lda/ldb/ldc are
  // the row strides of A, B, C as stored (before op).
  virtual void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) = 0;
  // y[r][c] += bias[c] for a rows x cols matrix.
  virtual void addBias(float* y, const float* bias, int rows, int cols) = 0;
  // dbias[c] = sum over rows of dy[r][c] (overwrites dbias).
  virtual void biasGrad(const float* dy, float* dbias, int rows, int cols) = 0;
  // y = act(x); may be in place.
  virtual void activationForward(Activation act, const float* x, float* y, std::size_t n) = 0;
  // dx = dy * act'(x) where x is the activation's input; dx may equal dy.
  virtual void activationBackward(Activation act, const float* x, const float* dy, float* dx, std::size_t n) = 0;
  // Convolution as GEMM (a kernel x kernel window, stride 1, zero padding kernel / 2, so the
  // output keeps the input's side; kernel odd). im2col writes one row per output pixel,
  // [batch * side * side x kernel * kernel * channels], its columns ordered (ky, kx, c):
  // col[(n, y, x)][(ky * kernel + kx) * channels + c] = x[n][y + ky - pad][x + kx - pad][c],
  // 0 outside the image. A convolution is then gemm(col, W [kernel^2 * channels x out]).
  virtual void im2col(const float* x, const ImageShape& shape, int kernel, float* col) = 0;
  // The adjoint of im2col: dx (shape, overwritten) receives for each pixel the sum of the col
  // entries im2col copied from it, added in ascending (ky, kx) order.
  virtual void col2im(const float* col, const ImageShape& shape, int kernel, float* dx) = 0;
  // 2 x 2 max pooling, stride 2 (side even): y is [batch, side / 2, side / 2, channels];
  // argmax[i] is the window slot (2 * dy + dx, 0..3) of y[i]'s maximum, the first slot on a tie.
  virtual void maxPool2Forward(const float* x, const ImageShape& shape, float* y, std::uint8_t* argmax) = 0;
  // dx (shape, overwritten) = dy routed to the slot argmax names, 0 elsewhere.
  virtual void maxPool2Backward(const float* dy, const std::uint8_t* argmax, const ImageShape& shape, float* dx) = 0;
  // Softmax cross-entropy over the rows of logits [rows x classes] against labels (int32,
  // backend memory, each in [0, classes)). When dlogits is not null it receives
  // (softmax - onehot) * gradScale (may equal logits). Returns the loss sum and correct
  // count (waits for the result).
  virtual LossStats softmaxCrossEntropy(const float* logits, const std::int32_t* labels, int rows, int classes,
                                        float* dlogits, float gradScale) = 0;
  // One optimizer step over n parameters; velocity/moments are the caller's state buffers
  // (zeroed at start). `step` counts AdamW steps from 1 (bias correction).
  virtual void sgdStep(float* w, const float* g, float* velocity, std::size_t n, const SgdParams& p) = 0;
  virtual void adamwStep(float* w, const float* g, float* m, float* v, std::size_t n, const AdamWParams& p,
                         std::int64_t step) = 0;
  // x *= factor.
  virtual void scale(float* x, std::size_t n, float factor) = 0;
  // y += alpha * x.
  virtual void axpy(float alpha, const float* x, float* y, std::size_t n) = 0;
  // out = a - b (out may equal a or b).
  virtual void subtract(const float* a, const float* b, float* out, std::size_t n) = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  // dst += src, element-wise (the reduction for device buffers).
  virtual void accumulate(float* dst, const float* src, std::size_t n) = 0;
  // Gradients on the wire: f32 <-> bf16 / f16, rounding to nearest even (kernels/reduce.h
  // is the scalar reference).
  virtual void castToBF16(const float* src, std::uint16_t* dst, std::size_t n) = 0;
  virtual void castFromBF16(const std::uint16_t* src, float* dst, std::size_t n) = 0;
  virtual void castToF16(const float* src, std::uint16_t* dst, std::size_t n) = 0;
  virtual void castFromF16(const std::uint16_t* src, float* dst, std::size_t n) = 0;
};

// The reference backend. BLAS threads: `blasThreads` (0: leave OpenBLAS's default).
std::unique_ptr<Backend> makeCpuBackend(int blasThreads = 1);

// True when Meridian was built with CUDA and a device is visible.
bool cudaAvailable();
// The CUDA backend on device `ordinal`; kInvalidArgument naming the reason when Meridian
// was built without CUDA or the device is missing.
Result<std::unique_ptr<Backend>> makeCudaBackend(int ordinal = 0);

}  // namespace meridian::kernels
