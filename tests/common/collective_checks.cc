// Collective checks against a locally computed serial reference (see the header).
#include "tests/common/collective_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "kernels/reduce.h"
#include "tests/common/rank_harness.h"

namespace meridian::testing {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr std::byte kGarbage{0x5A};

std::size_t es(DataType t) { return kernels::dataTypeSize(t); }

std::string where(const Communicator& c, const char* op, DataType t, std::size_t count) {
  return fmt::format("{} {} count={} (rank {} of {})", op, kernels::toString(t), count, c.rank(), c.size());
}

// Compares elements [0, count) of data with want(i); "" or the first mismatch.
template <typename Want>
std::string compareAll(const std::byte* data, std::size_t count, DataType t, ReduceOp op, Want want,
                       const std::string& context) {
  for (std::size_t i = 0; i < count; ++i) {
    std::string err = compareValue(decodeValue(data, i, t), want(i), t, op);
    if (!err.empty()) return fmt::format("{}: element {}: {}", context, i, err);
  }
  return {};
}

std::byte* ptrOrNull(std::vector<std::byte>& v) { return v.empty() ? nullptr : v.data(); }

// referenceValue for elements [0, count): computed once and shared by the rank threads
// of one process, which all check the same op (a few recent vectors are kept).
std::shared_ptr<const std::vector<double>> referenceVector(int n, std::size_t count, DataType type, ReduceOp op,
                                                           std::uint32_t salt) {
  struct Entry {
    std::tuple<int, std::size_t, DataType, ReduceOp, std::uint32_t> key;
    std::shared_ptr<const std::vector<double>> values;
  };
  static std::mutex mu;
  static std::deque<Entry> cache;
  const auto key = std::make_tuple(n, count, type, op, salt);
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : cache) {
    if (e.key == key) return e.values;
  }
  auto values = std::make_shared<std::vector<double>>(count);
  for (std::size_t i = 0; i < count; ++i) (*values)[i] = referenceValue(n, i, type, op, salt);
  cache.push_back({key, values});
  if (cache.size() > 8) cache.pop_front();
  return values;
}

}  // namespace

double inputValue(int rank, std::size_t i, ReduceOp op, std::uint32_t salt) {
  const std::uint64_t h = mix(static_cast<std::uint64_t>(rank) * 1000003ULL + i * 2654435761ULL + salt * 97ULL);
  if (op == ReduceOp::kProd) {
    static constexpr double kFactors[] = {1, 2, -1, -2, 1, -1, 2};
    return kFactors[h % 7];
  }
  return static_cast<double>(static_cast<int>(h % 17) - 8);
}

