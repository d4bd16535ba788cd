// Region-hierarchical allreduce (routing's kHierarchical plan): a ring reduce-scatter
// inside each region, an allreduce across regions between the ranks that finished the same
// block (same local index), and a ring allgather inside each region. Only 1/g of the data
// crosses the slow links per rank (g = ranks per region). With few regions the cross step
// is a direct exchange: two rounds that keep every region pair's link busy at once, where a
// ring would use R of the R(R-1) directed links for 2(R-1) steps, each paying a WAN latency.
//
// The steps are the ordinary algorithms on a SubContext over the group's members.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"

namespace meridian::collectives {

namespace {

// Phase offsets of the three steps inside the op's tag space (each ring uses < 8 phases).
constexpr std::uint64_t kIntraPhase = 0;
constexpr std::uint64_t kCrossPhase = 16;
constexpr std::uint64_t kGatherPhase = 32;

}  // namespace

Status validateHierarchy(const Hierarchy& h, int worldSize) {
  if (h.groups.size() < 2) return invalidArgument("a hierarchy needs at least 2 groups");
  const std::size_t g = h.groups.front().size();
  std::vector<int> seen(static_cast<std::size_t>(worldSize), 0);
  for (const auto& group : h.groups) {
    if (group.size() != g || g == 0) return invalidArgument("hierarchy groups must be non-empty and of equal size");
    for (int r : group) {
      if (r < 0 || r >= worldSize || seen[static_cast<std::size_t>(r)]++ != 0) {
        return invalidArgument("hierarchy groups must hold every rank once (rank {})", r);
      }
    }
  }
  if (std::count(seen.begin(), seen.end(), 1) != worldSize) return invalidArgument("hierarchy misses ranks");
  if (!h.crossOrder.empty()) {
    std::vector<int> order = h.crossOrder;
    std::sort(order.begin(), order.end());
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (order.size() != h.groups.size() || order[i] != static_cast<int>(i)) {
        return invalidArgument("hierarchy cross order must be a permutation of the groups");
      }
    }
  }
  return Status::ok();
}

Status hierarchicalAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count,
                             kernels::ReduceOp op, const Hierarchy& h) {
  MERIDIAN_RETURN_IF_ERROR(validateHierarchy(h, ctx.size));
  auto* out = static_cast<std::byte*>(recv);
  const auto* in = static_cast<const std::byte*>(send);
  // Where this rank sits: its group and local index.
  std::size_t myGroup = 0, myIndex = 0;
  for (std::size_t gi = 0; gi < h.groups.size(); ++gi) {
    auto it = std::find(h.groups[gi].begin(), h.groups[gi].end(), ctx.rank);
    if (it != h.groups[gi].end()) {
      myGroup = gi;
      myIndex = static_cast<std::size_t>(it - h.groups[gi].begin());
    }
  }
  const auto& group = h.groups[myGroup];
  const int g = static_cast<int>(group.size());
  const BlockSplit blocks{count, g};

  // 1. Reduce-scatter inside the group (as ringAllreduce does: offset 0 finishes block
  // index+1, which the allgather with offset 1 sends first).
  const int finished = modRank(static_cast<long long>(myIndex) + 1, g);
  std::byte* finishedAt = out + blocks.offset(finished) * ctx.elemBytes;
  const SubContext intra(ctx, group, kIntraPhase);
  MERIDIAN_RETURN_IF_ERROR(intra.status());
  if (g > 1) {
    RingReduceScatterPass rs;
    rs.slots = ctx.scratch->reserve(ringReduceScatterSlotBytes(intra.ctx(), true));
    rs.src = in;
    rs.accum = out;
    rs.finalOut = finishedAt;
    rs.blocks = blocks;
    rs.offset = 0;
    rs.op = op;
    rs.phase = 0;
    MERIDIAN_RETURN_IF_ERROR(runRingReduceScatter(intra.ctx(), rs));
  } else if (in != out) {
    std::memcpy(out, in, count * ctx.elemBytes);
  }

  // 2. Allreduce of the finished block across groups, between the ranks of the same index.
  std::vector<int> cross;
  if (h.crossOrder.empty()) {
    for (const auto& grp : h.groups) cross.push_back(grp[myIndex]);
  } else {
    for (int gi : h.crossOrder) cross.push_back(h.groups[static_cast<std::size_t>(gi)][myIndex]);
  }
  const SubContext across(ctx, cross, kCrossPhase);
  MERIDIAN_RETURN_IF_ERROR(across.status());
  const std::size_t blockCount = blocks.size(finished);
  if (blockCount > 0) {
    MERIDIAN_RETURN_IF_ERROR(h.groups.size() <= routing::kDirectCrossMaxRegions
                                 ? directAllreduce(across.ctx(), finishedAt, blockCount, op, 0, 0)
                                 : ringAllreduce(across.ctx(), finishedAt, finishedAt, blockCount, op));
  }

  // 3. Allgather inside the group.
  if (g > 1) {
    const SubContext gather(ctx, group, kGatherPhase);
    MERIDIAN_RETURN_IF_ERROR(gather.status());
    MERIDIAN_RETURN_IF_ERROR(RingAllgather(gather.ctx(), out, blocks, 1, 0).run());
  }
  return Status::ok();
}

}  // namespace meridian::collectives
