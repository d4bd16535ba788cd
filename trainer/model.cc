#include "trainer/model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <new>
#include <random>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"

namespace meridian::trainer {
namespace {

constexpr int kMaxWidth = 65536;

Status invalidModel(const std::string& what) { return Status(StatusCode::kInvalidArgument, what); }

// The side of a square image of `inputs` pixels, or 0 when it is not square.
int squareSide(int inputs) {
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(inputs))));
  return side * side == inputs ? side : 0;
}

std::size_t elems(std::size_t a, std::size_t b) { return a * b; }

}  // namespace

Status validateModel(const ModelConfig& config) {
  const std::string text = formatModel(config);
  if (config.widths.size() < 2)
    return invalidModel(fmt::format("model '{}': need at least inputs and classes, e.g. 784-1024-10", text));
  for (const int v : config.widths)
    if (v < 1 || v > kMaxWidth) return invalidModel(fmt::format("model '{}': width {} is not in 1..{}", text, v, kMaxWidth));
  for (const int c : config.convChannels)
    if (c < 1 || c > kMaxWidth) return invalidModel(fmt::format("model '{}': {} channels is not in 1..{}", text, c, kMaxWidth));
  if (config.convChannels.empty()) return Status();
  int side = squareSide(config.widths.front());
  if (side == 0)
    return invalidModel(fmt::format("model '{}': conv blocks need a square one-channel image, and {} inputs is not "
                                    "a square number",
                                    text, config.widths.front()));
  for (std::size_t i = 0; i < config.convChannels.size(); ++i) {
    if (side % 2 != 0)
      return invalidModel(fmt::format("model '{}': conv block {} gets an image of side {}, which 2 x 2 pooling "
                                      "cannot halve; use fewer blocks",
                                      text, i + 1, side));
    side /= 2;
  }
  const std::size_t flat = elems(static_cast<std::size_t>(side) * static_cast<std::size_t>(side),
                                 static_cast<std::size_t>(config.convChannels.back()));
  if (flat > static_cast<std::size_t>(kMaxWidth) * 16)
    return invalidModel(fmt::format("model '{}': the last conv block leaves {} features per example; use fewer "
                                    "channels or more blocks",
                                    text, flat));
  return Status();
}

Status parseModel(const std::string& text, ModelConfig* config) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == '-') parts.emplace_back();
    else parts.back() += c;
  }
  ModelConfig parsed;
  parsed.widths.clear();
  parsed.activation = config->activation;
  for (const std::string& part : parts) {
    const bool conv = !part.empty() && part.front() == 'c';
    const char* begin = part.data() + (conv ? 1 : 0);
    int v = 0;
    auto [end, ec] = std::from_chars(begin, part.data() + part.size(), v);
    if (ec != std::errc() || end != part.data() + part.size() || v < 1 || v > kMaxWidth)
      return invalidModel(fmt::format("model '{}': '{}' is not a width in 1..{} (or cN, a conv block of N channels)",
                                      text, part, kMaxWidth));
    if (conv) {
      if (parsed.widths.size() != 1)
        return invalidModel(fmt::format("model '{}': conv blocks ('{}') go right after the input, before any dense "
                                        "layer, e.g. 784-c16-c32-128-10",
                                        text, part));
      parsed.convChannels.push_back(v);
    } else {
      parsed.widths.push_back(v);
    }
  }
  if (parsed.widths.size() < 2)
    return invalidModel(fmt::format("model '{}': need at least inputs and classes, e.g. 784-1024-10", text));
  MERIDIAN_RETURN_IF_ERROR(validateModel(parsed));
  *config = std::move(parsed);
  return Status();
}

std::string formatModel(const ModelConfig& config) {
  std::string out;
  for (std::size_t i = 0; i < config.widths.size(); ++i) {
    if (i > 0) out += '-';
    out += std::to_string(config.widths[i]);
    if (i == 0)
      for (const int c : config.convChannels) out += fmt::format("-c{}", c);
  }
  return out;
}

