// What every collective algorithm sees: an AlgoContext (channels to the other ranks,
// element type, the op's tag space, deadline and scratch) and small helpers over the
// abstract transport. Algorithms are free functions, one file per family; they never
// know which backend carries their messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "kernels/types.h"
#include "routing/planner.h"
#include "transport/channel.h"
#include "transport/request.h"

namespace meridian::collectives {

// ScratchArena: one growable, pre-touched byte buffer owned by a communicator. Grown
// (never shrunk) on demand; growth allocates once and memsets the new pages so the hot
// path never takes a page fault. Only the thread running the communicator's current op
// uses it.
class ScratchArena {
 public:
  ScratchArena() = default;
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // A buffer of at least `bytes` bytes, 64-byte aligned, valid until the next reserve().
  std::byte* reserve(std::size_t bytes);
  std::size_t capacityBytes() const { return capacity_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t capacity_ = 0;
};

// Every transport request an op posted, so that a failed op can be torn down safely: an
// algorithm that hits an error returns at once, possibly with requests still in flight on
// the caller's buffers or scratch, and the communicator then stops the transport and
// completes whatever is left. Finished requests are pruned as it grows. Used by the
// thread running the op only.
class RequestTracker {
 public:
  void add(transport::RequestPtr req);
  void clear() { reqs_.clear(); }
  // Moves the unfinished requests out.
  std::vector<transport::RequestPtr> takeUnfinished();

 private:
  void prune();
  std::vector<transport::RequestPtr> reqs_;
  std::size_t pruneAt_ = 64;
};

// The context of one collective op on one rank.
struct AlgoContext {
  int rank = 0;
  int size = 1;
  std::span<const transport::ChannelPtr> channels;  // indexed by rank; [rank] is null
  kernels::DataType dtype = kernels::DataType::kF32;
  std::size_t elemBytes = 4;
  std::uint64_t tagBase = 0;          // this op's tags are tagBase + phase (phase < kPhasesPerOp)
  TimePoint deadline = TimePoint::max();
  ScratchArena* scratch = nullptr;
  RequestTracker* tracker = nullptr;   // postSend/postRecv register here when set
  std::size_t segmentBytes = 1 << 20;  // ring / chain pipelining segment (>= elemBytes)
  const routing::PlanTable* plans = nullptr;  // the plan in force for this collective (null: built-in)

  // Segment size in whole elements (at least one).
  std::size_t segmentElems() const {
    std::size_t e = segmentBytes / elemBytes;
    return e == 0 ? 1 : e;
  }
};

inline constexpr std::uint64_t kPhasesPerOp = 256;

// A context over a subset or renumbering of the ranks: member i of `members` (global ranks,
// each at most once, including ctx.rank) plays rank i, and the sub-context's phases start at
// `phaseOffset` inside the op's tag space. Algorithms run on it unchanged.
class SubContext {
 public:
  SubContext(const AlgoContext& parent, const std::vector<int>& members, std::uint64_t phaseOffset);
  SubContext(const SubContext&) = delete;
  SubContext& operator=(const SubContext&) = delete;
  // invalidArgument when a member is out of range or ctx.rank is not one of them.
  const Status& status() const { return status_; }
  const AlgoContext& ctx() const { return ctx_; }

