// Reduce to a root: a binomial tree for small messages; for large ones a ring
// reduce-scatter (every rank finishes one block, segment-pipelined) followed by a gather
// of the blocks to the root, which moves 2(n-1)/n of the data per rank instead of log(n)
// whole copies.
#include <cstring>

#include "collectives/algorithms/algorithm.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

Status binomialReduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                      int root) {
  const std::size_t bytes = count * ctx.elemBytes;
  const int n = ctx.size;
  const bool isRoot = ctx.rank == root;
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, bytes);
    return Status::ok();
  }
  std::byte* tmp = ctx.scratch->reserve(alignUp(bytes) * 2);
  void* acc = isRoot ? recv : tmp + alignUp(bytes);
  const void* cur = send;
  const int vr = modRank(ctx.rank - root, n);
  for (int mask = 1; mask < n; mask <<= 1) {
    if ((vr & mask) == 0) {
      const int child = vr | mask;
      if (child >= n) continue;
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postRecv(ctx, modRank(child + root, n), tmp, bytes, 0));
      MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, req, bytes, "binomial reduce receive"));
      kernels::reduce(acc, cur, tmp, count, ctx.dtype, op);
      cur = acc;
    } else {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                                postSend(ctx, modRank((vr & ~mask) + root, n), cur, bytes, 0));
      return waitRequest(ctx, req, kAnyBytes, "binomial reduce send");
    }
  }
  // Only the root gets here, and with n >= 2 it always had a child: cur == recv.
  return Status::ok();
}

Status ringReduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                  int root) {
  const std::size_t es = ctx.elemBytes;
  const int n = ctx.size;
  const bool isRoot = ctx.rank == root;
  if (n == 1) {
    if (send != recv) std::memmove(recv, send, count * es);
    return Status::ok();
  }
  const BlockSplit blocks{count, n};
  const std::size_t slotBytes = alignUp(ringReduceScatterSlotBytes(ctx, false));
  const std::size_t ownBytes = blocks.size(ctx.rank) * es;
  std::byte* scratch = ctx.scratch->reserve(slotBytes + (isRoot ? 0 : alignUp(ownBytes)));

  RingReduceScatterPass rs;
  rs.slots = scratch;
  rs.src = static_cast<const std::byte*>(send);
  rs.accum = nullptr;
  rs.finalOut = isRoot ? static_cast<std::byte*>(recv) + blocks.offset(ctx.rank) * es : scratch + slotBytes;
  rs.blocks = blocks;
  rs.offset = -1;  // this rank finishes block rank
  rs.op = op;
  rs.phase = 0;
  MERIDIAN_RETURN_IF_ERROR(runRingReduceScatter(ctx, rs));

  // Gather the finished blocks to the root (phase 2).
  if (!isRoot) {
    if (ownBytes == 0) return Status::ok();
    MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postSend(ctx, root, rs.finalOut, ownBytes, 2));
    return waitRequest(ctx, req, kAnyBytes, "ring reduce gather send");
  }
  std::vector<transport::RequestPtr> reqs(static_cast<std::size_t>(n));
  for (int b = 0; b < n; ++b) {
    if (b == root || blocks.size(b) == 0) continue;
    MERIDIAN_ASSIGN_OR_RETURN(reqs[static_cast<std::size_t>(b)],
                              postRecv(ctx, b, static_cast<std::byte*>(recv) + blocks.offset(b) * es,
                                       blocks.size(b) * es, 2));
  }
  Status first;
  for (int b = 0; b < n; ++b) {
    const auto& req = reqs[static_cast<std::size_t>(b)];
    if (!req) continue;
    Status st = waitRequest(ctx, req, blocks.size(b) * es, "ring reduce gather receive");
    if (!st.isOk() && first.isOk()) first = st;
  }
  return first;
}

}  // namespace meridian::collectives
