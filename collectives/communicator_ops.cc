// Communicator ops: argument checks (before anything is sent), the choice of algorithm
// by message size, and the op bodies the executor runs (communicator.cc).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "collectives/communicator.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

using kernels::DataType;
using kernels::ReduceOp;

namespace {

// Point-to-point tags live above every collective tag.
constexpr std::uint64_t kP2pTagBit = std::uint64_t{1} << 63;

Status checkDataType(DataType dtype) {
  if (kernels::dataTypeSize(dtype) == 0) {
    return invalidArgument("unknown data type {}", static_cast<int>(dtype));
  }
  return Status::ok();
}

Status checkReduceOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kProd: case ReduceOp::kMin: case ReduceOp::kMax: case ReduceOp::kAvg:
      return Status::ok();
  }
  return invalidArgument("unknown reduce op {}", static_cast<int>(op));
}

Status checkBuffers(const void* send, const void* recv, std::size_t count, const char* what) {
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return invalidArgument("{}: null buffer with count {}", what, count);
  }
  return Status::ok();
}

// Sum for avg; the caller divides afterwards.
ReduceOp wireOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

}  // namespace

// ---- Ops ----------------------------------------------------------------------------

namespace {

// A rank's block buffer next to the whole (size * blockBytes) buffer: either apart from
// it, or exactly at whole + rank * blockBytes (the in-place convention).
Status checkBlockPlacement(const void* whole, const void* block, std::size_t blockBytes, int rank, int size,
                           const char* message) {
  if (blockBytes == 0) return Status::ok();
  const auto* w = static_cast<const std::byte*>(whole);
  const auto* b = static_cast<const std::byte*>(block);
  const bool overlaps = b < w + blockBytes * static_cast<std::size_t>(size) && w < b + blockBytes;
  if (overlaps && b != w + static_cast<std::size_t>(rank) * blockBytes) return invalidArgument("{}", message);
  return Status::ok();
}

Status finishAvg(const AlgoContext& ctx, void* data, std::size_t count, ReduceOp op) {
  if (op == ReduceOp::kAvg && count > 0) kernels::divideBy(data, count, ctx.dtype, ctx.size);
  return Status::ok();
}

Status argsReduce(const void* send, const void* recv, std::size_t count, DataType dtype, ReduceOp op,
                  const char* what) {
  MERIDIAN_RETURN_IF_ERROR(checkDataType(dtype));
  MERIDIAN_RETURN_IF_ERROR(checkReduceOp(op));
  return checkBuffers(send, recv, count, what);
}

}  // namespace

Communicator::Body Communicator::allreduceBody(const void* send, void* recv, std::size_t count, DataType dtype,
                                                ReduceOp op) {
  const std::size_t small = smallBytes_;
  const std::size_t bytes = count * kernels::dataTypeSize(dtype);
  const Hierarchy* hier = hierarchy_ ? &*hierarchy_ : nullptr;
  const AlgoChoice algo = algoChoice_;
  // Ranks that all share a host exchange through memory: the links the planner weighs are
  // not there, and a direct exchange takes two rounds where a ring takes 2 (n - 1), each
  // waiting for a neighbour that may be off its core. Every rank knows the same masks.
  const bool direct = algo == AlgoChoice::kDirect ||
                      (algo == AlgoChoice::kAuto && allSameHost_ && size_ <= kDirectSameHostMaxRanks && bytes > small);
  HostArena* shm = algo == AlgoChoice::kAuto ? shm_.get() : nullptr;
  return [=](const AlgoContext& ctx, Work&) -> Status {
    if (count == 0) return Status::ok();
    if (shm != nullptr) {
      MERIDIAN_RETURN_IF_ERROR(shm->allreduce(send, recv, count, ctx.dtype, wireOp(op), ctx.deadline));
      return finishAvg(ctx, recv, count, op);
    }
    if (direct) {
      if (send != recv) std::memcpy(recv, send, bytes);
      return directAllreduce(ctx, static_cast<std::byte*>(recv), count, wireOp(op),
                             op == ReduceOp::kAvg ? ctx.size : 0, kDirectWindowBytes);
    }
    // Chosen when the op runs: the plan in force is the same on every rank for this op
    // (plan_sync.h); without one, the built-in choice depends only on the size and knobs.
    Status st;
    if (algo == AlgoChoice::kAuto && ctx.plans != nullptr) {
      st = plannedAllreduce(ctx, send, recv, count, wireOp(op), ctx.plans->forBytes(bytes));
    } else if (algo == AlgoChoice::kHierarchical && hier != nullptr) {
      st = hierarchicalAllreduce(ctx, send, recv, count, wireOp(op), *hier);
    } else if (algo == AlgoChoice::kRecursiveDoubling || (algo == AlgoChoice::kAuto && bytes <= small)) {
      st = recursiveDoublingAllreduce(ctx, send, recv, count, wireOp(op));
    } else {
      st = ringAllreduce(ctx, send, recv, count, wireOp(op));
    }
    MERIDIAN_RETURN_IF_ERROR(st);
    return finishAvg(ctx, recv, count, op);
  };
}

