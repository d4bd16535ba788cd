// Barrier: dissemination. In round k every rank signals rank+2^k and waits for rank-2^k;
// after ceil(log2(n)) rounds every rank has heard, transitively, from every other, for any
// n. The signal is a zero-byte message.
#include "collectives/algorithms/algorithm.h"

namespace meridian::collectives {

Status disseminationBarrier(const AlgoContext& ctx) {
  const int n = ctx.size;
  std::uint64_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    MERIDIAN_RETURN_IF_ERROR(sendRecv(ctx, modRank(ctx.rank + dist, n), nullptr, 0, modRank(ctx.rank - dist, n),
                                      nullptr, 0, round));
  }
  return Status::ok();
}

}  // namespace meridian::collectives