std::size_t Model::Layer::weights() const {
  const std::size_t taps = conv ? static_cast<std::size_t>(kConvKernel * kConvKernel) : 1;
  return taps * static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
}

std::size_t Model::Layer::outPerRow() const {
  if (!conv) return static_cast<std::size_t>(out);
  const auto half = static_cast<std::size_t>(side / 2);
  return half * half * static_cast<std::size_t>(out);
}

Model::Model(kernels::Backend& backend, ModelConfig config, int maxBatch, std::uint64_t seed)
    : backend_(backend), config_(std::move(config)), maxBatch_(maxBatch) {
  if (const Status st = validateModel(config_); !st.isOk()) throw std::invalid_argument(st.message());
  if (maxBatch < 1) throw std::invalid_argument("Model: need a batch of at least one row");
  // The layers, first to last: conv blocks, then dense layers.
  int side = squareSide(inputs()), channels = 1;
  for (const int c : config_.convChannels) {
    layers_.push_back(Layer{.conv = true, .in = channels, .out = c, .side = side});
    channels = c;
    side /= 2;
  }
  for (std::size_t i = 0; i + 1 < config_.widths.size(); ++i) {
    const int in = i == 0 && !layers_.empty() ? side * side * channels : config_.widths[i];
    layers_.push_back(Layer{.conv = false, .in = in, .out = config_.widths[i + 1]});
  }
  const int n = layers();
  std::size_t off = 0;
  for (int l = n - 1; l >= 0; --l) {
    Layer& layer = layers_[static_cast<std::size_t>(l)];
    layer.offset = off;
    off += layer.weights() + static_cast<std::size_t>(layer.out);
  }
  paramCount_ = off;
  params_ = static_cast<float*>(backend_.alloc(paramCount_ * sizeof(float)));
  grads_ = static_cast<float*>(backend_.alloc(paramCount_ * sizeof(float)));
  const auto rows = static_cast<std::size_t>(maxBatch);
  auto floats = [&](std::size_t count) { return static_cast<float*>(backend_.alloc(count * sizeof(float))); };
  input_ = floats(rows * static_cast<std::size_t>(inputs()));
  labels_ = static_cast<std::int32_t*>(backend_.alloc(rows * sizeof(std::int32_t)));
  std::size_t widest = 0, widestCol = 0;
  for (int l = 0; l < n; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    widest = std::max(widest, layer.outPerRow());
    const bool hidden = l + 1 < n;
    if (layer.conv) {
      const std::size_t pixels = rows * static_cast<std::size_t>(layer.side) * static_cast<std::size_t>(layer.side);
      const std::size_t full = pixels * static_cast<std::size_t>(layer.out);
      widestCol = std::max(widestCol, pixels * static_cast<std::size_t>(kConvKernel * kConvKernel * layer.in));
      pre_.push_back(floats(full));
      act_.push_back(floats(full));
      argmax_.push_back(static_cast<std::uint8_t*>(backend_.alloc(full / 4)));
      post_.push_back(floats(rows * layer.outPerRow()));
    } else {
      pre_.push_back(floats(rows * layer.outPerRow()));
      act_.push_back(nullptr);
      argmax_.push_back(nullptr);
      post_.push_back(hidden ? floats(rows * layer.outPerRow()) : nullptr);
    }
  }
  if (widestCol > 0) col_ = floats(widestCol);
  for (float*& d : delta_) d = floats(rows * widest);

  // Glorot-uniform weights from a 64-bit Mersenne twister (specified bit for bit by the
  // standard, so every rank and backend starts from the same model), biases zero. A
  // convolution's fans count its taps: 25 * in and 25 * out.
  std::mt19937_64 rng(seed ^ 0x6d65726964696e31ULL);
  std::vector<float> host(paramCount_, 0.0f);
  for (const Layer& layer : layers_) {
    const std::size_t fans = layer.weights() / static_cast<std::size_t>(layer.in) / static_cast<std::size_t>(layer.out);
    const auto fanSum = static_cast<float>(fans * static_cast<std::size_t>(layer.in + layer.out));
    const float bound = std::sqrt(6.0f / fanSum);
    float* w = host.data() + layer.offset;
    for (std::size_t i = 0; i < layer.weights(); ++i) {
      const float u = static_cast<float>(rng() >> 40) * 0x1p-24f;  // [0, 1)
      w[i] = (2.0f * u - 1.0f) * bound;
    }
  }
  backend_.copyToDevice(params_, host.data(), paramCount_ * sizeof(float));
}

