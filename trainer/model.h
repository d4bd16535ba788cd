// The MLP classifier: dense layers with an activation between them and softmax
// cross-entropy on top, computed on a kernels::Backend (CPU or CUDA) from one flat
// parameter buffer and one flat gradient buffer.
//
// Layout: parameters are stored last layer first ([W_{L-1}, b_{L-1}, ..., W_0, b_0], W_l
// row-major [in x out]), so backward produces the gradient buffer front to back and a
// gradient bucket is a contiguous range that is complete once backward passed the lowest
// layer it touches (paramOffset / layerEnd say where each layer is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/backend.h"

namespace meridian::trainer {

struct ModelConfig {
  std::vector<int> widths{784, 1024, 1024, 10};  // input, hidden..., classes
  kernels::Activation activation = kernels::Activation::kRelu;
};

// "784-1024-1024-10" -> widths; at least two numbers, each in 1..65536.
Result<std::vector<int>> parseWidths(const std::string& text);
std::string formatWidths(const std::vector<int>& widths);

class Mlp {
 public:
  // Allocates parameters, gradients and activations for batches of up to maxBatch rows,
  // and initialises the weights from `seed` (Kaiming-uniform, biases zero; the same on
  // every backend and every rank).
  Mlp(kernels::Backend& backend, ModelConfig config, int maxBatch, std::uint64_t seed);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const ModelConfig& config() const { return config_; }
  int layers() const { return static_cast<int>(config_.widths.size()) - 1; }
  std::size_t paramCount() const { return paramCount_; }
  int maxBatch() const { return maxBatch_; }
  int inputs() const { return config_.widths.front(); }
  int classes() const { return config_.widths.back(); }
  // Element offset of layer l's weights in the flat buffers; its bias follows them, and
  // layerEnd(l) is one past the bias. Layer L-1 starts at 0.
  std::size_t paramOffset(int layer) const { return offsets_[static_cast<std::size_t>(layer)]; }
  std::size_t layerEnd(int layer) const;

  // Backend memory.
  float* params() { return params_; }
  const float* params() const { return params_; }
  float* grads() { return grads_; }
  // Input rows (rows x inputs) and labels for the next forward, in backend memory.
  float* input() { return input_; }
  std::int32_t* labels() { return labels_; }

  // Forward over the first `rows` inputs; the loss of the batch (mean cross-entropy is
  // lossSum / rows) and correct predictions.
  kernels::LossStats forward(int rows);
  // Forward then backward of the mean loss over `rows` rows, scaled by gradScale (1 for the
  // plain mean). onLayerDone(l) is called as soon as layer l's gradients are written (l
  // from L-1 down to 0), on this thread, with the work queued on the backend's stream.
  kernels::LossStats forwardBackward(int rows, float gradScale, const std::function<void(int)>& onLayerDone);

 private:
  // Every layer's output for the first `rows` inputs (logits in pre_.back()).
  void forwardLayers(int rows);

  kernels::Backend& backend_;
  ModelConfig config_;
  int maxBatch_;
  std::size_t paramCount_ = 0;
  std::vector<std::size_t> offsets_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* input_ = nullptr;
  std::int32_t* labels_ = nullptr;
  std::vector<float*> pre_;   // [l]: layer l's output before the activation (rows x out)
  std::vector<float*> post_;  // [l]: after the activation (hidden layers only)
  float* delta_[2] = {nullptr, nullptr};  // ping-pong gradients w.r.t. layer outputs
};

}  // namespace meridian::trainer
