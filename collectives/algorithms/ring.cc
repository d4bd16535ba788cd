// Ring algorithms: allreduce (reduce-scatter then allgather), reduce-scatter and
// allgather, all segment-pipelined. A step's block is cut into segments of
// ctx.segmentBytes; receives for the next segments (pipelineWindows) are posted ahead, and each
// segment is reduced (or just kept) and forwarded to the next rank the moment it lands,
// so the transfer of segment j+1 overlaps the reduction of segment j.
#include <cstring>

#include "collectives/algorithms/algorithm.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

namespace {

// Which block moves at which step of a ring pass, and how blocks cut into segments.
struct RingSchedule {
  BlockSplit blocks;
  int rank = 0;
  int n = 1;
  int offset = 0;
  std::size_t segElems = 1;

  int lastStep() const { return n - 2; }
  int sendBlock0() const { return modRank(static_cast<long long>(rank) + offset, n); }
  int recvBlock(int step) const { return modRank(static_cast<long long>(rank) + offset - step - 1, n); }
  std::size_t segments(int block) const { return (blocks.size(block) + segElems - 1) / segElems; }
  // Elements of segment `seg` of `block` (its offset inside the block is seg * segElems).
  std::size_t segmentElems(int block, std::size_t seg) const {
    std::size_t left = blocks.size(block) - seg * segElems;
    return left < segElems ? left : segElems;
  }
  std::size_t totalRecvSegments() const {
    std::size_t total = 0;
    for (int s = 0; s <= lastStep(); ++s) total += segments(recvBlock(s));
    return total;
  }
};

// Walks the received segments in order: (step, segment), skipping empty blocks.
struct RingCursor {
  const RingSchedule* sched;
  int step = 0;
  std::size_t seg = 0;

  explicit RingCursor(const RingSchedule& s) : sched(&s) { skipEmpty(); }
  int block() const { return sched->recvBlock(step); }
  void advance() {
    ++seg;
    skipEmpty();
  }

 private:
  void skipEmpty() {
    while (step <= sched->lastStep() && seg >= sched->segments(sched->recvBlock(step))) {
      ++step;
      seg = 0;
    }
  }
};

// Step 0 travels under `phase`, later steps under phase + 1: step-0 segments are paced by
// the sender's progress and may interleave with its later-step segments.
std::uint64_t stepPhase(std::uint64_t phase, int step) { return step == 0 ? phase : phase + 1; }

// Issues this rank's own step-0 segments, paced so that at most recvAhead of them run
// ahead of the segments processed (the neighbours progress at the same rate, so this
// bounds what the next rank must buffer as unexpected).
class StepZeroSender {
 public:
  StepZeroSender(const AlgoContext& ctx, const RingSchedule& sched, const std::byte* base, std::uint64_t phase,
                 SendQueue& sends)
      : ctx_(ctx), sched_(sched), block_(sched.sendBlock0()), total_(sched.segments(block_)), base_(base),
        phase_(phase), sends_(sends) {}

  Status sendUpTo(std::size_t limit) {
    const int next = modRank(ctx_.rank + 1, ctx_.size);
    while (sent_ < total_ && sent_ < limit) {
      std::size_t elemOff = sched_.blocks.offset(block_) + sent_ * sched_.segElems;
      std::size_t bytes = sched_.segmentElems(block_, sent_) * ctx_.elemBytes;
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                                postSend(ctx_, next, base_ + elemOff * ctx_.elemBytes, bytes, phase_));
      sends_.push(std::move(req));
      ++sent_;
    }
    return Status::ok();
  }
  Status finish() { return sendUpTo(total_); }

 private:
  const AlgoContext& ctx_;
  const RingSchedule& sched_;
  int block_;
  std::size_t total_;
  const std::byte* base_;
  std::uint64_t phase_;
  SendQueue& sends_;
  std::size_t sent_ = 0;
};

}  // namespace

std::size_t ringReduceScatterSlotBytes(const AlgoContext& ctx, bool haveAccum) {
  const PipelineWindows w = pipelineWindows(ctx);
  return ctx.segmentElems() * ctx.elemBytes * (w.recvAhead + (haveAccum ? 0 : w.sumSlots));
}

