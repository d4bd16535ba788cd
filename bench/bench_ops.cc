// Running and checking each benchmarked collective.
#include "bench/bench_ops.h"

#include <cmath>
#include <stdexcept>

#include "kernels/reduce.h"

namespace meridian::bench {

using kernels::DataType;
using kernels::ReduceOp;

const std::vector<OpInfo>& allOps() {
  static const std::vector<OpInfo> ops = {
      {BenchOp::kAllreduce, "all_reduce"}, {BenchOp::kReduceScatter, "reduce_scatter"},
      {BenchOp::kAllgather, "all_gather"}, {BenchOp::kBroadcast, "broadcast"},
      {BenchOp::kReduce, "reduce"},        {BenchOp::kSendRecv, "sendrecv"}};
  return ops;
}

const char* opName(BenchOp op) {
  for (const auto& o : allOps()) {
    if (o.op == op) return o.name;
  }
  return "?";
}

std::vector<BenchOp> parseOps(const std::string& list) {
  std::vector<BenchOp> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name == "all") {
      for (const auto& o : allOps()) out.push_back(o.op);
    } else {
      bool found = false;
      for (const auto& o : allOps()) {
        std::string alt = o.name;
        std::erase(alt, '_');
        if (name == o.name || name == alt) {
          out.push_back(o.op);
          found = true;
        }
      }
      if (!found) throw std::invalid_argument("unknown op '" + name + "' (all_reduce, reduce_scatter, all_gather, broadcast, reduce, sendrecv or all)");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double busBandwidthFactor(BenchOp op, int ranks) {
  using Op = collectives::Communicator::OpKind;
  switch (op) {
    case BenchOp::kAllreduce: return collectives::busBandwidthFactor(Op::kAllreduce, ranks);
    case BenchOp::kReduceScatter: return collectives::busBandwidthFactor(Op::kReduceScatter, ranks);
    case BenchOp::kAllgather: return collectives::busBandwidthFactor(Op::kAllgather, ranks);
    default: return 1.0;
  }
}

Status runOnce(collectives::Communicator& comm, BenchOp op, std::uint8_t* send, std::uint8_t* recv,
               std::size_t count, DataType dtype, ReduceOp redop, int root) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  switch (op) {
    case BenchOp::kAllreduce: return comm.allreduce(send, recv, count, dtype, redop);
    case BenchOp::kReduceScatter: return comm.reduceScatter(send, recv, count / n, dtype, redop);
    case BenchOp::kAllgather: return comm.allgather(send, recv, count / n, dtype);
    case BenchOp::kBroadcast: return comm.broadcast(send, recv, count, dtype, root);
    case BenchOp::kReduce: return comm.reduce(send, recv, count, dtype, redop, root);
    case BenchOp::kSendRecv: {
      if (comm.size() == 1) {
        std::memcpy(recv, send, count * kernels::dataTypeSize(dtype));
        return Status::ok();
      }
      int next = (comm.rank() + 1) % comm.size();
      int prev = (comm.rank() + comm.size() - 1) % comm.size();
      auto r = comm.recvAsync(recv, count, dtype, prev);
      auto s = comm.sendAsync(send, count, dtype, next);
      Status sr = r->wait();
      Status ss = s->wait();
      return sr.isOk() ? ss : sr;
    }
  }
  return invalidArgument("unknown op");
}

namespace {

// Small integers: exact in every dtype, even after summing over many ranks.
double inputValue(int rank, std::size_t i) { return 1.0 + static_cast<double>((i + static_cast<std::size_t>(rank)) % 3); }

void storeValue(std::uint8_t* p, std::size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kF32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kF64: reinterpret_cast<double*>(p)[i] = v; break;
    case DataType::kF16: reinterpret_cast<std::uint16_t*>(p)[i] = kernels::floatToF16(static_cast<float>(v)); break;
    case DataType::kBF16: reinterpret_cast<std::uint16_t*>(p)[i] = kernels::floatToBF16(static_cast<float>(v)); break;
    case DataType::kI32: reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v); break;
    case DataType::kI64: reinterpret_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v); break;
  }
}

double loadValue(const std::uint8_t* p, std::size_t i, DataType t) {
  switch (t) {
    case DataType::kF32: return reinterpret_cast<const float*>(p)[i];
    case DataType::kF64: return reinterpret_cast<const double*>(p)[i];
    case DataType::kF16: return kernels::f16ToFloat(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DataType::kBF16: return kernels::bf16ToFloat(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DataType::kI32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case DataType::kI64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
  }
  return 0;
}

double reduced(int ranks, std::size_t i, ReduceOp op, DataType t) {
  double acc = inputValue(0, i);
  for (int r = 1; r < ranks; ++r) {
    double v = inputValue(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    bool integer = t == DataType::kI32 || t == DataType::kI64;
    acc = integer ? std::trunc(acc / ranks) : acc / ranks;
  }
  return acc;
}

bool close(double got, double want, DataType t) {
  double tol = (t == DataType::kF16 || t == DataType::kBF16) ? 1e-2 : 1e-5;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

}  // namespace

void fillInput(collectives::Communicator& comm, BenchOp op, std::uint8_t* send, std::uint8_t* recv,
               std::size_t count, DataType dtype) {
  std::size_t sendCount = op == BenchOp::kAllgather ? count / static_cast<std::size_t>(comm.size()) : count;
  for (std::size_t i = 0; i < sendCount; ++i) storeValue(send, i, dtype, inputValue(comm.rank(), i));
  std::memset(recv, 0, count * kernels::dataTypeSize(dtype));
}

std::size_t countWrong(collectives::Communicator& comm, BenchOp op, const std::uint8_t* recv, std::size_t count,
                       DataType dtype, ReduceOp redop, int root) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  std::size_t wrong = 0;
  auto check = [&](std::size_t i, double want) {
    if (!close(loadValue(recv, i, dtype), want, dtype)) ++wrong;
  };
  switch (op) {
    case BenchOp::kAllreduce:
      for (std::size_t i = 0; i < count; ++i) check(i, reduced(n, i, redop, dtype));
      break;
    case BenchOp::kReduceScatter: {
      std::size_t block = count / un;
      for (std::size_t i = 0; i < block; ++i) check(i, reduced(n, static_cast<std::size_t>(r) * block + i, redop, dtype));
      break;
    }
    case BenchOp::kAllgather: {
      std::size_t block = count / un;
      for (std::size_t i = 0; i < block * un; ++i) check(i, inputValue(static_cast<int>(i / block), i % block));
      break;
    }
    case BenchOp::kBroadcast:
      for (std::size_t i = 0; i < count; ++i) check(i, inputValue(root, i));
      break;
    case BenchOp::kReduce:
      if (r == root) {
        for (std::size_t i = 0; i < count; ++i) check(i, reduced(n, i, redop, dtype));
      }
      break;
    case BenchOp::kSendRecv: {
      int prev = (r + n - 1) % n;
      for (std::size_t i = 0; i < count; ++i) check(i, inputValue(prev, i));
      break;
    }
  }
  return wrong;
}

}  // namespace meridian::bench
