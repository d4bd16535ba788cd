// The allreduce the planner chose (routing/planner.h), and the two algorithms only plans
// use: the parameter-server star and the direct exchange.
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

namespace {

std::vector<int> orderOf(const std::vector<int>& order, int n) {
  if (!order.empty()) return order;
  std::vector<int> identity(static_cast<std::size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  return identity;
}

// Phase offset of the tree's broadcast after its reduce.
constexpr std::uint64_t kTreeBroadcastPhase = 16;

Status waitAll(const AlgoContext& ctx, std::vector<transport::RequestPtr>& reqs, const std::vector<std::size_t>& sizes,
               const char* what) {
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, reqs[i], sizes.empty() ? kAnyBytes : sizes[i], what));
  }
  reqs.clear();
  return Status::ok();
}

}  // namespace

Status plannedAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                        const routing::Plan& plan) {
  using routing::Algorithm;
  switch (plan.algorithm) {
    case Algorithm::kRing:
    case Algorithm::kHalvingDoubling: {
      const SubContext sub(ctx, orderOf(plan.ringOrder, ctx.size), 0);
      MERIDIAN_RETURN_IF_ERROR(sub.status());
      return plan.algorithm == Algorithm::kRing ? ringAllreduce(sub.ctx(), send, recv, count, op)
                                                : recursiveDoublingAllreduce(sub.ctx(), send, recv, count, op);
    }
    case Algorithm::kTree: {
      const std::vector<int> order = orderOf(plan.ringOrder, ctx.size);
      const SubContext up(ctx, order, 0);
      const SubContext down(ctx, order, kTreeBroadcastPhase);
      MERIDIAN_RETURN_IF_ERROR(up.status());
      const int root = static_cast<int>(std::find(order.begin(), order.end(), plan.root) - order.begin());
      MERIDIAN_RETURN_IF_ERROR(binomialReduce(up.ctx(), send, recv, count, op, root));
      return binomialBroadcast(down.ctx(), recv, recv, count, root);
    }
    case Algorithm::kHierarchical:
      return hierarchicalAllreduce(ctx, send, recv, count, op, Hierarchy{plan.groups, plan.crossOrder});
    case Algorithm::kParameterServer:
      return starAllreduce(ctx, send, recv, count, op, plan.root);
  }
  return invalidArgument("unknown planned algorithm {}", static_cast<int>(plan.algorithm));
}

Status starAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count, kernels::ReduceOp op,
                     int hub) {
  if (hub < 0 || hub >= ctx.size) return invalidArgument("star allreduce: hub {} of {}", hub, ctx.size);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const std::size_t eb = ctx.elemBytes;
  if (ctx.size == 1 || count == 0) {
    if (in != out) std::memmove(out, in, count * eb);
    return Status::ok();
  }
  const std::size_t seg = ctx.segmentElems();
  const std::size_t segments = (count + seg - 1) / seg;
  auto segCount = [&](std::size_t k) { return std::min(seg, count - k * seg); };
  const PipelineWindows win = pipelineWindows(ctx);
  SendQueue sends(ctx);

  if (ctx.rank != hub) {
    // Results land straight in recv; each segment of recv is written only after the hub has
    // every rank's copy of it, ours included, so in place is safe.
    std::deque<transport::RequestPtr> results;
    for (std::size_t k = 0; k < segments; ++k) {
      MERIDIAN_ASSIGN_OR_RETURN(auto r, postRecv(ctx, hub, out + k * seg * eb, segCount(k) * eb, 1));
      results.push_back(std::move(r));
      MERIDIAN_ASSIGN_OR_RETURN(auto s, postSend(ctx, hub, in + k * seg * eb, segCount(k) * eb, 0));
      sends.push(std::move(s));
      while (sends.inFlight() > win.sendsAhead) MERIDIAN_RETURN_IF_ERROR(sends.waitOldest());
    }
    MERIDIAN_RETURN_IF_ERROR(sends.waitAll());
    for (std::size_t k = 0; k < segments; ++k) {
      MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, results[k], segCount(k) * eb, "star allreduce result"));
    }
    return Status::ok();
  }

  // The hub: two slots of (n-1) segments, so the next segment arrives while one is reduced.
  constexpr std::size_t kSlots = 2;
  const std::size_t peers = static_cast<std::size_t>(ctx.size - 1);
  const std::size_t stride = alignUp(seg * eb);
  std::byte* scratch = ctx.scratch->reserve(kSlots * peers * stride);
  std::vector<std::vector<transport::RequestPtr>> pending(kSlots);
  auto post = [&](std::size_t k) -> Status {
    std::byte* slot = scratch + (k % kSlots) * peers * stride;
    std::size_t i = 0;
    for (int p = 0; p < ctx.size; ++p) {
      if (p == hub) continue;
      MERIDIAN_ASSIGN_OR_RETURN(auto r, postRecv(ctx, p, slot + i++ * stride, segCount(k) * eb, 0));
      pending[k % kSlots].push_back(std::move(r));
    }
    return Status::ok();
  };
  for (std::size_t k = 0; k < std::min(kSlots, segments); ++k) MERIDIAN_RETURN_IF_ERROR(post(k));
  for (std::size_t k = 0; k < segments; ++k) {
    const std::size_t bytes = segCount(k) * eb;
    MERIDIAN_RETURN_IF_ERROR(
        waitAll(ctx, pending[k % kSlots], std::vector<std::size_t>(peers, bytes), "star allreduce receive"));
    std::byte* dst = out + k * seg * eb;
    if (in != out) std::memcpy(dst, in + k * seg * eb, bytes);
    const std::byte* slot = scratch + (k % kSlots) * peers * stride;
    for (std::size_t i = 0; i < peers; ++i) kernels::reduceInto(dst, slot + i * stride, segCount(k), ctx.dtype, op);
    for (int p = 0; p < ctx.size; ++p) {
      if (p == hub) continue;
      MERIDIAN_ASSIGN_OR_RETURN(auto s, postSend(ctx, p, dst, bytes, 1));
      sends.push(std::move(s));
    }
    if (k + kSlots < segments) MERIDIAN_RETURN_IF_ERROR(post(k + kSlots));
    while (sends.inFlight() > win.sendsAhead * peers) MERIDIAN_RETURN_IF_ERROR(sends.waitOldest());
  }
  return sends.waitAll();
}