Status Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op) {
  Status invalid = argsReduce(send, recv, count, dtype, op, "allreduce");
  return runSync(OpKind::kAllreduce, dtype, bytesOf(count, dtype), allreduceBody(send, recv, count, dtype, op),
                 std::move(invalid));
}

Communicator::WorkPtr Communicator::allreduceAsync(const void* send, void* recv, std::size_t count, DataType dtype,
                                                   ReduceOp op) {
  Status invalid = argsReduce(send, recv, count, dtype, op, "allreduce");
  return submit(OpKind::kAllreduce, dtype, bytesOf(count, dtype), allreduceBody(send, recv, count, dtype, op),
                std::move(invalid));
}

Status Communicator::reduceScatterArgs(const void* send, const void* recv, std::size_t recvCount, DataType dtype,
                                       ReduceOp op) const {
  MERIDIAN_RETURN_IF_ERROR(argsReduce(send, recv, recvCount, dtype, op, "reduce-scatter"));
  return checkBlockPlacement(send, recv, recvCount * kernels::dataTypeSize(dtype), rank_, size_,
                             "reduce-scatter: recv overlaps send but is not send + rank * recvCount elements");
}

Communicator::Body Communicator::reduceScatterBody(const void* send, void* recv, std::size_t recvCount,
                                                   ReduceOp op) {
  return [=](const AlgoContext& ctx, Work&) -> Status {
    if (recvCount == 0) return Status::ok();
    MERIDIAN_RETURN_IF_ERROR(ringReduceScatter(ctx, send, recv, recvCount, wireOp(op)));
    return finishAvg(ctx, recv, recvCount, op);
  };
}

Status Communicator::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType dtype,
                                   ReduceOp op) {
  Status invalid = reduceScatterArgs(send, recv, recvCount, dtype, op);
  return runSync(OpKind::kReduceScatter, dtype, bytesOf(recvCount, dtype) * static_cast<std::size_t>(size_),
                 reduceScatterBody(send, recv, recvCount, op), std::move(invalid));
}

Communicator::WorkPtr Communicator::reduceScatterAsync(const void* send, void* recv, std::size_t recvCount,
                                                       DataType dtype, ReduceOp op) {
  Status invalid = reduceScatterArgs(send, recv, recvCount, dtype, op);
  return submit(OpKind::kReduceScatter, dtype, bytesOf(recvCount, dtype) * static_cast<std::size_t>(size_),
                reduceScatterBody(send, recv, recvCount, op), std::move(invalid));
}

Status Communicator::allgatherArgs(const void* send, const void* recv, std::size_t sendCount, DataType dtype) const {
  MERIDIAN_RETURN_IF_ERROR(checkDataType(dtype));
  MERIDIAN_RETURN_IF_ERROR(checkBuffers(send, recv, sendCount, "allgather"));
  return checkBlockPlacement(recv, send, sendCount * kernels::dataTypeSize(dtype), rank_, size_,
                             "allgather: send overlaps recv but is not recv + rank * sendCount elements");
}

Status Communicator::allgather(const void* send, void* recv, std::size_t sendCount, DataType dtype) {
  Status invalid = allgatherArgs(send, recv, sendCount, dtype);
  return runSync(OpKind::kAllgather, dtype, bytesOf(sendCount, dtype) * static_cast<std::size_t>(size_),
                 [=](const AlgoContext& ctx, Work&) {
                   return sendCount == 0 ? Status::ok() : ringAllgather(ctx, send, recv, sendCount);
                 },
                 std::move(invalid));
}