 private:
  std::vector<transport::ChannelPtr> channels_;
  AlgoContext ctx_;
  Status status_;
};

// How far the pipelined algorithms run ahead, in segments, sized by bytes so that a tiny
// test segment still pipelines and a long fat (cross-region) link still fills: a send
// completes only once the peer acknowledged it, one round trip later.
struct PipelineWindows {
  static constexpr std::size_t kMaxSegments = 64;
  std::size_t recvAhead;   // receives posted ahead (~8 MiB)
  std::size_t sumSlots;    // reduced segments in flight out of scratch (~16 MiB)
  std::size_t sendsAhead;  // sends in flight straight out of the caller's buffer (~64 MiB)
};
PipelineWindows pipelineWindows(const AlgoContext& ctx);

// Splits `count` elements into `parts` blocks whose sizes differ by at most one (the
// first count % parts blocks are one larger). Offsets and sizes are in elements.
struct BlockSplit {
  std::size_t count = 0;
  int parts = 1;
  std::size_t offset(int b) const {
    std::size_t q = count / parts, r = count % parts, ub = static_cast<std::size_t>(b);
    return ub * q + (ub < r ? ub : r);
  }
  std::size_t size(int b) const {
    std::size_t q = count / parts, r = count % parts;
    return q + (static_cast<std::size_t>(b) < r ? 1 : 0);
  }
};

// Scratch slots start on 64-byte boundaries (cache lines, vector loads).
inline std::size_t alignUp(std::size_t v) { return (v + 63) / 64 * 64; }

inline int modRank(long long r, int n) {
  long long m = r % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

// ---- Transport helpers: every message of an op is tagged tagBase + phase ----------------

Result<transport::RequestPtr> postSend(const AlgoContext& ctx, int peer, const void* data, std::size_t bytes,
                                       std::uint64_t phase);
Result<transport::RequestPtr> postRecv(const AlgoContext& ctx, int peer, void* data, std::size_t bytes,
                                       std::uint64_t phase);
// Waits for a request until the op's deadline; for a receive, also checks that exactly
// `expectBytes` arrived (a different size means the ranks disagree about the op).
inline constexpr std::size_t kAnyBytes = static_cast<std::size_t>(-1);
Status waitRequest(const AlgoContext& ctx, const transport::RequestPtr& req, std::size_t expectBytes,
                   const char* what);
// Sends and receives one message concurrently and waits for both.
Status sendRecv(const AlgoContext& ctx, int sendPeer, const void* sendData, std::size_t sendBytes, int recvPeer,
                void* recvData, std::size_t recvBytes, std::uint64_t phase);

// Outstanding sends of an op: reaped as they finish, all waited for at the end so no
// buffer is still in use when the op returns.
class SendQueue {
 public:
  explicit SendQueue(const AlgoContext& ctx) : ctx_(ctx) {}
  void push(transport::RequestPtr req);
  std::size_t inFlight();  // reaps finished ones first
  // Waits for the oldest outstanding send.
  Status waitOldest();
  Status waitAll();

 private:
  const AlgoContext& ctx_;
  std::deque<transport::RequestPtr> reqs_;
  Status firstError_;
};

// ---- Algorithms (counts in elements; `op` is never kAvg here: the caller reduces with
// kSum and divides) ---------------------------------------------------------------------

// allreduce.cc / ring.cc / recursive_doubling.cc
Status ringAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op);

// Ranks grouped by region (every rank once, groups of equal size, each in ring order), and
// the order of the groups for the cross-region rings (empty: group order).
struct Hierarchy {
  std::vector<std::vector<int>> groups;
  std::vector<int> crossOrder;
};
Status validateHierarchy(const Hierarchy& h, int worldSize);
// Reduce-scatter in each group, allreduce across groups between equal local indices (a
// direct exchange up to routing::kDirectCrossMaxRegions groups, else a ring in crossOrder),
// allgather in each group (hierarchical.cc).
Status hierarchicalAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count,
                             kernels::ReduceOp op, const Hierarchy& h);
// Allreduce as the planner's `plan` says (routing/planner.h); the plan must have passed
// routing::validatePlan for ctx.size ranks (planned.cc):
//  - kRing / kHalvingDoubling: ringAllreduce / recursiveDoublingAllreduce on the ranks
//    renumbered by plan.ringOrder;
//  - kTree: binomial reduce to plan.root and binomial broadcast back, on that numbering;
//  - kHierarchical: hierarchicalAllreduce over plan.groups and plan.crossOrder;
//  - kParameterServer: starAllreduce through the hub plan.root.
Status plannedAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count,
                        kernels::ReduceOp op, const routing::Plan& plan);
