// The collectives meridian-bench measures: how each is run, how much data it moves
// (nccl-tests conventions for algbw/busbw), and how its result is checked.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace meridian::bench {

enum class BenchOp { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kSendRecv };

struct OpInfo {
  BenchOp op;
  const char* name;  // nccl-tests spelling
};

const std::vector<OpInfo>& allOps();
// Parses "all_reduce,all_gather" or "all"; throws std::invalid_argument naming a bad op.
std::vector<BenchOp> parseOps(const std::string& list);
const char* opName(BenchOp op);

// busbw = algbw * factor (nccl-tests): 2(n-1)/n allreduce, (n-1)/n reduce-scatter and
// allgather, 1 for broadcast, reduce and send/recv.
double busBandwidthFactor(BenchOp op, int ranks);

// Buffers for one size: `bytes` is the nccl-tests "size" (the whole buffer: for
// reduce-scatter the send buffer, for allgather the receive buffer).
struct BenchBuffers {
  std::vector<std::uint8_t> send;
  std::vector<std::uint8_t> recv;
};

// Runs one op once over `count` elements (the nccl-tests count: elements of `bytes`).
Status runOnce(collectives::Communicator& comm, BenchOp op, std::uint8_t* send, std::uint8_t* recv,
               std::size_t count, kernels::DataType dtype, kernels::ReduceOp redop, int root);

// Fills send with this rank's pattern; after runOnce, counts wrong elements in recv.
void fillInput(collectives::Communicator& comm, BenchOp op, std::uint8_t* send, std::uint8_t* recv,
               std::size_t count, kernels::DataType dtype);
std::size_t countWrong(collectives::Communicator& comm, BenchOp op, const std::uint8_t* recv, std::size_t count,
                       kernels::DataType dtype, kernels::ReduceOp redop, int root);

}  // namespace meridian::bench