Communicator::WorkPtr Communicator::allgatherAsync(const void* send, void* recv, std::size_t sendCount,
                                                   DataType dtype) {
  Status invalid = allgatherArgs(send, recv, sendCount, dtype);
  return submit(OpKind::kAllgather, dtype, bytesOf(sendCount, dtype) * static_cast<std::size_t>(size_),
                [=](const AlgoContext& ctx, Work&) {
                  return sendCount == 0 ? Status::ok() : ringAllgather(ctx, send, recv, sendCount);
                },
                std::move(invalid));
}

Status Communicator::rootArgs(int root, const char* what) const {
  if (root < 0 || root >= size_) return invalidArgument("{}: root {} out of range [0, {})", what, root, size_);
  return Status::ok();
}

Communicator::Body Communicator::broadcastBody(const void* send, void* recv, std::size_t count, int root) {
  const std::size_t small = smallBytes_;
  return [=](const AlgoContext& ctx, Work&) -> Status {
    if (count == 0) return Status::ok();
    return count * ctx.elemBytes <= small ? binomialBroadcast(ctx, send, recv, count, root)
                                          : chainBroadcast(ctx, send, recv, count, root);
  };
}

Status Communicator::broadcastArgs(const void* send, const void* recv, std::size_t count, DataType dtype,
                                   int root) const {
  MERIDIAN_RETURN_IF_ERROR(checkDataType(dtype));
  MERIDIAN_RETURN_IF_ERROR(rootArgs(root, "broadcast"));
  if (count > 0 && (recv == nullptr || (rank_ == root && send == nullptr))) {
    return invalidArgument("broadcast: null buffer with count {}", count);
  }
  return Status::ok();
}

Status Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root) {
  Status invalid = broadcastArgs(send, recv, count, dtype, root);
  return runSync(OpKind::kBroadcast, dtype, bytesOf(count, dtype), broadcastBody(send, recv, count, root),
                 std::move(invalid));
}

Communicator::WorkPtr Communicator::broadcastAsync(const void* send, void* recv, std::size_t count, DataType dtype,
                                                   int root) {
  Status invalid = broadcastArgs(send, recv, count, dtype, root);
  return submit(OpKind::kBroadcast, dtype, bytesOf(count, dtype), broadcastBody(send, recv, count, root),
                std::move(invalid));
}

Status Communicator::reduceArgs(const void* send, const void* recv, std::size_t count, DataType dtype, ReduceOp op,
                                int root) const {
  MERIDIAN_RETURN_IF_ERROR(checkDataType(dtype));
  MERIDIAN_RETURN_IF_ERROR(checkReduceOp(op));
  MERIDIAN_RETURN_IF_ERROR(rootArgs(root, "reduce"));
  if (count > 0 && (send == nullptr || (rank_ == root && recv == nullptr))) {
    return invalidArgument("reduce: null buffer with count {}", count);
  }
  return Status::ok();
}

Communicator::Body Communicator::reduceBody(const void* send, void* recv, std::size_t count, ReduceOp op, int root) {
  const std::size_t small = smallBytes_;
  return [=](const AlgoContext& ctx, Work&) -> Status {
    if (count == 0) return Status::ok();
    Status st = count * ctx.elemBytes <= small ? binomialReduce(ctx, send, recv, count, wireOp(op), root)
                                               : ringReduce(ctx, send, recv, count, wireOp(op), root);
    MERIDIAN_RETURN_IF_ERROR(st);
    return ctx.rank == root ? finishAvg(ctx, recv, count, op) : Status::ok();
  };
}

Status Communicator::reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root) {
  Status invalid = reduceArgs(send, recv, count, dtype, op, root);
  return runSync(OpKind::kReduce, dtype, bytesOf(count, dtype), reduceBody(send, recv, count, op, root),
                 std::move(invalid));
}

