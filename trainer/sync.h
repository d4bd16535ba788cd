// Gradient and model synchronisation over a Meridian communicator.
//
// GradientSync (--sync ddp, and inside a region for --sync hybrid): the gradient buffer is
// cut into buckets in the order backward produces it (last layer first); each bucket's
// average starts on the communicator the moment backward finished the layers it covers and
// runs while backward continues. With a CPU backend the bucket is reduced in place (f32)
// or through a bf16 copy; with a GPU backend it is staged through page-locked host memory
// on the backend's copy stream, ordered by events, and a launcher thread starts the
// allreduce as soon as the copy landed. finish() waits for the buckets in the order they
// started, writes each average back into the gradients and hands its range to the caller
// at once, so the optimizer steps the layers already averaged while the last buckets (the
// first layers, produced last) are still on the wire.
//
// OuterSync (--sync diloco, and across regions for --sync hybrid): every H steps the
// pseudo-gradient (anchor - params) is averaged and an outer Nesterov-momentum step moves
// the anchor, which becomes the new params (DiLoCo, Douillard et al. 2023). Wire formats:
// f32, bf16 (allreduce) or int8 (block-scaled, all-gathered and averaged in f32).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "trainer/model.h"

namespace meridian::trainer {

// The collectives the sync modes need. Meridian's Communicator is the one that matters
// (MeridianSyncComm); the interface exists so the very same training runs over another
// library for side-by-side comparisons (bench/mpi_train_main.cc adapts OpenMPI). All
// operations are in place and every rank calls them in the same order.
class SyncComm {
 public:
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual Status wait() = 0;
  };
  virtual ~SyncComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts an in-place allreduce; the buffer stays untouched by the caller until wait().
  virtual std::unique_ptr<Pending> allreduceAsync(void* data, std::size_t count, kernels::DataType type,
                                                  kernels::ReduceOp op) = 0;
  virtual Status allreduce(void* data, std::size_t count, kernels::DataType type, kernels::ReduceOp op) = 0;
  // recv holds sendCount elements per rank, rank r's at block r.
  virtual Status allgather(const void* send, void* recv, std::size_t sendCount, kernels::DataType type) = 0;
  virtual Status barrier() = 0;
};

class MeridianSyncComm final : public SyncComm {
 public:
  explicit MeridianSyncComm(collectives::Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::unique_ptr<Pending> allreduceAsync(void* data, std::size_t count, kernels::DataType type,
                                          kernels::ReduceOp op) override;
  Status allreduce(void* data, std::size_t count, kernels::DataType type, kernels::ReduceOp op) override {
    return comm_.allreduce(data, data, count, type, op);
  }
  Status allgather(const void* send, void* recv, std::size_t sendCount, kernels::DataType type) override {
    return comm_.allgather(send, recv, sendCount, type);
  }
  Status barrier() override { return comm_.barrier(); }

 private:
  collectives::Communicator& comm_;
};

enum class Wire : std::uint8_t { kF32, kBF16, kInt8 };
std::string_view toString(Wire wire);
Result<Wire> parseWire(const std::string& text);
// Bytes one element takes on the wire (int8: its share of the block scale included).
double wireBytesPerElement(Wire wire);

// A contiguous range of the flat gradient buffer, complete once backward finished layer
// `lastLayer` (the lowest layer it touches).
struct Bucket {
  std::size_t begin = 0;
  std::size_t end = 0;
  int lastLayer = 0;
};
// Layers in backward order (L-1 first), packed whole into buckets of about bucketBytes
// (f32): a bucket closes once it reached the size; a layer larger than that is cut into
// bucket-sized pieces, all complete when that layer is.
std::vector<Bucket> planBuckets(const Model& model, std::size_t bucketBytes);

class GradientSync {
 public:
  // `comm` may be null (one rank: finish() leaves the gradients as they are). `wire` is f32
  // or bf16 (CheckError otherwise: create() is the checked way in).
  GradientSync(kernels::Backend& backend, SyncComm* comm, Model& model, std::size_t bucketBytes, Wire wire);
  // The same, with kInvalidArgument for a wire format gradients cannot take (int8).
  static Result<std::unique_ptr<GradientSync>> create(kernels::Backend& backend, SyncComm* comm, Model& model,
                                                      std::size_t bucketBytes, Wire wire);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Pass to Model::forwardBackward: starts every bucket that `layer` completed.
  void onLayerDone(int layer);
  // Waits for every bucket and leaves the averaged gradients in the model; `averaged` (when
  // given) runs for each bucket's range [begin, end) of the flat buffer as soon as it is
  // averaged, in bucket order (with no peers: once, for the whole buffer). A failed
  // allreduce is returned (the communicator is broken then) and stops the calls.
  using RangeFn = std::function<void(std::size_t begin, std::size_t end)>;
  Status finish(const RangeFn& averaged = {});
  // Bytes this rank put on the wire per step as payload (bucket bytes in the wire format).
  std::size_t payloadBytesPerStep() const;