// Parameter-server allreduce: every rank streams its vector to `hub` in segments, the hub
// reduces each segment as soon as every rank's copy arrived and streams the result back.
Status starAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                     int hub);
// Direct-exchange allreduce for few ranks (the hierarchical cross-region step, and every
// allreduce of a group whose ranks all share one host): each rank sends every peer that
// peer's piece of `data`, reduces the pieces it got into its own, divides its piece by
// `divisor` when that is above 1 (an average, divided once by the owner), and sends the
// reduced piece to every peer. Two rounds per window of `windowBytes` (one after the other,
// bounding the scratch on one host; 0: the whole message in one window, as the WAN step
// wants, where a window costs round trips), every pair busy at once, against a ring's
// 2 (n - 1) dependent steps. In place in `data`.
inline constexpr std::size_t kDirectWindowBytes = std::size_t{8} << 20;
// Up to this many ranks on one host (a host's GPU count), auto picks the direct exchange for
// them; beyond it each rank's (n - 1) pieces per window get small and many.
inline constexpr int kDirectSameHostMaxRanks = 8;
Status directAllreduce(const AlgoContext& ctx, std::byte* data, std::size_t count, kernels::ReduceOp op,
                       std::int64_t divisor, std::size_t windowBytes);
Status recursiveDoublingAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count,
                                  kernels::ReduceOp op);
// send holds size * recvCount elements; rank r gets block r reduced.
Status ringReduceScatter(const AlgoContext& ctx, const void* send, void* recv, std::size_t recvCount,
                         kernels::ReduceOp op);
// recv holds size * sendCount elements; rank r's contribution lands at block r.
Status ringAllgather(const AlgoContext& ctx, const void* send, void* recv, std::size_t sendCount);

// broadcast.cc: recv receives root's data (root: send, copied to recv when they differ).
Status binomialBroadcast(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, int root);
Status chainBroadcast(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, int root);

// reduce.cc: the reduction lands in root's recv; other ranks' recv is not touched.
Status binomialReduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                      int root);
Status ringReduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                  int root);

// barrier.cc
Status disseminationBarrier(const AlgoContext& ctx);

// ---- Ring passes shared by the ring algorithms (ring.cc) ------------------------------

// One reduce-scatter pass over `blocks` (size() blocks). At step s (0..n-2) a rank sends
// block rank+offset-s and receives block rank+offset-s-1; each received segment is reduced
// with the rank's own contribution (src) and forwarded at once. The block finishing at the
// last step, rank+offset+1, ends in `finalOut` (its own pointer, block-relative). When
// `accum` is set, intermediate sums are written there (n blocks, may equal src); otherwise
// they live in scratch slots.
struct RingReduceScatterPass {
  std::byte* slots = nullptr;  // ringReduceScatterSlotBytes(ctx, accum != nullptr) of scratch
  const std::byte* src = nullptr;
  std::byte* accum = nullptr;
  std::byte* finalOut = nullptr;
  BlockSplit blocks;
  int offset = 0;
  kernels::ReduceOp op = kernels::ReduceOp::kSum;
  std::uint64_t phase = 0;
};
Status runRingReduceScatter(const AlgoContext& ctx, const RingReduceScatterPass& pass);
std::size_t ringReduceScatterSlotBytes(const AlgoContext& ctx, bool haveAccum);

// One allgather pass over buf (n blocks): at step s a rank sends block rank+offset-s and
// receives block rank+offset-s-1 straight into buf, forwarding each segment as it lands.
// prepostFirstStep() posts the first step's receives early (block rank+offset-1 must then
// be left alone until run()); run() does the pass. Both are called on the op's thread.
class RingAllgather {
 public:
  RingAllgather(const AlgoContext& ctx, std::byte* buf, const BlockSplit& blocks, int offset, std::uint64_t phase);
  ~RingAllgather();
  RingAllgather(const RingAllgather&) = delete;
  RingAllgather& operator=(const RingAllgather&) = delete;

  Status prepostFirstStep();
  Status run();

 private:
  std::byte* segmentPtr(int block, std::size_t seg) const;
  // Posts receives in ring order until `limit` are posted (stopping at the end of step 0
  // when firstStepOnly).
  Status postUpTo(std::size_t limit, bool firstStepOnly);

  // Receives land in place, so they are posted as far ahead as requests allow: a
  // neighbour that runs ahead then never has its segments buffered.
  static constexpr std::size_t kPostAhead = PipelineWindows::kMaxSegments;
  struct Schedule;  // the ring schedule and the cursor of the next receive to post
  const AlgoContext& ctx_;
  std::byte* buf_;
  std::uint64_t phase_;
  std::unique_ptr<Schedule> sched_;
  std::size_t posted_ = 0;
  transport::RequestPtr recvReqs_[PipelineWindows::kMaxSegments];
};

}  // namespace meridian::collectives
