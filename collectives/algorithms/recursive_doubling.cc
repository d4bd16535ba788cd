// Recursive-doubling allreduce for small messages: log2(p) exchanges of the whole vector
// with partners at distance 1, 2, 4, ... For a rank count that is not a power of two,
// the first 2*(n-p) ranks fold pairwise first (even ranks hand their data to the odd
// neighbour and wait), and get the result back at the end. Every rank computes the same
// bits: each reduction is commutative and partners combine the same two operands.
#include <bit>
#include <cstring>

#include "collectives/algorithms/algorithm.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

Status recursiveDoublingAllreduce(const AlgoContext& ctx, const void* send, void* recv, std::size_t count,
                                  kernels::ReduceOp op) {
  const std::size_t bytes = count * ctx.elemBytes;
  const int n = ctx.size;
  const int r = ctx.rank;
  if (send != recv) std::memcpy(recv, send, bytes);
  if (n == 1) return Status::ok();

  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  std::byte* tmp = ctx.scratch->reserve(bytes);

  // Fold (phase 0): ranks below 2*extra pair up; the even one sits the doubling out.
  int vrank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr s, postSend(ctx, r + 1, recv, bytes, 0));
      MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, s, kAnyBytes, "recursive doubling fold send"));
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr back, postRecv(ctx, r + 1, recv, bytes, 2));
      return waitRequest(ctx, back, bytes, "recursive doubling unfold receive");
    }
    MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr in, postRecv(ctx, r - 1, tmp, bytes, 0));
    MERIDIAN_RETURN_IF_ERROR(waitRequest(ctx, in, bytes, "recursive doubling fold receive"));
    kernels::reduceInto(recv, tmp, count, ctx.dtype, op);
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }

  // Doubling (phase 1) among the p virtual ranks.
  for (int mask = 1; mask < p; mask <<= 1) {
    const int vpeer = vrank ^ mask;
    const int peer = vpeer < extra ? 2 * vpeer + 1 : vpeer + extra;
    MERIDIAN_RETURN_IF_ERROR(sendRecv(ctx, peer, recv, bytes, peer, tmp, bytes, 1));
    kernels::reduceInto(recv, tmp, count, ctx.dtype, op);
  }

  // Unfold (phase 2): hand the result back to the folded even neighbour.
  if (r < 2 * extra) {
    MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr s, postSend(ctx, r - 1, recv, bytes, 2));
    return waitRequest(ctx, s, kAnyBytes, "recursive doubling unfold send");
  }
  return Status::ok();
}

}  // namespace meridian::collectives
