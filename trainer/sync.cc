#include "trainer/sync.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <new>

#include <fmt/format.h>

#include "core/check.h"
#include "core/log.h"
#include "kernels/reduce.h"

namespace meridian::trainer {

using collectives::Communicator;
using kernels::DataType;
using kernels::ReduceOp;

namespace {
class MeridianPending final : public SyncComm::Pending {
 public:
  explicit MeridianPending(Communicator::WorkPtr work) : work_(std::move(work)) {}
  Status wait() override { return work_->wait(); }

 private:
  Communicator::WorkPtr work_;
};

// A bucket whose allreduce could not start.
class FailedPending final : public SyncComm::Pending {
 public:
  explicit FailedPending(Status why) : why_(std::move(why)) {}
  Status wait() override { return why_; }

 private:
  Status why_;
};
}  // namespace

std::unique_ptr<SyncComm::Pending> MeridianSyncComm::allreduceAsync(void* data, std::size_t count, DataType type,
                                                                     ReduceOp op) {
  return std::make_unique<MeridianPending>(comm_.allreduceAsync(data, data, count, type, op));
}

std::string_view toString(Wire wire) {
  switch (wire) {
    case Wire::kF32: return "f32";
    case Wire::kBF16: return "bf16";
    case Wire::kInt8: return "int8";
  }
  return "?";
}

Result<Wire> parseWire(const std::string& text) {
  if (text == "f32") return Wire::kF32;
  if (text == "bf16") return Wire::kBF16;
  if (text == "int8") return Wire::kInt8;
  return Status(StatusCode::kInvalidArgument, fmt::format("wire format '{}': expected f32, bf16 or int8", text));
}

double wireBytesPerElement(Wire wire) {
  switch (wire) {
    case Wire::kF32: return 4;
    case Wire::kBF16: return 2;
    case Wire::kInt8: return 1.0 + 4.0 / static_cast<double>(kInt8Block);
  }
  return 4;
}

std::vector<Bucket> planBuckets(const Model& model, std::size_t bucketBytes) {
  const std::size_t cap = std::max<std::size_t>(1, bucketBytes / sizeof(float));
  std::vector<Bucket> out;
  Bucket open;
  bool have = false;
  for (int l = model.layers() - 1; l >= 0; --l) {
    std::size_t pos = model.paramOffset(l);
    const std::size_t end = model.layerEnd(l);
    while (pos < end) {
      if (!have) {
        open = Bucket{pos, pos, l};
        have = true;
      }
      const std::size_t take = std::min(end - pos, cap - (open.end - open.begin));
      open.end += take;
      open.lastLayer = l;
      pos += take;
      if (open.end - open.begin >= cap) {
        out.push_back(open);
        have = false;
      }
    }
  }
  if (have) out.push_back(open);
  return out;
}

// ---- GradientSync ---------------------------------------------------------------------

Result<std::unique_ptr<GradientSync>> GradientSync::create(kernels::Backend& backend, SyncComm* comm, Model& model,
                                                           std::size_t bucketBytes, Wire wire) {
  if (wire == Wire::kInt8) return invalidArgument("gradient sync: int8 is a DiLoCo wire format (use f32 or bf16)");
  try {
    return std::make_unique<GradientSync>(backend, comm, model, bucketBytes, wire);
  } catch (const std::bad_alloc&) {
    return invalidArgument("gradient sync: no memory for the staging buffers of {} parameters", model.paramCount());
  }
}

GradientSync::GradientSync(kernels::Backend& backend, SyncComm* comm, Model& model, std::size_t bucketBytes, Wire wire)
    : backend_(backend), comm_(comm), model_(model), wire_(wire), buckets_(planBuckets(model, bucketBytes)) {
  MERIDIAN_CHECK_MSG(wire_ != Wire::kInt8, "gradient sync: wire {} (want f32 or bf16)", toString(wire_));
  works_.resize(buckets_.size());
  if (comm_ == nullptr) return;
  const std::size_t n = model_.paramCount();
  if (wire_ == Wire::kBF16) {
    if (hostResident()) {
      host_ = backend_.alloc(n * sizeof(std::uint16_t));
    } else {
      deviceWire_ = backend_.alloc(n * sizeof(std::uint16_t));
      host_ = backend_.allocHost(n * sizeof(std::uint16_t));
    }
  } else if (!hostResident()) {
    host_ = backend_.allocHost(n * sizeof(float));
  }
  if (!hostResident()) launcher_ = std::thread([this] { launcherLoop(); });
}

GradientSync::~GradientSync() {
  if (launcher_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    launcher_.join();
  }
  for (auto& w : works_)
    if (w) (void)w->wait();
  if (hostResident()) {
    backend_.free(host_);
  } else {
    backend_.freeHost(host_);
    backend_.free(deviceWire_);
  }
}

std::size_t GradientSync::payloadBytesPerStep() const {
  return comm_ == nullptr ? 0 : model_.paramCount() * (wire_ == Wire::kBF16 ? 2 : 4);
}

void GradientSync::onLayerDone(int layer) {
  if (comm_ == nullptr) return;
  while (next_ < buckets_.size() && buckets_[next_].lastLayer >= layer) launch(next_++);
}

void GradientSync::launch(std::size_t b) {
  const Bucket& bucket = buckets_[b];
  const std::size_t count = bucket.end - bucket.begin;
  float* grads = model_.grads() + bucket.begin;
  if (hostResident()) {
    if (wire_ == Wire::kBF16) {
      auto* half = static_cast<std::uint16_t*>(host_) + bucket.begin;
      backend_.castToBF16(grads, half, count);
      works_[b] = comm_->allreduceAsync(half, count, DataType::kBF16, ReduceOp::kAvg);
    } else {
      works_[b] = comm_->allreduceAsync(grads, count, DataType::kF32, ReduceOp::kAvg);
    }
    return;
  }
  // GPU: copy out on the copy stream once the gradients are written; the launcher starts
  // the allreduce when the copy landed.
  std::uint64_t ticket = 0;
  if (wire_ == Wire::kBF16) {
    auto* dev = static_cast<std::uint16_t*>(deviceWire_) + bucket.begin;
    backend_.castToBF16(grads, dev, count);
    ticket = backend_.stageToHost(static_cast<std::uint16_t*>(host_) + bucket.begin, dev, count * 2);
  } else {
    ticket = backend_.stageToHost(static_cast<float*>(host_) + bucket.begin, grads, count * 4);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged_.push_back(Staged{b, ticket});
  }
  cv_.notify_all();
}

void GradientSync::launcherLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !staged_.empty(); });
    if (staged_.empty()) return;
    const Staged s = staged_.front();
    staged_.pop_front();
    lock.unlock();
    const Bucket& bucket = buckets_[s.bucket];
    const std::size_t count = bucket.end - bucket.begin;
    std::unique_ptr<SyncComm::Pending> work;
    try {  // nothing leaves this thread: the bucket fails instead, and finish() says why
      backend_.waitStaged(s.ticket);
      if (wire_ == Wire::kBF16) {
        work = comm_->allreduceAsync(static_cast<std::uint16_t*>(host_) + bucket.begin, count, DataType::kBF16,
                                     ReduceOp::kAvg);
      } else {
        work = comm_->allreduceAsync(static_cast<float*>(host_) + bucket.begin, count, DataType::kF32, ReduceOp::kAvg);
      }
    } catch (const std::exception& e) {
      work = std::make_unique<FailedPending>(internalError("gradient bucket {}: {}", s.bucket, e.what()));
    }
    lock.lock();
    works_[s.bucket] = std::move(work);
    cv_.notify_all();
  }
}