namespace {

// One window of directAllreduce: both rounds over `count` elements at `data`.
Status directExchange(const AlgoContext& ctx, std::byte* data, std::size_t count, kernels::ReduceOp op,
                      std::int64_t divisor, std::byte* tmp) {
  const int n = ctx.size;
  const std::size_t eb = ctx.elemBytes;
  const BlockSplit pieces{count, n};
  const int r = ctx.rank;
  std::byte* own = data + pieces.offset(r) * eb;
  const std::size_t ownBytes = pieces.size(r) * eb;
  const std::size_t stride = alignUp(pieces.size(0) * eb);

  // Round 1: everyone's copy of my piece comes to me; my copies of theirs go to them.
  std::vector<transport::RequestPtr> recvs, sends;
  if (ownBytes > 0) {
    for (int q = 0, slot = 0; q < n; ++q) {
      if (q == r) continue;
      MERIDIAN_ASSIGN_OR_RETURN(auto req, postRecv(ctx, q, tmp + static_cast<std::size_t>(slot++) * stride, ownBytes, 0));
      recvs.push_back(std::move(req));
    }
  }
  for (int q = 0; q < n; ++q) {
    if (q == r || pieces.size(q) == 0) continue;
    MERIDIAN_ASSIGN_OR_RETURN(auto req, postSend(ctx, q, data + pieces.offset(q) * eb, pieces.size(q) * eb, 0));
    sends.push_back(std::move(req));
  }
  // Each copy is folded in as soon as it is here, while the later ones still arrive.
  for (std::size_t slot = 0; slot < recvs.size(); ++slot) {
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, recvs[slot], ownBytes, "direct allreduce receive"));
    kernels::reduceInto(own, tmp + slot * stride, pieces.size(r), ctx.dtype, op);
  }
  recvs.clear();
  // An average divides once, here, on the piece's owner: 1/n of the buffer, before it is sent.
  if (divisor > 1 && ownBytes > 0) kernels::divideBy(own, pieces.size(r), ctx.dtype, divisor);
  // The other pieces are overwritten next: their sends must be done with them.
  MERIDIAN_RETURN_IF_ERROR(waitAll(ctx, sends, {}, "direct allreduce send"));

  // Round 2: every reduced piece to everyone.
  std::vector<std::size_t> sizes;
  for (int q = 0; q < n; ++q) {
    if (q == r || pieces.size(q) == 0) continue;
    MERIDIAN_ASSIGN_OR_RETURN(auto req, postRecv(ctx, q, data + pieces.offset(q) * eb, pieces.size(q) * eb, 1));
    recvs.push_back(std::move(req));
    sizes.push_back(pieces.size(q) * eb);
  }
  if (ownBytes > 0) {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      MERIDIAN_ASSIGN_OR_RETURN(auto req, postSend(ctx, q, own, ownBytes, 1));
      sends.push_back(std::move(req));
    }
  }
  MERIDIAN_RETURN_IF_ERROR(waitAll(ctx, recvs, sizes, "direct allreduce receive"));
  return waitAll(ctx, sends, {}, "direct allreduce send");
}

}  // namespace

Status directAllreduce(const AlgoContext& ctx, std::byte* data, std::size_t count, kernels::ReduceOp op,
                       std::int64_t divisor, std::size_t windowBytes) {
  const int n = ctx.size;
  if (count == 0) return Status::ok();
  if (n == 1) {
    if (divisor > 1) kernels::divideBy(data, count, ctx.dtype, divisor);
    return Status::ok();
  }
  const std::size_t eb = ctx.elemBytes;
  // Windows one after the other, so that the scratch for the (n - 1) incoming pieces stays
  // below windowBytes whatever the message size.
  const std::size_t window =
      windowBytes == 0 ? count : std::max<std::size_t>(static_cast<std::size_t>(n), windowBytes / eb);
  const std::size_t stride = alignUp(BlockSplit{std::min(window, count), n}.size(0) * eb);
  std::byte* tmp = ctx.scratch->reserve(static_cast<std::size_t>(n - 1) * stride);
  for (std::size_t at = 0; at < count; at += window) {
    MERIDIAN_RETURN_IF_ERROR(directExchange(ctx, data + at * eb, std::min(window, count - at), op, divisor, tmp));
  }
  return Status::ok();
}

}  // namespace meridian::collectives
