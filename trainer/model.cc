#include "trainer/model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>


namespace meridian::trainer {

Result<std::vector<int>> parseWidths(const std::string& text) {
  std::vector<int> widths;
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == '-') parts.emplace_back();
    else parts.back() += c;
  }
  for (const std::string& part : parts) {
    int v = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || end != part.data() + part.size() || v < 1 || v > 65536)
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("model widths '{}': '{}' is not a width in 1..65536", text, part));
    widths.push_back(v);
  }
  if (widths.size() < 2)
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("model widths '{}': need at least inputs and classes, e.g. 784-1024-10", text));
  return widths;
}

std::string formatWidths(const std::vector<int>& widths) { return fmt::format("{}", fmt::join(widths, "-")); }

Mlp::Mlp(kernels::Backend& backend, ModelConfig config, int maxBatch, std::uint64_t seed)
    : backend_(backend), config_(std::move(config)), maxBatch_(maxBatch) {
  if (config_.widths.size() < 2 || maxBatch < 1) throw std::invalid_argument("Mlp: need two widths and a batch");
  const int n = layers();
  offsets_.assign(static_cast<std::size_t>(n), 0);
  std::size_t off = 0;
  for (int l = n - 1; l >= 0; --l) {
    offsets_[static_cast<std::size_t>(l)] = off;
    const auto in = static_cast<std::size_t>(config_.widths[static_cast<std::size_t>(l)]);
    const auto out = static_cast<std::size_t>(config_.widths[static_cast<std::size_t>(l) + 1]);
    off += in * out + out;
  }
  paramCount_ = off;
  params_ = static_cast<float*>(backend_.alloc(paramCount_ * sizeof(float)));
  grads_ = static_cast<float*>(backend_.alloc(paramCount_ * sizeof(float)));
  const auto rows = static_cast<std::size_t>(maxBatch);
  input_ = static_cast<float*>(backend_.alloc(rows * static_cast<std::size_t>(inputs()) * sizeof(float)));
  labels_ = static_cast<std::int32_t*>(backend_.alloc(rows * sizeof(std::int32_t)));
  int widest = 0;
  for (int l = 0; l < n; ++l) {
    const int out = config_.widths[static_cast<std::size_t>(l) + 1];
    widest = std::max(widest, out);
    pre_.push_back(static_cast<float*>(backend_.alloc(rows * static_cast<std::size_t>(out) * sizeof(float))));
    post_.push_back(l + 1 < n ? static_cast<float*>(backend_.alloc(rows * static_cast<std::size_t>(out) * sizeof(float)))
                              : nullptr);
  }
  for (float*& d : delta_) d = static_cast<float*>(backend_.alloc(rows * static_cast<std::size_t>(widest) * sizeof(float)));

  // Glorot-uniform weights from a 64-bit Mersenne twister (specified bit for bit by the
  // standard, so every rank and backend starts from the same model), biases zero.
  std::mt19937_64 rng(seed ^ 0x6d65726964696e31ULL);
  std::vector<float> host(paramCount_, 0.0f);
  for (int l = 0; l < n; ++l) {
    const int in = config_.widths[static_cast<std::size_t>(l)];
    const int out = config_.widths[static_cast<std::size_t>(l) + 1];
    const float bound = std::sqrt(6.0f / static_cast<float>(in + out));
    float* w = host.data() + paramOffset(l);
    for (std::size_t i = 0; i < static_cast<std::size_t>(in) * static_cast<std::size_t>(out); ++i) {
      const float u = static_cast<float>(rng() >> 40) * 0x1p-24f;  // [0, 1)
      w[i] = (2.0f * u - 1.0f) * bound;
    }
  }
  backend_.copyToDevice(params_, host.data(), paramCount_ * sizeof(float));
}

Mlp::~Mlp() {
  for (float* p : pre_) backend_.free(p);
  for (float* p : post_) backend_.free(p);
  for (float* d : delta_) backend_.free(d);
  backend_.free(labels_);
  backend_.free(input_);
  backend_.free(grads_);
  backend_.free(params_);
}

std::size_t Mlp::layerEnd(int layer) const {
  const auto in = static_cast<std::size_t>(config_.widths[static_cast<std::size_t>(layer)]);
  const auto out = static_cast<std::size_t>(config_.widths[static_cast<std::size_t>(layer) + 1]);
  return paramOffset(layer) + in * out + out;
}

void Mlp::forwardLayers(int rows) {
  if (rows < 1 || rows > maxBatch_) throw std::invalid_argument(fmt::format("Mlp: batch of {} rows (max {})", rows, maxBatch_));
  const int n = layers();
  const float* x = input_;
  for (int l = 0; l < n; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const int in = config_.widths[li];
    const int out = config_.widths[li + 1];
    const float* w = params_ + paramOffset(l);
    backend_.gemm(false, false, rows, out, in, 1.0f, x, in, w, out, 0.0f, pre_[li], out);
    backend_.addBias(pre_[li], w + static_cast<std::size_t>(in) * static_cast<std::size_t>(out), rows, out);
    if (l + 1 < n) {
      backend_.activationForward(config_.activation, pre_[li], post_[li],
                                 static_cast<std::size_t>(rows) * static_cast<std::size_t>(out));
      x = post_[li];
    }
  }
}

kernels::LossStats Mlp::forward(int rows) {
  forwardLayers(rows);
  return backend_.softmaxCrossEntropy(pre_.back(), labels_, rows, classes(), nullptr, 0.0f);
}

kernels::LossStats Mlp::forwardBackward(int rows, float gradScale, const std::function<void(int)>& onLayerDone) {
  forwardLayers(rows);
  const int n = layers();
  // d(mean loss)/d(logits), then down the layers.
  float* d = delta_[0];
  const kernels::LossStats stats =
      backend_.softmaxCrossEntropy(pre_.back(), labels_, rows, classes(), d, gradScale / static_cast<float>(rows));
  for (int l = n - 1; l >= 0; --l) {
    const auto li = static_cast<std::size_t>(l);
    const int in = config_.widths[li];
    const int out = config_.widths[li + 1];
    const float* below = l > 0 ? post_[li - 1] : input_;
    float* gw = grads_ + paramOffset(l);
    backend_.gemm(true, false, in, out, rows, 1.0f, below, in, d, out, 0.0f, gw, out);
    backend_.biasGrad(d, gw + static_cast<std::size_t>(in) * static_cast<std::size_t>(out), rows, out);
    if (onLayerDone) onLayerDone(l);
    if (l > 0) {
      float* next = d == delta_[0] ? delta_[1] : delta_[0];
      backend_.gemm(false, true, rows, in, out, 1.0f, d, out, params_ + paramOffset(l), out, 0.0f, next, in);
      backend_.activationBackward(config_.activation, pre_[li - 1], next, next,
                                  static_cast<std::size_t>(rows) * static_cast<std::size_t>(in));
      d = next;
    }
  }
  return stats;
}

}  // namespace meridian::trainer