Status runRingReduceScatter(const AlgoContext& ctx, const RingReduceScatterPass& pass) {
  const RingSchedule sched{pass.blocks, ctx.rank, ctx.size, pass.offset, ctx.segmentElems()};
  const int prev = modRank(ctx.rank - 1, ctx.size);
  const int next = modRank(ctx.rank + 1, ctx.size);
  const std::size_t es = ctx.elemBytes;
  const std::size_t segBytes = sched.segElems * es;
  const std::size_t total = sched.totalRecvSegments();
  const PipelineWindows w = pipelineWindows(ctx);
  std::byte* recvSlots = pass.slots;
  std::byte* sumSlots = pass.slots + w.recvAhead * segBytes;  // used only without accum

  SendQueue sends(ctx);
  StepZeroSender stepZero(ctx, sched, pass.src, stepPhase(pass.phase, 0), sends);
  transport::RequestPtr recvReqs[PipelineWindows::kMaxSegments];
  transport::RequestPtr sumSends[PipelineWindows::kMaxSegments];  // sends out of sumSlots, per slot
  RingCursor postCur(sched), procCur(sched);
  std::size_t posted = 0;

  for (std::size_t done = 0; done < total; ++done) {
    // Receives first: the previous rank may be sending already, and what finds its receive
    // posted lands in place instead of in a buffer.
    for (; posted < total && posted < done + w.recvAhead; ++posted, postCur.advance()) {
      MERIDIAN_ASSIGN_OR_RETURN(recvReqs[posted % w.recvAhead],
                                postRecv(ctx, prev, recvSlots + (posted % w.recvAhead) * segBytes, segBytes,
                                         stepPhase(pass.phase, postCur.step)));
    }
    MERIDIAN_RETURN_IF_ERROR(stepZero.sendUpTo(done + w.recvAhead));

    const std::size_t slot = done % w.recvAhead;
    const std::size_t sumSlot = done % w.sumSlots;
    const int block = procCur.block();
    const std::size_t inBlock = procCur.seg * sched.segElems;
    const std::size_t elems = sched.segmentElems(block, procCur.seg);
    const std::size_t at = (pass.blocks.offset(block) + inBlock) * es;
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, recvReqs[slot], elems * es, "ring reduce-scatter receive"));
    recvReqs[slot].reset();

    const bool last = procCur.step == sched.lastStep();
    std::byte* out;
    if (last) {
      out = pass.finalOut + inBlock * es;
    } else if (pass.accum != nullptr) {
      out = pass.accum + at;
    } else {
      out = sumSlots + sumSlot * segBytes;
      if (sumSends[sumSlot]) {  // this slot's previous sum must be delivered before reuse
        MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, sumSends[sumSlot], kAnyBytes, "ring reduce-scatter send"));
        sumSends[sumSlot].reset();
      }
    }
    kernels::reduce(out, pass.src + at, recvSlots + slot * segBytes, elems, ctx.dtype, pass.op);
    if (!last) {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                                postSend(ctx, next, out, elems * es, stepPhase(pass.phase, procCur.step + 1)));
      if (pass.accum == nullptr) {
        sumSends[sumSlot] = std::move(req);
      } else {
        sends.push(std::move(req));
      }
    }
    procCur.advance();
    sends.inFlight();  // reap
  }
  MERIDIAN_RETURN_IF_ERROR(stepZero.finish());
  for (auto& req : sumSends) {
    if (req) MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, req, kAnyBytes, "ring reduce-scatter send"));
  }
  return sends.waitAll();
}

struct RingAllgather::Schedule {
  RingSchedule ring;
  RingCursor post;
  Schedule(const RingSchedule& r) : ring(r), post(ring) {}
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;
};

RingAllgather::RingAllgather(const AlgoContext& ctx, std::byte* buf, const BlockSplit& blocks, int offset,
                             std::uint64_t phase)
    : ctx_(ctx), buf_(buf), phase_(phase),
      sched_(std::make_unique<Schedule>(RingSchedule{blocks, ctx.rank, ctx.size, offset, ctx.segmentElems()})) {}

RingAllgather::~RingAllgather() = default;

std::byte* RingAllgather::segmentPtr(int block, std::size_t seg) const {
  return buf_ + (sched_->ring.blocks.offset(block) + seg * sched_->ring.segElems) * ctx_.elemBytes;
}

Status RingAllgather::postUpTo(std::size_t limit, bool firstStepOnly) {
  const RingSchedule& sched = sched_->ring;
  RingCursor& cur = sched_->post;
  const int prev = modRank(ctx_.rank - 1, ctx_.size);
  const std::size_t window = kPostAhead;
  for (; posted_ < limit && cur.step <= sched.lastStep(); ++posted_, cur.advance()) {
    if (firstStepOnly && cur.step != 0) break;
    std::size_t bytes = sched.segmentElems(cur.block(), cur.seg) * ctx_.elemBytes;
    MERIDIAN_ASSIGN_OR_RETURN(recvReqs_[posted_ % window], postRecv(ctx_, prev, segmentPtr(cur.block(), cur.seg),
                                                                    bytes, stepPhase(phase_, cur.step)));
  }
  return Status::ok();
}