Status GradientSync::finish(const RangeFn& averaged) {
  if (comm_ == nullptr) {
    if (averaged) averaged(0, model_.paramCount());
    return Status();
  }
  // Backward is over: every bucket has been started (the callback ran for layer 0).
  if (next_ != buckets_.size()) onLayerDone(0);
  next_ = 0;
  Status first;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::unique_ptr<SyncComm::Pending> work;
    if (hostResident()) {
      work = std::move(works_[b]);
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return works_[b] != nullptr; });
      work = std::move(works_[b]);
    }
    works_[b] = nullptr;
    Status st = work->wait();
    if (!st.isOk() && first.isOk()) first = st;
    if (!first.isOk()) continue;
    const Bucket& bucket = buckets_[b];
    const std::size_t count = bucket.end - bucket.begin;
    float* grads = model_.grads() + bucket.begin;
    if (wire_ == Wire::kBF16) {
      if (hostResident()) {
        backend_.castFromBF16(static_cast<std::uint16_t*>(host_) + bucket.begin, grads, count);
      } else {
        auto* dev = static_cast<std::uint16_t*>(deviceWire_) + bucket.begin;
        backend_.stageToDevice(dev, static_cast<std::uint16_t*>(host_) + bucket.begin, count * 2);
        backend_.castFromBF16(dev, grads, count);
      }
    } else if (!hostResident()) {
      backend_.stageToDevice(grads, static_cast<float*>(host_) + bucket.begin, count * 4);
    }
    if (averaged) averaged(bucket.begin, bucket.end);
  }
  return first;
}

// ---- int8 blocks --------------------------------------------------------------------

std::size_t int8PackedBytes(std::size_t n) {
  const std::size_t blocks = (n + kInt8Block - 1) / kInt8Block;
  return blocks * sizeof(float) + n;
}

// Layout: every block's f32 scale first (little-endian, as the host stores it), then the
// int8 values.
void packInt8(const float* src, std::size_t n, std::uint8_t* out) {
  const std::size_t blocks = (n + kInt8Block - 1) / kInt8Block;
  auto* values = reinterpret_cast<std::int8_t*>(out + blocks * sizeof(float));
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t lo = b * kInt8Block;
    const std::size_t hi = std::min(n, lo + kInt8Block);
    float absmax = 0;
    for (std::size_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(src[i]));
    const float scale = absmax / 127.0f;
    std::memcpy(out + b * sizeof(float), &scale, sizeof(float));
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    for (std::size_t i = lo; i < hi; ++i)
      values[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(src[i] * inv), -127.0f, 127.0f));
  }
}