Communicator::WorkPtr Communicator::reduceAsync(const void* send, void* recv, std::size_t count, DataType dtype,
                                                ReduceOp op, int root) {
  Status invalid = reduceArgs(send, recv, count, dtype, op, root);
  return submit(OpKind::kReduce, dtype, bytesOf(count, dtype), reduceBody(send, recv, count, op, root),
                std::move(invalid));
}

Communicator::Body Communicator::barrierBody() {
  HostArena* shm = algoChoice_ == AlgoChoice::kAuto ? shm_.get() : nullptr;
  return [shm](const AlgoContext& ctx, Work&) {
    return shm != nullptr ? shm->barrier(ctx.deadline) : disseminationBarrier(ctx);
  };
}

Status Communicator::barrier() { return runSync(OpKind::kBarrier, DataType::kF32, 0, barrierBody(), Status::ok()); }

Communicator::WorkPtr Communicator::barrierAsync() {
  return submit(OpKind::kBarrier, DataType::kF32, 0, barrierBody(), Status::ok());
}

// ---- Point to point -------------------------------------------------------------------

Status Communicator::p2pArgs(const void* buf, std::size_t count, DataType dtype, int peer) const {
  MERIDIAN_RETURN_IF_ERROR(checkDataType(dtype));
  MERIDIAN_RETURN_IF_ERROR(checkPeer(peer));
  if (count > 0 && buf == nullptr) return invalidArgument("null buffer with count {}", count);
  return Status::ok();
}

namespace {

// Waits for a point-to-point request. A failure of the peer (not a too-small receive
// buffer, which is the caller's) is a peer error.
Status waitP2p(const transport::RequestPtr& req, TimePoint deadline, const char* what, int peer) {
  Status st = req->wait(deadline);
  if (st.code() == StatusCode::kTimeout && !req->done()) {
    return timeoutError("{} with rank {} did not finish within the op timeout "
                        "(CommOptions::timeout or MERIDIAN_TIMEOUT_MS)",
                        what, peer);
  }
  return st.withContext(fmt::format("{} with rank {}", what, peer));
}

}  // namespace

Communicator::Body Communicator::p2pBody(bool isSend, void* buf, std::size_t bytes, int peer, std::uint32_t tag,
                                         bool sync) {
  return [=](const AlgoContext& ctx, Work& work) -> Status {
    const transport::ChannelPtr& ch = ctx.channels[static_cast<std::size_t>(peer)];
    auto req = isSend ? ch->isend(buf, bytes, kP2pTagBit | tag) : ch->irecv(buf, bytes, kP2pTagBit | tag);
    if (!req.isOk()) return req.status();
    ctx.tracker->add(req.value());
    if (!sync) {
      work.deferUntil({std::move(req).value()});
      return Status::ok();
    }
    return waitP2p(req.value(), ctx.deadline, isSend ? "send" : "recv", peer);
  };
}

Status Communicator::send(const void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag) {
  Status invalid = p2pArgs(buf, count, dtype, peer);
  return runSync(OpKind::kSend, dtype, bytesOf(count, dtype),
                 p2pBody(true, const_cast<void*>(buf), bytesOf(count, dtype), peer, tag, true), std::move(invalid));
}

Communicator::WorkPtr Communicator::sendAsync(const void* buf, std::size_t count, DataType dtype, int peer,
                                              std::uint32_t tag) {
  Status invalid = p2pArgs(buf, count, dtype, peer);
  return submit(OpKind::kSend, dtype, bytesOf(count, dtype),
                p2pBody(true, const_cast<void*>(buf), bytesOf(count, dtype), peer, tag, false), std::move(invalid));
}

Status Communicator::recv(void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag) {
  Status invalid = p2pArgs(buf, count, dtype, peer);
  return runSync(OpKind::kRecv, dtype, bytesOf(count, dtype),
                 p2pBody(false, buf, bytesOf(count, dtype), peer, tag, true), std::move(invalid));
}

Communicator::WorkPtr Communicator::recvAsync(void* buf, std::size_t count, DataType dtype, int peer,
                                              std::uint32_t tag) {
  Status invalid = p2pArgs(buf, count, dtype, peer);
  return submit(OpKind::kRecv, dtype, bytesOf(count, dtype),
                p2pBody(false, buf, bytesOf(count, dtype), peer, tag, false), std::move(invalid));
}

}  // namespace meridian::collectives