Result<std::unique_ptr<Model>> Model::create(kernels::Backend& backend, ModelConfig config, int maxBatch,
                                             std::uint64_t seed) {
  MERIDIAN_RETURN_IF_ERROR(validateModel(config));
  if (maxBatch < 1) return invalidArgument("Model: need a batch of at least one row (not {})", maxBatch);
  const std::string shape = formatModel(config);
  try {
    return std::make_unique<Model>(backend, std::move(config), maxBatch, seed);
  } catch (const std::bad_alloc&) {
    return invalidArgument("Model: no memory for model {} with batches of {} rows on the {} backend", shape, maxBatch,
                           backend.device() == kernels::Device::kCpu ? "cpu" : "cuda");
  }
}

Model::~Model() {
  for (float* p : pre_) backend_.free(p);
  for (float* p : post_) backend_.free(p);
  for (float* p : act_) backend_.free(p);
  for (std::uint8_t* p : argmax_) backend_.free(p);
  for (float* d : delta_) backend_.free(d);
  backend_.free(col_);
  backend_.free(labels_);
  backend_.free(input_);
  backend_.free(grads_);
  backend_.free(params_);
}

std::size_t Model::layerEnd(int layer) const {
  const Layer& l = layers_[static_cast<std::size_t>(layer)];
  return l.offset + l.weights() + static_cast<std::size_t>(l.out);
}

void Model::convForward(int l, const float* x, int rows) {
  const auto li = static_cast<std::size_t>(l);
  const Layer& layer = layers_[li];
  const int pixels = rows * layer.side * layer.side;
  const int taps = kConvKernel * kConvKernel * layer.in;
  const float* w = params_ + layer.offset;
  backend_.im2col(x, kernels::ImageShape{rows, layer.side, layer.in}, kConvKernel, col_);
  colLayer_ = l;
  backend_.gemm(false, false, pixels, layer.out, taps, 1.0f, col_, taps, w, layer.out, 0.0f, pre_[li], layer.out);
  backend_.addBias(pre_[li], w + layer.weights(), pixels, layer.out);
  backend_.activationForward(config_.activation, pre_[li], act_[li],
                             static_cast<std::size_t>(pixels) * static_cast<std::size_t>(layer.out));
  backend_.maxPool2Forward(act_[li], kernels::ImageShape{rows, layer.side, layer.out}, post_[li], argmax_[li]);
}

void Model::forwardLayers(int rows) {
  MERIDIAN_CHECK_MSG(rows >= 1 && rows <= maxBatch_, "Model: batch of {} rows (max {})", rows, maxBatch_);
  const int n = layers();
  const float* x = input_;
  for (int l = 0; l < n; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const Layer& layer = layers_[li];
    if (layer.conv) {
      convForward(l, x, rows);
      x = post_[li];
      continue;
    }
    const float* w = params_ + layer.offset;
    backend_.gemm(false, false, rows, layer.out, layer.in, 1.0f, x, layer.in, w, layer.out, 0.0f, pre_[li], layer.out);
    backend_.addBias(pre_[li], w + layer.weights(), rows, layer.out);
    if (l + 1 < n) {
      backend_.activationForward(config_.activation, pre_[li], post_[li],
                                 static_cast<std::size_t>(rows) * static_cast<std::size_t>(layer.out));
      x = post_[li];
    }
  }
}

