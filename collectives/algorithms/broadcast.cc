// Broadcast: a binomial tree for small messages (log2(n) hops of the whole message) and
// a pipelined chain for large ones (root -> root+1 -> ...; every rank forwards each
// segment the moment it lands, so the chain streams at link rate after n-1 segments).
#include <cstring>

#include "collectives/algorithms/algorithm.h"

namespace meridian::collectives {

Status binomialBroadcast(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, int root) {
  const std::size_t bytes = count * ctx.elemBytes;
  const int n = ctx.size;
  if (ctx.rank == root && send != recv) std::memmove(recv, send, bytes);
  if (n == 1) return Status::ok();
  const int vr = modRank(ctx.rank - root, n);
  int mask = 1;
  while (mask < n) {
    if ((vr & mask) != 0) {
      const int from = modRank(vr - mask + root, n);
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postRecv(ctx, from, recv, bytes, 0));
      MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, req, bytes, "binomial broadcast receive"));
      break;
    }
    mask <<= 1;
  }
  SendQueue sends(ctx);
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postSend(ctx, modRank(vr + mask + root, n), recv, bytes, 0));
      sends.push(std::move(req));
    }
  }
  return sends.waitAll();
}

Status chainBroadcast(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, int root) {
  const std::size_t es = ctx.elemBytes;
  const int n = ctx.size;
  auto* buf = static_cast<std::byte*>(recv);
  if (ctx.rank == root && send != recv) std::memmove(recv, send, count * es);
  if (n == 1 || count == 0) return Status::ok();
  const std::size_t segElems = ctx.segmentElems();
  const std::size_t segments = (count + segElems - 1) / segElems;
  auto segBytes = [&](std::size_t j) {
    std::size_t left = count - j * segElems;
    return (left < segElems ? left : segElems) * es;
  };
  auto segPtr = [&](std::size_t j) { return buf + j * segElems * es; };
  const int pos = modRank(ctx.rank - root, n);
  const int next = modRank(ctx.rank + 1, n);
  const int prev = modRank(ctx.rank - 1, n);
  const bool forwards = pos != n - 1;
  const PipelineWindows w = pipelineWindows(ctx);
  SendQueue sends(ctx);

  if (pos == 0) {
    for (std::size_t j = 0; j < segments; ++j) {
      while (sends.inFlight() >= w.sendsAhead) MERIDIAN_RETURN_IF_ERROR(sends.waitOldest());
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postSend(ctx, next, segPtr(j), segBytes(j), 0));
      sends.push(std::move(req));
    }
    return sends.waitAll();
  }

  transport::RequestPtr recvReqs[PipelineWindows::kMaxSegments];
  std::size_t posted = 0;
  for (std::size_t j = 0; j < segments; ++j) {
    for (; posted < segments && posted < j + w.recvAhead; ++posted) {
      MERIDIAN_ASSIGN_OR_RETURN(recvReqs[posted % w.recvAhead],
                                postRecv(ctx, prev, segPtr(posted), segBytes(posted), 0));
    }
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, recvReqs[j % w.recvAhead], segBytes(j), "chain broadcast receive"));
    recvReqs[j % w.recvAhead].reset();
    if (forwards) {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, postSend(ctx, next, segPtr(j), segBytes(j), 0));
      sends.push(std::move(req));
      sends.inFlight();
    }
  }
  return sends.waitAll();
}

}  // namespace meridian::collectives