Status RingAllgather::prepostFirstStep() {
  if (ctx_.size == 1) return Status::ok();
  return postUpTo(kPostAhead, true);
}

Status RingAllgather::run() {
  if (ctx_.size == 1) return Status::ok();
  const RingSchedule& sched = sched_->ring;
  const int next = modRank(ctx_.rank + 1, ctx_.size);
  const std::size_t es = ctx_.elemBytes;
  const std::size_t total = sched.totalRecvSegments();
  const PipelineWindows w = pipelineWindows(ctx_);
  SendQueue sends(ctx_);
  StepZeroSender stepZero(ctx_, sched, buf_, stepPhase(phase_, 0), sends);
  RingCursor procCur(sched);

  for (std::size_t done = 0; done < total; ++done) {
    MERIDIAN_RETURN_IF_ERROR(postUpTo(done + kPostAhead, false));
    MERIDIAN_RETURN_IF_ERROR(stepZero.sendUpTo(done + w.recvAhead));
    const std::size_t slot = done % kPostAhead;
    const std::size_t bytes = sched.segmentElems(procCur.block(), procCur.seg) * es;
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx_, recvReqs_[slot], bytes, "ring allgather receive"));
    recvReqs_[slot].reset();
    if (procCur.step != sched.lastStep()) {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                                postSend(ctx_, next, segmentPtr(procCur.block(), procCur.seg), bytes,
                                         stepPhase(phase_, procCur.step + 1)));
      sends.push(std::move(req));
    }
    procCur.advance();
    sends.inFlight();
  }
  MERIDIAN_RETURN_IF_ERROR(stepZero.finish());
  return sends.waitAll();
}

Status ringAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op) {
  auto* out = static_cast<std::byte*>(recv);
  const auto* in = static_cast<const std::byte*>(send);
  if (ctx.size == 1) {
    if (in != out) std::memcpy(out, in, count * ctx.elemBytes);
    return Status::ok();
  }
  const BlockSplit blocks{count, ctx.size};
  // The allgather (offset 1) first receives block `rank`, which the reduce-scatter below
  // never writes: post those receives now, so that a neighbour that finishes its
  // reduce-scatter first sends straight into place rather than into a buffer.
  RingAllgather allgather(ctx, out, blocks, 1, 2);
  MERIDIAN_RETURN_IF_ERROR(allgather.prepostFirstStep());
  RingReduceScatterPass rs;
  rs.slots = ctx.scratch->reserve(ringReduceScatterSlotBytes(ctx, true));
  rs.src = in;
  rs.accum = out;
  // With offset 0 this rank finishes block rank+1, which the allgather (offset 1) sends first.
  rs.finalOut = out + blocks.offset(modRank(ctx.rank + 1, ctx.size)) * ctx.elemBytes;
  rs.blocks = blocks;
  rs.offset = 0;
  rs.op = op;
  rs.phase = 0;
  MERIDIAN_RETURN_IF_ERROR(runRingReduceScatter(ctx, rs));
  return allgather.run();
}

Status ringReduceScatter(const AlgoContext& ctx, const void* send, void* recv, std::size_t recvCount,
                         kernels::ReduceOp op) {
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t blockBytes = recvCount * ctx.elemBytes;
  if (ctx.size == 1) {
    if (in != out) std::memmove(out, in, blockBytes);
    return Status::ok();
  }
  RingReduceScatterPass rs;
  rs.slots = ctx.scratch->reserve(ringReduceScatterSlotBytes(ctx, false));
  rs.src = in;
  rs.accum = nullptr;
  rs.finalOut = out;  // offset -1: this rank finishes block rank
  rs.blocks = BlockSplit{recvCount * static_cast<std::size_t>(ctx.size), ctx.size};
  rs.offset = -1;
  rs.op = op;
  rs.phase = 0;
  return runRingReduceScatter(ctx, rs);
}

Status ringAllgather(const AlgoContext& ctx, const void* send, void* recv, std::size_t sendCount) {
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t blockBytes = sendCount * ctx.elemBytes;
  std::byte* own = out + static_cast<std::size_t>(ctx.rank) * blockBytes;
  if (send != own) std::memmove(own, send, blockBytes);
  if (ctx.size == 1) return Status::ok();
  return RingAllgather(ctx, out, BlockSplit{sendCount * static_cast<std::size_t>(ctx.size), ctx.size}, 0, 0).run();
}

}  // namespace meridian::collectives
