// The classifier: an MLP (dense layers with an activation between them), optionally behind a
// few convolution blocks (a small CNN), with softmax cross-entropy on top, computed on a
// kernels::Backend (CPU or CUDA) from one flat parameter buffer and one flat gradient buffer.
//
// A convolution block is a 5 x 5 convolution (stride 1, zero padding 2, so the side is
// kept), bias, the activation, then 2 x 2 max pooling that halves the side. Images are
// square, channels last (NHWC); the input is one channel of side sqrt(inputs). Convolutions
// run as im2col + GEMM, so they use the same GEMM, bias and activation kernels as the dense
// layers. After the last block, the pooled tensor is the first dense layer's input row.
//
// Layout: parameters are stored last layer first ([W_{L-1}, b_{L-1}, ..., W_0, b_0], a
// dense W_l row-major [in x out], a convolution's [5 * 5 * in_channels x out_channels] with
// rows in (ky, kx, c) order), so backward produces the gradient buffer front to back and a
// gradient bucket is a contiguous range that is complete once backward passed the lowest
// layer it touches (paramOffset / layerEnd say where each layer is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/backend.h"

namespace meridian::trainer {

constexpr int kConvKernel = 5;

struct ModelConfig {
  std::vector<int> widths{784, 1024, 1024, 10};  // input, dense hidden..., classes
  std::vector<int> convChannels;                 // output channels of each conv block; empty: an MLP
  kernels::Activation activation = kernels::Activation::kRelu;
};

// "784-1024-1024-10" (an MLP) or "784-c16-c32-128-10" (two conv blocks of 16 and 32
// channels, then dense layers): widths and channels in 1..65536, conv blocks right after
// the input, and a square input whose side each block can halve. Sets widths and
// convChannels of *config and leaves its activation alone.
Status parseModel(const std::string& text, ModelConfig* config);
// The text parseModel reads back.
std::string formatModel(const ModelConfig& config);
// Whether a config describes a model this class can build (what parseModel checks).
Status validateModel(const ModelConfig& config);

class Model {
 public:
  // Allocates parameters, gradients and activations for batches of up to maxBatch rows,
  // and initialises the weights from `seed` (Glorot-uniform, biases zero; the same on every
  // backend and every rank). Throws std::invalid_argument for a config validateModel refuses
  // or a batch under one row (a set-up entry point; code that returns Status calls create).
  Model(kernels::Backend& backend, ModelConfig config, int maxBatch, std::uint64_t seed);
  // The same without throwing: kInvalidArgument for what the constructor refuses, and for
  // a model the backend has no memory for.
  static Result<std::unique_ptr<Model>> create(kernels::Backend& backend, ModelConfig config, int maxBatch,
                                               std::uint64_t seed);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  int layers() const { return static_cast<int>(layers_.size()); }
  bool isConv(int layer) const { return layers_[static_cast<std::size_t>(layer)].conv; }
  std::size_t paramCount() const { return paramCount_; }
  int maxBatch() const { return maxBatch_; }
  int inputs() const { return config_.widths.front(); }
  int classes() const { return config_.widths.back(); }
  // Element offset of layer l's weights in the flat buffers; its bias follows them, and
  // layerEnd(l) is one past the bias. Layer L-1 starts at 0.
  std::size_t paramOffset(int layer) const { return layers_[static_cast<std::size_t>(layer)].offset; }
  std::size_t layerEnd(int layer) const;

  // Backend memory.
  float* params() { return params_; }
  const float* params() const { return params_; }
  float* grads() { return grads_; }
  // Input rows (rows x inputs) and labels for the next forward, in backend memory.
  float* input() { return input_; }
  std::int32_t* labels() { return labels_; }

  // Forward over the first `rows` inputs (1..maxBatch(); CheckError otherwise, a caller's
  // bug); the loss of the batch (mean cross-entropy is lossSum / rows) and correct
  // predictions.
  kernels::LossStats forward(int rows);
  // Forward then backward of the mean loss over `rows` rows, scaled by gradScale (1 for the
  // plain mean). onLayerDone(l) is called as soon as layer l's gradients are written (l
  // from L-1 down to 0), on this thread, with the work queued on the backend's stream.
  kernels::LossStats forwardBackward(int rows, float gradScale, const std::function<void(int)>& onLayerDone);

 private:
  struct Layer {
    bool conv = false;
    int in = 0, out = 0;  // dense: features; conv: channels
    int side = 0;         // conv: the input's side (and the convolution's output side)
    std::size_t offset = 0;
    std::size_t weights() const;  // weight elements (the bias adds `out`)
    std::size_t outPerRow() const;  // one example's output (conv: after pooling)
  };

  // Every layer's output for the first `rows` inputs (logits in pre_.back()).
  void forwardLayers(int rows);
  void convForward(int l, const float* x, int rows);
  // Layer l's weight and bias gradients from d (its output's gradient); for l > 0 also the
  // gradient of its input, into `next`.
  void convBackward(int l, const float* d, int rows, float* next, const std::function<void(int)>& onLayerDone);
  void denseBackward(int l, const float* d, int rows, float* next, const std::function<void(int)>& onLayerDone);
  const float* layerInput(int l) const { return l > 0 ? post_[static_cast<std::size_t>(l) - 1] : input_; }

  kernels::Backend& backend_;
  ModelConfig config_;
  int maxBatch_;
  std::vector<Layer> layers_;
  std::size_t paramCount_ = 0;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* input_ = nullptr;
  std::int32_t* labels_ = nullptr;
  std::vector<float*> pre_;    // [l]: layer l's output before the activation (conv: before pooling)
  std::vector<float*> post_;   // [l]: the input of layer l + 1 (hidden layers only)
  std::vector<float*> act_;    // [l], conv: after the activation, before pooling; in backward its gradient
  std::vector<std::uint8_t*> argmax_;  // [l], conv: the pooling's window slots
  float* col_ = nullptr;       // im2col rows of one conv layer (the widest), or their gradient
  int colLayer_ = -1;          // the layer whose input col_ holds, -1 when none
  float* delta_[2] = {nullptr, nullptr};  // ping-pong gradients w.r.t. layer outputs
};

}  // namespace meridian::trainer
