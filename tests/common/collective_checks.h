// Per-rank checks of every collective against a serial reference computed locally (each
// rank can compute every rank's input). Inputs are small integers, so sums and products
// are exact in every type (|sum| <= 8 * ranks, |prod| <= 2^ranks); avg on floating types
// is compared with a tolerance, everything else bit-exactly. Each check returns "" when it
// passed, else a description of the first mismatch. Shared by the in-process tests and
// the multi-process worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "kernels/types.h"

namespace meridian::testing {

using kernels::DataType;
using kernels::ReduceOp;

// Rank r's input element i for `op` (integer-valued; `salt` varies it between ops).
double inputValue(int rank, std::size_t i, ReduceOp op, std::uint32_t salt);
// Encodes doubles as `count` elements of `type`, and back.
std::vector<std::byte> encodeValues(const std::vector<double>& values, DataType type);
double decodeValue(const std::byte* data, std::size_t index, DataType type);
// The elements of one rank's input, encoded.
std::vector<std::byte> makeInput(int rank, std::size_t count, DataType type, ReduceOp op, std::uint32_t salt,
                                 std::size_t firstIndex = 0);
// The reduction of inputValue(r, i, ...) over ranks 0..n-1, as the communicator defines it.
double referenceValue(int n, std::size_t i, DataType type, ReduceOp op, std::uint32_t salt);
// "" when got matches want for (type, op), else a description.
std::string compareValue(double got, double want, DataType type, ReduceOp op);
// The bytes of `count` elements of the largest count used, (1 MiB + 3 B) / element size,
// rounded up.
std::size_t largeCount(DataType type);

using collectives::Communicator;

std::string checkAllreduce(Communicator& c, std::size_t count, DataType type, ReduceOp op, bool inPlace,
                           std::uint32_t salt = 1);
std::string checkReduceScatter(Communicator& c, std::size_t recvCount, DataType type, ReduceOp op, bool inPlace,
                               std::uint32_t salt = 2);
std::string checkAllgather(Communicator& c, std::size_t sendCount, DataType type, bool inPlace,
                           std::uint32_t salt = 3);
std::string checkBroadcast(Communicator& c, std::size_t count, DataType type, int root, bool inPlace,
                           std::uint32_t salt = 4);
// Non-roots pass recv == nullptr when !inPlace.
std::string checkReduce(Communicator& c, std::size_t count, DataType type, ReduceOp op, int root, bool inPlace,
                        std::uint32_t salt = 5);
std::string checkBarrier(Communicator& c, int rounds);
// Ring exchange: every rank sends to rank+1 and receives from rank-1, sync (ordered so it
// cannot deadlock) and async; also several tags out of order.
std::string checkSendRecv(Communicator& c, std::size_t count, DataType type);
// Several async ops of different kinds issued back-to-back, then waited and checked.
std::string checkAsyncBatch(Communicator& c, std::size_t count, DataType type);

}  // namespace meridian::testing