void unpackInt8Add(const std::uint8_t* packed, std::size_t n, float* dst) {
  const std::size_t blocks = (n + kInt8Block - 1) / kInt8Block;
  const auto* values = reinterpret_cast<const std::int8_t*>(packed + blocks * sizeof(float));
  for (std::size_t b = 0; b < blocks; ++b) {
    float scale = 0;
    std::memcpy(&scale, packed + b * sizeof(float), sizeof(float));
    if (!std::isfinite(scale)) scale = 0;  // a peer's bad block counts as zero, not NaN
    const std::size_t lo = b * kInt8Block;
    const std::size_t hi = std::min(n, lo + kInt8Block);
    for (std::size_t i = lo; i < hi; ++i) dst[i] += static_cast<float>(values[i]) * scale;
  }
}

// ---- OuterSync --------------------------------------------------------------------------

OuterSync::OuterSync(kernels::Backend& backend, SyncComm* comm, Model& model, OuterParams params, Wire wire)
    : backend_(backend), comm_(comm), model_(model), params_(params), wire_(wire) {
  const std::size_t n = model_.paramCount();
  anchor_ = static_cast<float*>(backend_.alloc(n * sizeof(float)));
  velocity_ = static_cast<float*>(backend_.alloc(n * sizeof(float)));
  delta_ = static_cast<float*>(backend_.alloc(n * sizeof(float)));
  backend_.copy(anchor_, model_.params(), n);
}

OuterSync::~OuterSync() {
  backend_.free(delta_);
  backend_.free(velocity_);
  backend_.free(anchor_);
}

std::size_t OuterSync::payloadBytesPerSync() const {
  if (comm_ == nullptr) return 0;
  const std::size_t n = model_.paramCount();
  switch (wire_) {
    case Wire::kF32: return n * 4;
    case Wire::kBF16: return n * 2;
    case Wire::kInt8: return int8PackedBytes(n);
  }
  return 0;
}

Status OuterSync::sync() {
  const std::size_t n = model_.paramCount();
  // Pseudo-gradient: how far the inner steps moved away from the anchor (as a gradient).
  backend_.subtract(anchor_, model_.params(), delta_, n);
  if (comm_ != nullptr) {
    Status st = average(n);
    if (!st.isOk()) return st;
  }
  kernels::SgdParams outer;
  outer.lr = params_.lr;
  outer.momentum = params_.momentum;
  outer.nesterov = true;
  backend_.sgdStep(anchor_, delta_, velocity_, n, outer);
  backend_.copy(model_.params(), anchor_, n);
  return Status();
}

Status OuterSync::average(std::size_t n) {
  const bool host = backend_.device() == kernels::Device::kCpu;
  if (wire_ == Wire::kF32 && host) return comm_->allreduce(delta_, n, DataType::kF32, ReduceOp::kAvg);
  hostDelta_.resize(n);
  if (wire_ == Wire::kBF16) {
    hostHalf_.resize(n);
    if (host) {
      backend_.castToBF16(delta_, hostHalf_.data(), n);
    } else {
      backend_.copyToHost(hostDelta_.data(), delta_, n * sizeof(float));
      kernels::castF32ToBF16(hostDelta_.data(), hostHalf_.data(), n);
    }
    Status st = comm_->allreduce(hostHalf_.data(), n, DataType::kBF16, ReduceOp::kAvg);
    if (!st.isOk()) return st;
    kernels::castBF16ToF32(hostHalf_.data(), hostDelta_.data(), n);
  } else if (wire_ == Wire::kF32) {
    backend_.copyToHost(hostDelta_.data(), delta_, n * sizeof(float));
    Status st = comm_->allreduce(hostDelta_.data(), n, DataType::kF32, ReduceOp::kAvg);
    if (!st.isOk()) return st;
  } else {
    // int8: every rank's blocks are gathered and decoded here, then averaged in f32 (int8
    // values cannot be summed on the wire without overflowing).
    backend_.copyToHost(hostDelta_.data(), delta_, n * sizeof(float));
    const std::size_t bytes = int8PackedBytes(n);
    const std::size_t words = (bytes + 3) / 4;  // gathered as 32-bit words
    packed_.assign(words * 4, 0);
    packInt8(hostDelta_.data(), n, packed_.data());
    gathered_.resize(words * 4 * static_cast<std::size_t>(comm_->size()));
    Status st = comm_->allgather(packed_.data(), gathered_.data(), words, DataType::kI32);
    if (!st.isOk()) return st;
    std::fill(hostDelta_.begin(), hostDelta_.end(), 0.0f);
    for (int r = 0; r < comm_->size(); ++r)
      unpackInt8Add(gathered_.data() + static_cast<std::size_t>(r) * words * 4, n, hostDelta_.data());
    const float inv = 1.0f / static_cast<float>(comm_->size());
    for (float& v : hostDelta_) v *= inv;
  }
  backend_.copyToDevice(delta_, hostDelta_.data(), n * sizeof(float));
  return Status();
}

}  // namespace meridian::trainer