 private:
  struct Staged {
    std::size_t bucket;
    std::uint64_t ticket;
  };
  void launch(std::size_t bucket);
  // The launcher thread (GPU): nothing leaves it; a bucket it cannot start fails with the
  // error, which finish() returns.
  void launcherLoop();
  bool hostResident() const { return backend_.device() == kernels::Device::kCpu; }

  kernels::Backend& backend_;
  SyncComm* comm_;
  Model& model_;
  Wire wire_;
  std::vector<Bucket> buckets_;
  std::size_t next_ = 0;  // first bucket not yet started this step
  void* host_ = nullptr;  // staging: the gradients in wire format (null: in place)
  void* deviceWire_ = nullptr;  // GPU bf16: the cast gradients before staging
  std::vector<std::unique_ptr<SyncComm::Pending>> works_;  // [bucket]

  // GPU: staged copies waiting for their allreduce (launcher thread).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Staged> staged_;
  bool stop_ = false;
  std::thread launcher_;
};

struct OuterParams {
  float lr = 0.7f;
  float momentum = 0.9f;
};

class OuterSync {
 public:
  OuterSync(kernels::Backend& backend, SyncComm* comm, Model& model, OuterParams params, Wire wire);
  ~OuterSync();
  OuterSync(const OuterSync&) = delete;
  OuterSync& operator=(const OuterSync&) = delete;

  // Averages (anchor - params) over the communicator, steps the anchor with Nesterov
  // momentum and copies it into the params. The inner optimizer's state is left alone.
  Status sync();
  // Averages over `comm` from now on (a successor communicator after a membership change).
  void rebind(SyncComm* comm) { comm_ = comm; }
  // Backend memory, paramCount elements each (checkpointed).
  float* anchor() { return anchor_; }
  float* velocity() { return velocity_; }
  std::size_t payloadBytesPerSync() const;

 private:
  Status average(std::size_t n);

  kernels::Backend& backend_;
  SyncComm* comm_;
  Model& model_;
  OuterParams params_;
  Wire wire_;
  float* anchor_ = nullptr;
  float* velocity_ = nullptr;
  float* delta_ = nullptr;
  std::vector<float> hostDelta_;          // GPU or int8: the pseudo-gradient on the host
  std::vector<std::uint16_t> hostHalf_;   // bf16 on the wire
  std::vector<std::uint8_t> packed_;      // int8: this rank's blocks
  std::vector<std::uint8_t> gathered_;    // int8: every rank's blocks
};

// int8 wire blocks: kInt8Block values share one f32 scale (absmax / 127).
inline constexpr std::size_t kInt8Block = 256;
std::size_t int8PackedBytes(std::size_t n);
void packInt8(const float* src, std::size_t n, std::uint8_t* out);
// dst[i] += decoded value of element i.
void unpackInt8Add(const std::uint8_t* packed, std::size_t n, float* dst);

}  // namespace meridian::trainer