kernels::LossStats Model::forward(int rows) {
  forwardLayers(rows);
  return backend_.softmaxCrossEntropy(pre_.back(), labels_, rows, classes(), nullptr, 0.0f);
}

kernels::LossStats Model::forwardBackward(int rows, float gradScale, const std::function<void(int)>& onLayerDone) {
  forwardLayers(rows);
  // d(mean loss)/d(logits), then down the layers.
  float* d = delta_[0];
  const kernels::LossStats stats =
      backend_.softmaxCrossEntropy(pre_.back(), labels_, rows, classes(), d, gradScale / static_cast<float>(rows));
  for (int l = layers() - 1; l >= 0; --l) {
    float* next = d == delta_[0] ? delta_[1] : delta_[0];
    if (isConv(l)) convBackward(l, d, rows, next, onLayerDone);
    else denseBackward(l, d, rows, next, onLayerDone);
    d = next;
  }
  return stats;
}

void Model::denseBackward(int l, const float* d, int rows, float* next, const std::function<void(int)>& onLayerDone) {
  const auto li = static_cast<std::size_t>(l);
  const Layer& layer = layers_[li];
  float* gw = grads_ + layer.offset;
  backend_.gemm(true, false, layer.in, layer.out, rows, 1.0f, layerInput(l), layer.in, d, layer.out, 0.0f, gw,
                layer.out);
  backend_.biasGrad(d, gw + layer.weights(), rows, layer.out);
  if (onLayerDone) onLayerDone(l);
  if (l == 0) return;
  backend_.gemm(false, true, rows, layer.in, layer.out, 1.0f, d, layer.out, params_ + layer.offset, layer.out, 0.0f,
                next, layer.in);
  // Below a dense layer sits either a dense layer's activation or a conv block's pooling,
  // whose backward is the block's own.
  if (!isConv(l - 1))
    backend_.activationBackward(config_.activation, pre_[li - 1], next, next,
                                static_cast<std::size_t>(rows) * static_cast<std::size_t>(layer.in));
}

// d is the gradient of the pooled output. Back through the pooling into act_, through the
// activation in place, then the weights from the block's im2col rows (rebuilt when another
// layer used col_ since forward), and for l > 0 the input's gradient as col2im of d W^T.
void Model::convBackward(int l, const float* d, int rows, float* next, const std::function<void(int)>& onLayerDone) {
  const auto li = static_cast<std::size_t>(l);
  const Layer& layer = layers_[li];
  const int pixels = rows * layer.side * layer.side;
  const int taps = kConvKernel * kConvKernel * layer.in;
  const kernels::ImageShape inShape{rows, layer.side, layer.in};
  float* dAct = act_[li];
  backend_.maxPool2Backward(d, argmax_[li], kernels::ImageShape{rows, layer.side, layer.out}, dAct);
  backend_.activationBackward(config_.activation, pre_[li], dAct, dAct,
                              static_cast<std::size_t>(pixels) * static_cast<std::size_t>(layer.out));
  if (colLayer_ != l) {
    backend_.im2col(layerInput(l), inShape, kConvKernel, col_);
    colLayer_ = l;
  }
  float* gw = grads_ + layer.offset;
  backend_.gemm(true, false, taps, layer.out, pixels, 1.0f, col_, taps, dAct, layer.out, 0.0f, gw, layer.out);
  backend_.biasGrad(dAct, gw + layer.weights(), pixels, layer.out);
  if (onLayerDone) onLayerDone(l);
  if (l == 0) return;
  backend_.gemm(false, true, pixels, taps, layer.out, 1.0f, dAct, layer.out, params_ + layer.offset, layer.out, 0.0f,
                col_, taps);
  colLayer_ = -1;  // col_ now holds a gradient
  backend_.col2im(col_, inShape, kConvKernel, next);
}

}  // namespace meridian::trainer