std::vector<std::byte> encodeValues(const std::vector<double>& values, DataType type) {
  std::vector<std::byte> out(values.size() * es(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::byte* p = out.data() + i * es(type);
    const double v = values[i];
    switch (type) {
      case DataType::kF32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DataType::kF64: std::memcpy(p, &v, 8); break;
      case DataType::kF16: { auto h = kernels::floatToF16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DataType::kBF16: { auto h = kernels::floatToBF16(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DataType::kI32: { auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); break; }
      case DataType::kI64: { auto x = static_cast<std::int64_t>(v); std::memcpy(p, &x, 8); break; }
    }
  }
  return out;
}

double decodeValue(const std::byte* data, std::size_t index, DataType type) {
  const std::byte* p = data + index * es(type);
  switch (type) {
    case DataType::kF32: { float f; std::memcpy(&f, p, 4); return static_cast<double>(f); }
    case DataType::kF64: { double d; std::memcpy(&d, p, 8); return d; }
    case DataType::kF16: { std::uint16_t h; std::memcpy(&h, p, 2); return static_cast<double>(kernels::f16ToFloat(h)); }
    case DataType::kBF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return static_cast<double>(kernels::bf16ToFloat(h));
    }
    case DataType::kI32: { std::int32_t x; std::memcpy(&x, p, 4); return static_cast<double>(x); }
    case DataType::kI64: { std::int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return std::nan("");
}

std::vector<std::byte> makeInput(int rank, std::size_t count, DataType type, ReduceOp op, std::uint32_t salt,
                                 std::size_t firstIndex) {
  std::vector<double> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = inputValue(rank, firstIndex + i, op, salt);
  return encodeValues(v, type);
}

double referenceValue(int n, std::size_t i, DataType type, ReduceOp op, std::uint32_t salt) {
  double acc = inputValue(0, i, op, salt);
  for (int r = 1; r < n; ++r) {
    const double v = inputValue(r, i, op, salt);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    const bool integral = type == DataType::kI32 || type == DataType::kI64;
    acc = integral ? std::trunc(acc / n) : acc / n;
  }
  return acc;
}

std::string compareValue(double got, double want, DataType type, ReduceOp op) {
  double tol = 0;
  if (op == ReduceOp::kAvg) {
    switch (type) {
      case DataType::kF32: tol = 1e-6; break;
      case DataType::kF64: tol = 1e-12; break;
      case DataType::kF16: tol = 2e-3; break;
      case DataType::kBF16: tol = 1.6e-2; break;
      default: break;
    }
  }
  const double err = std::fabs(got - want);
  if (got == want || err <= tol * std::max(1.0, std::fabs(want))) return {};
  return fmt::format("got {} want {}", got, want);
}

std::size_t largeCount(DataType type) { return ((std::size_t{1} << 20) + 3 + es(type) - 1) / es(type); }

std::string checkAllreduce(Communicator& c, std::size_t count, DataType type, ReduceOp op, bool inPlace,
                           std::uint32_t salt) {
  const std::string ctx =
      where(c, "allreduce", type, count) + fmt::format(" op={} inPlace={}", kernels::toString(op), inPlace);
  std::vector<std::byte> input = makeInput(c.rank(), count, type, op, salt);
  const std::vector<std::byte> original = input;
  std::vector<std::byte> out(input.size(), kGarbage);
  std::byte* result = inPlace ? ptrOrNull(input) : ptrOrNull(out);
  Status st = c.allreduce(ptrOrNull(input), result, count, type, op);
  if (!st.isOk()) return statusFailure(ctx.c_str(), st);
  if (!inPlace && input != original) return ctx + ": the send buffer changed";
  auto ref = referenceVector(c.size(), count, type, op, salt);
  return compareAll(result, count, type, op, [&](std::size_t i) { return (*ref)[i]; }, ctx);
}

std::string checkReduceScatter(Communicator& c, std::size_t recvCount, DataType type, ReduceOp op, bool inPlace,
                               std::uint32_t salt) {
  const std::string ctx =
      where(c, "reduce-scatter", type, recvCount) + fmt::format(" op={} inPlace={}", kernels::toString(op), inPlace);
  const auto n = static_cast<std::size_t>(c.size());
  const auto r = static_cast<std::size_t>(c.rank());
  std::vector<std::byte> input = makeInput(c.rank(), recvCount * n, type, op, salt);
  const std::vector<std::byte> original = input;
  std::vector<std::byte> out(recvCount * es(type), kGarbage);
  std::byte* result = inPlace ? (input.empty() ? nullptr : input.data() + r * recvCount * es(type)) : ptrOrNull(out);
  Status st = c.reduceScatter(ptrOrNull(input), result, recvCount, type, op);
  if (!st.isOk()) return statusFailure(ctx.c_str(), st);
  if (!inPlace && input != original) return ctx + ": the send buffer changed";
  auto ref = referenceVector(c.size(), recvCount * n, type, op, salt);
  return compareAll(result, recvCount, type, op, [&](std::size_t k) { return (*ref)[r * recvCount + k]; }, ctx);
}

std::string checkAllgather(Communicator& c, std::size_t sendCount, DataType type, bool inPlace, std::uint32_t salt) {
  const std::string ctx = where(c, "allgather", type, sendCount) + fmt::format(" inPlace={}", inPlace);
  const auto n = static_cast<std::size_t>(c.size());
  const auto r = static_cast<std::size_t>(c.rank());
  const std::size_t block = sendCount * es(type);
  std::vector<std::byte> input = makeInput(c.rank(), sendCount, type, ReduceOp::kSum, salt);
  std::vector<std::byte> out(block * n, kGarbage);
  const std::byte* send = ptrOrNull(input);
  if (inPlace && block > 0) {
    std::memcpy(out.data() + r * block, input.data(), block);
    send = out.data() + r * block;
  }
  Status st = c.allgather(send, ptrOrNull(out), sendCount, type);
  if (!st.isOk()) return statusFailure(ctx.c_str(), st);
  return compareAll(ptrOrNull(out), sendCount * n, type, ReduceOp::kSum,
                    [&](std::size_t i) {
                      return inputValue(static_cast<int>(i / sendCount), i % sendCount, ReduceOp::kSum, salt);
                    },
                    ctx);
}

std::string checkBroadcast(Communicator& c, std::size_t count, DataType type, int root, bool inPlace,
                           std::uint32_t salt) {
  const std::string ctx = where(c, "broadcast", type, count) + fmt::format(" root={} inPlace={}", root, inPlace);
  const bool isRoot = c.rank() == root;
  std::vector<std::byte> input = isRoot ? makeInput(root, count, type, ReduceOp::kSum, salt) : std::vector<std::byte>{};
  std::vector<std::byte> out(count * es(type), kGarbage);
  if (isRoot && inPlace) out = input;
  const std::byte* send = isRoot ? (inPlace ? ptrOrNull(out) : ptrOrNull(input)) : nullptr;
  Status st = c.broadcast(send, ptrOrNull(out), count, type, root);
  if (!st.isOk()) return statusFailure(ctx.c_str(), st);
  return compareAll(ptrOrNull(out), count, type, ReduceOp::kSum,
                    [&](std::size_t i) { return inputValue(root, i, ReduceOp::kSum, salt); }, ctx);
}

std::string checkReduce(Communicator& c, std::size_t count, DataType type, ReduceOp op, int root, bool inPlace,
                        std::uint32_t salt) {
  const std::string ctx = where(c, "reduce", type, count) +
                          fmt::format(" op={} root={} inPlace={}", kernels::toString(op), root, inPlace);
  const bool isRoot = c.rank() == root;
  std::vector<std::byte> input = makeInput(c.rank(), count, type, op, salt);
  const std::vector<std::byte> original = input;
  std::vector<std::byte> out(isRoot ? input.size() : 0, kGarbage);
  std::byte* recv = inPlace ? ptrOrNull(input) : ptrOrNull(out);
  Status st = c.reduce(ptrOrNull(input), recv, count, type, op, root);
  if (!st.isOk()) return statusFailure(ctx.c_str(), st);
  if (!isRoot) return input == original ? std::string() : ctx + ": a non-root's send buffer changed";
  if (!inPlace && input != original) return ctx + ": the send buffer changed";
  auto ref = referenceVector(c.size(), count, type, op, salt);
  return compareAll(recv, count, type, op, [&](std::size_t i) { return (*ref)[i]; }, ctx);
}

std::string checkBarrier(Communicator& c, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    Status st = c.barrier();
    if (!st.isOk()) return statusFailure(fmt::format("barrier round {}", i).c_str(), st);
  }
  auto w1 = c.barrierAsync();
  auto w2 = c.barrierAsync();
  std::string err = statusFailure("async barrier 1", w1->wait());
  if (err.empty()) err = statusFailure("async barrier 2", w2->wait());
  return err;
}

std::string checkSendRecv(Communicator& c, std::size_t count, DataType type) {
  const int n = c.size();
  if (n == 1) return {};
  const int r = c.rank();
  const int next = (r + 1) % n;
  const int prev = (r + n - 1) % n;
  const std::string ctx = where(c, "send/recv", type, count);
  auto dataOf = [&](int rank, std::uint32_t tag) { return makeInput(rank, count, type, ReduceOp::kSum, 10 + tag); };
  auto verify = [&](const std::vector<std::byte>& got, int from, std::uint32_t tag) {
    return compareAll(got.data(), count, type, ReduceOp::kSum,
                      [&](std::size_t i) { return inputValue(from, i, ReduceOp::kSum, 10 + tag); },
                      ctx + fmt::format(" from {} tag {}", from, tag));
  };

  // Synchronous, ordered so that it cannot deadlock even with rendezvous sends.
  std::vector<std::byte> mine = dataOf(r, 0);
  std::vector<std::byte> got(mine.size(), kGarbage);
  Status st;
  if (r % 2 == 0) {
    st = c.send(mine.data(), count, type, next, 0);
    if (st.isOk()) st = c.recv(got.data(), count, type, prev, 0);
  } else {
    st = c.recv(got.data(), count, type, prev, 0);
    if (st.isOk()) st = c.send(mine.data(), count, type, next, 0);
  }
  if (!st.isOk()) return statusFailure((ctx + " sync").c_str(), st);
  if (auto err = verify(got, prev, 0); !err.empty()) return err;

  // Asynchronous: receives posted first and in the other tag order than the sends.
  std::vector<std::byte> out7 = dataOf(r, 7), out9 = dataOf(r, 9);
  std::vector<std::byte> in7(out7.size(), kGarbage), in9(out9.size(), kGarbage);
  auto r9 = c.recvAsync(in9.data(), count, type, prev, 9);
  auto r7 = c.recvAsync(in7.data(), count, type, prev, 7);
  auto s7 = c.sendAsync(out7.data(), count, type, next, 7);
  auto s9 = c.sendAsync(out9.data(), count, type, next, 9);
  for (auto* w : {&r9, &r7, &s7, &s9}) {
    Status ws = (*w)->wait(deadlineAfter(std::chrono::seconds(60)));
    if (!ws.isOk()) return statusFailure((ctx + " async").c_str(), ws);
  }
  if (auto err = verify(in7, prev, 7); !err.empty()) return err;
  return verify(in9, prev, 9);
}

std::string checkAsyncBatch(Communicator& c, std::size_t count, DataType type) {
  const int n = c.size();
  const auto r = static_cast<std::size_t>(c.rank());
  const std::size_t bytes = count * es(type);
  const std::string ctx = where(c, "async batch", type, count);

  std::vector<std::byte> arIn = makeInput(c.rank(), count, type, ReduceOp::kSum, 21);
  std::vector<std::byte> arOut(bytes, kGarbage);
  std::vector<std::byte> maxBuf = makeInput(c.rank(), count, type, ReduceOp::kMax, 22);
  std::vector<std::byte> bc = c.rank() == n - 1 ? makeInput(n - 1, count, type, ReduceOp::kSum, 23)
                                                : std::vector<std::byte>(bytes, kGarbage);
  std::vector<std::byte> agIn = makeInput(c.rank(), count, type, ReduceOp::kSum, 24);
  std::vector<std::byte> agOut(bytes * static_cast<std::size_t>(n), kGarbage);
  std::vector<std::byte> rsIn = makeInput(c.rank(), count * static_cast<std::size_t>(n), type, ReduceOp::kSum, 25);
  std::vector<std::byte> rsOut(bytes, kGarbage);

  std::vector<Communicator::WorkPtr> works;
  works.push_back(c.allreduceAsync(ptrOrNull(arIn), ptrOrNull(arOut), count, type, ReduceOp::kSum));
  works.push_back(c.broadcastAsync(ptrOrNull(bc), ptrOrNull(bc), count, type, n - 1));
  works.push_back(c.allgatherAsync(ptrOrNull(agIn), ptrOrNull(agOut), count, type));
  works.push_back(c.allreduceAsync(ptrOrNull(maxBuf), ptrOrNull(maxBuf), count, type, ReduceOp::kMax));
  works.push_back(c.reduceScatterAsync(ptrOrNull(rsIn), ptrOrNull(rsOut), count, type, ReduceOp::kSum));
  works.push_back(c.barrierAsync());
  for (std::size_t k = 1; k < works.size(); ++k) {
    if (works[k]->sequence() <= works[k - 1]->sequence()) return ctx + ": sequence numbers not increasing";
  }
  // Wait newest first: completion must still be in issue order underneath.
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    Status st = (*it)->wait(deadlineAfter(std::chrono::seconds(120)));
    if (!st.isOk()) return statusFailure(fmt::format("{} op {}", ctx, (*it)->sequence()).c_str(), st);
    if (!(*it)->done()) return ctx + ": wait returned ok but done() is false";
  }
  auto ref = [&](ReduceOp op, std::uint32_t salt) {
    return [v = referenceVector(n, count, type, op, salt)](std::size_t i) { return (*v)[i]; };
  };
  if (auto e = compareAll(ptrOrNull(arOut), count, type, ReduceOp::kSum, ref(ReduceOp::kSum, 21), ctx + " allreduce");
      !e.empty())
    return e;
  if (auto e = compareAll(ptrOrNull(maxBuf), count, type, ReduceOp::kMax, ref(ReduceOp::kMax, 22), ctx + " max");
      !e.empty())
    return e;
  if (auto e = compareAll(ptrOrNull(bc), count, type, ReduceOp::kSum,
                          [&](std::size_t i) { return inputValue(n - 1, i, ReduceOp::kSum, 23); }, ctx + " broadcast");
      !e.empty())
    return e;
  if (auto e = compareAll(ptrOrNull(agOut), count * static_cast<std::size_t>(n), type, ReduceOp::kSum,
                          [&](std::size_t i) {
                            return inputValue(static_cast<int>(i / count), i % count, ReduceOp::kSum, 24);
                          },
                          ctx + " allgather");
      !e.empty())
    return e;
  auto rsRef = referenceVector(n, count * static_cast<std::size_t>(n), type, ReduceOp::kSum, 25);
  return compareAll(ptrOrNull(rsOut), count, type, ReduceOp::kSum,
                    [&](std::size_t k) { return (*rsRef)[r * count + k]; }, ctx + " reduce-scatter");
}

}  // namespace meridian::testing
