// The bootstrap store: codec bounds, StoreState semantics, and the real server over
// loopback with ranks as threads, wrong secrets, garbage clients and shutdown.
#include "bootstrap/store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <numeric>
#include <set>
#include <string_view>
#include <thread>

#include "core/secret.h"
#include "core/wire.h"
#include "tests/common/poll.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

// Records the largest single allocation while a test asks for it, so the codec tests
// can prove that a length read from the wire is checked before anything is allocated.
namespace {
std::atomic<bool> gTrackAllocations{false};
std::atomic<std::size_t> gLargestAllocation{0};
}  // namespace

// Out of line, so that GCC does not pair an inlined free() with `new` and warn.
[[gnu::noinline]] void* operator new(std::size_t bytes) {
  if (gTrackAllocations.load(std::memory_order_relaxed)) {
    std::size_t seen = gLargestAllocation.load(std::memory_order_relaxed);
    while (bytes > seen && !gLargestAllocation.compare_exchange_weak(seen, bytes)) {
    }
  }
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace meridian::bootstrap {
namespace {

namespace tcp = transport::tcp;
using meridian::testing::pollUntil;
using std::chrono::milliseconds;

constexpr const char* kSecret = "meridian-test-secret";

std::vector<std::uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }
TimePoint in(milliseconds ms) { return Clock::now() + ms; }
// A blob whose bytes depend on rank and position, so swapped or shifted data shows.
std::vector<std::uint8_t> blobFor(int rank, std::size_t size) {
  std::vector<std::uint8_t> b(size);
  for (std::size_t i = 0; i < size; ++i) b[i] = static_cast<std::uint8_t>(rank * 31 + static_cast<int>(i % 251));
  return b;
}

// Serves `frame` and records every read size.
struct RecordingReader {
  std::vector<std::uint8_t> frame;
  std::size_t offset = 0;
  std::vector<std::size_t> reads;
  StoreByteReader reader() {
    return [this](std::span<std::uint8_t> dst) -> Status {
      reads.push_back(dst.size());
      if (dst.size() > frame.size() - offset) return peerError("test reader: frame exhausted");
      std::copy_n(frame.begin() + static_cast<std::ptrdiff_t>(offset), dst.size(), dst.begin());
      offset += dst.size();
      return Status::ok();
    };
  }
};

std::vector<std::uint8_t> requestHeader(StoreOp op, std::uint32_t keyCount, std::uint32_t valueBytes) {
  std::vector<std::uint8_t> h(kStoreRequestHeaderBytes);
  wire::store<std::uint32_t>(h.data(), kStoreMagic);
  wire::store<std::uint16_t>(h.data() + 4, kStoreProtocolVersion);
  h[6] = static_cast<std::uint8_t>(op);
  wire::store<std::uint32_t>(h.data() + 8, keyCount);
  wire::store<std::uint32_t>(h.data() + 12, valueBytes);
  return h;
}

void appendKeyLength(std::vector<std::uint8_t>& frame, std::uint32_t keyBytes) {
  frame.resize(frame.size() + 4);
  wire::store<std::uint32_t>(frame.data() + frame.size() - 4, keyBytes);
}

// Decodes `frame` through a recording reader, tracking the largest allocation.
Result<StoreRequest> decodeTracked(RecordingReader& r, std::size_t* largestAllocation) {
  gLargestAllocation = 0;
  gTrackAllocations = true;
  auto out = readStoreRequest(r.reader());
  gTrackAllocations = false;
  *largestAllocation = gLargestAllocation;
  return out;
}

StoreRequest sampleRequest(StoreOp op) {
  StoreRequest r;
  r.op = op;
  r.keys = {"key/0"};
  switch (op) {
    case StoreOp::kSet: r.value = bytes("value\0with nul"); break;
    case StoreOp::kGet: r.timeoutMs = 1234; break;
    case StoreOp::kWait: r.keys = {"a", "", "c/d"}; r.timeoutMs = kStoreNoTimeout; break;
    case StoreOp::kAdd: r.delta = -42; break;
    case StoreOp::kCheck: r.keys = {"x", "y"}; break;
    case StoreOp::kDelete: break;
    case StoreOp::kIdleClose: break;  // the server's notice, never a request
    case StoreOp::kGetMany: r.keys = {"g/0", "g/2", ""}; r.timeoutMs = 99; break;
  }
  return r;
}

constexpr StoreOp kAllOps[] = {StoreOp::kSet,   StoreOp::kGet,    StoreOp::kWait,   StoreOp::kAdd,
                               StoreOp::kCheck, StoreOp::kDelete, StoreOp::kGetMany};

// ---- Codec -------------------------------------------------------------------------

TEST(StoreCodecTest, RequestsRoundTripForEveryOp) {
  for (StoreOp op : kAllOps) {
    SCOPED_TRACE(toString(op));
    const StoreRequest in = sampleRequest(op);
    auto frame = encodeStoreRequest(in);
    ASSERT_TRUE(frame) << frame.status().toString();
    auto out = decodeStoreRequest(frame.value());
    ASSERT_TRUE(out) << out.status().toString();
    EXPECT_EQ(out->op, in.op);
    EXPECT_EQ(out->keys, in.keys);
    EXPECT_EQ(out->value, in.value);
    EXPECT_EQ(out->delta, in.delta);
    EXPECT_EQ(out->timeoutMs, in.timeoutMs);
  }
}

TEST(StoreCodecTest, ResponsesRoundTripValueNumberAndError) {
  StoreResponse value;
  value.op = StoreOp::kGet;
  value.value = bytes("payload");
  auto got = decodeStoreResponse(encodeStoreResponse(value), StoreOp::kGet);
  ASSERT_TRUE(got) << got.status().toString();
  EXPECT_TRUE(got->status.isOk());
  EXPECT_EQ(text(got->value), "payload");

  StoreResponse number;
  number.op = StoreOp::kAdd;
  number.number = -7;
  auto added = decodeStoreResponse(encodeStoreResponse(number), StoreOp::kAdd);
  ASSERT_TRUE(added);
  EXPECT_EQ(added->number, -7);

  StoreResponse error;
  error.op = StoreOp::kWait;
  error.status = timeoutError("store WAIT: timed out");
  auto failed = decodeStoreResponse(encodeStoreResponse(error), StoreOp::kWait);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status.code(), StatusCode::kTimeout);
  EXPECT_EQ(failed->status.message(), "store WAIT: timed out");
}

TEST(StoreCodecTest, AcceptsEveryLimitExactly) {
  StoreRequest longKey;
  longKey.op = StoreOp::kDelete;
  longKey.keys = {std::string(kStoreMaxKeyBytes, 'k')};
  auto a = encodeStoreRequest(longKey);
  ASSERT_TRUE(a) << a.status().toString();
  EXPECT_TRUE(decodeStoreRequest(a.value()));

  StoreRequest manyKeys;
  manyKeys.op = StoreOp::kCheck;
  for (std::size_t i = 0; i < kStoreMaxKeys; ++i) manyKeys.keys.push_back(std::to_string(i));
  auto b = encodeStoreRequest(manyKeys);
  ASSERT_TRUE(b) << b.status().toString();
  auto decoded = decodeStoreRequest(b.value());
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->keys.size(), kStoreMaxKeys);

  StoreRequest bigValue;
  bigValue.op = StoreOp::kSet;
  bigValue.keys = {"big"};
  bigValue.value.assign(kStoreMaxValueBytes, 0xab);
  auto c = encodeStoreRequest(bigValue);
  ASSERT_TRUE(c) << c.status().toString();
  RecordingReader r;
  r.frame = std::move(c).value();
  std::size_t largest = 0;
  auto big = decodeTracked(r, &largest);
  ASSERT_TRUE(big) << big.status().toString();
  EXPECT_EQ(big->value.size(), kStoreMaxValueBytes);
  // The allocation tracker the bound tests rely on does see the value's buffer.
  EXPECT_GE(largest, kStoreMaxValueBytes);
}

TEST(StoreCodecTest, EncoderRejectsOversizedOrMisshapenRequestsAsInvalidArgument) {
  StoreRequest r;
  r.op = StoreOp::kGet;
  r.keys = {std::string(kStoreMaxKeyBytes + 1, 'k')};
  EXPECT_EQ(encodeStoreRequest(r).status().code(), StatusCode::kInvalidArgument);
  r.keys = {"a", "b"};
  EXPECT_EQ(encodeStoreRequest(r).status().code(), StatusCode::kInvalidArgument);
  r.op = StoreOp::kWait;
  r.keys.assign(kStoreMaxKeys + 1, "k");
  EXPECT_EQ(encodeStoreRequest(r).status().code(), StatusCode::kInvalidArgument);
  r.op = StoreOp::kSet;
  r.keys = {"k"};
  r.value.resize(kStoreMaxValueBytes + 1);
  EXPECT_EQ(encodeStoreRequest(r).status().code(), StatusCode::kInvalidArgument);
}

TEST(StoreCodecTest, OversizedValueLengthIsRejectedBeforeReadingOrAllocating) {
  for (std::uint32_t announced : {static_cast<std::uint32_t>(kStoreMaxValueBytes + 1), UINT32_MAX}) {
    RecordingReader r;
    r.frame = requestHeader(StoreOp::kSet, 1, announced);  // and nothing after it
    std::size_t largest = 0;
    auto out = decodeTracked(r, &largest);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
    EXPECT_NE(out.status().message().find("exceeds the limit"), std::string::npos) << out.status().message();
    EXPECT_EQ(r.reads, std::vector<std::size_t>{kStoreRequestHeaderBytes});
    EXPECT_LT(largest, std::size_t{64 * 1024});
  }
}

TEST(StoreCodecTest, TooManyKeysAreRejectedBeforeReadingOrAllocating) {
  for (std::uint32_t announced : {static_cast<std::uint32_t>(kStoreMaxKeys + 1), UINT32_MAX}) {
    RecordingReader r;
    r.frame = requestHeader(StoreOp::kWait, announced, 0);
    std::size_t largest = 0;
    auto out = decodeTracked(r, &largest);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
    EXPECT_NE(out.status().message().find("keys exceed the limit"), std::string::npos) << out.status().message();
    EXPECT_EQ(r.reads, std::vector<std::size_t>{kStoreRequestHeaderBytes});
    EXPECT_LT(largest, std::size_t{64 * 1024});
  }
}

TEST(StoreCodecTest, OversizedKeyLengthIsRejectedBeforeReadingOrAllocating) {
  for (std::uint32_t announced : {static_cast<std::uint32_t>(kStoreMaxKeyBytes + 1), UINT32_MAX}) {
    RecordingReader r;
    r.frame = requestHeader(StoreOp::kWait, 2, 0);
    appendKeyLength(r.frame, 1);
    r.frame.push_back('a');
    appendKeyLength(r.frame, announced);
    std::size_t largest = 0;
    auto out = decodeTracked(r, &largest);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
    EXPECT_NE(out.status().message().find("key 1: a key of"), std::string::npos) << out.status().message();
    EXPECT_EQ(r.reads, (std::vector<std::size_t>{kStoreRequestHeaderBytes, 4, 1, 4}));
    EXPECT_LT(largest, std::size_t{64 * 1024});
  }
}

TEST(StoreCodecTest, TruncatedRequestsAreRejectedAtEveryLength) {
  for (StoreOp op : kAllOps) {
    auto frame = encodeStoreRequest(sampleRequest(op));
    ASSERT_TRUE(frame);
    for (std::size_t len = 0; len < frame->size(); ++len) {
      auto out = decodeStoreRequest(std::span<const std::uint8_t>(frame->data(), len));
      ASSERT_FALSE(out) << toString(op) << " decoded from " << len << " of " << frame->size() << " bytes";
      EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
    }
  }
}

TEST(StoreCodecTest, TruncatedResponsesAreRejectedAtEveryLength) {
  StoreResponse response;
  response.op = StoreOp::kGet;
  response.value = bytes("some value");
  const auto frame = encodeStoreResponse(response);
  for (std::size_t len = 0; len < frame.size(); ++len) {
    auto out = decodeStoreResponse(std::span<const std::uint8_t>(frame.data(), len), StoreOp::kGet);
    ASSERT_FALSE(out) << "decoded from " << len << " of " << frame.size() << " bytes";
    EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
  }
}

TEST(StoreCodecTest, RejectsBadMagicVersionOpShapeAndTrailingBytes) {
  auto valid = encodeStoreRequest(sampleRequest(StoreOp::kGet)).value();
  auto expectPeerError = [](std::vector<std::uint8_t> frame, std::string_view fragment) {
    auto out = decodeStoreRequest(frame);
    ASSERT_FALSE(out);
    EXPECT_EQ(out.status().code(), StatusCode::kPeerError);
    EXPECT_NE(out.status().message().find(fragment), std::string::npos) << out.status().message();
  };
  auto withByte = [&valid](std::size_t index, std::uint8_t value) {
    std::vector<std::uint8_t> frame = valid;
    frame.at(index) = value;
    return frame;
  };
  expectPeerError(withByte(0, 0), "bad magic");
  expectPeerError(withByte(4, 9), "protocol version 9");
  expectPeerError(withByte(6, 0), "unknown op");
  expectPeerError(withByte(6, 7), "unknown op");
  expectPeerError(withByte(7, 1), "reserved");
  expectPeerError(requestHeader(StoreOp::kGet, 2, 0), "exactly one key");
  expectPeerError(requestHeader(StoreOp::kAdd, 1, 8), "carries no value");
  auto trailing = valid;
  trailing.push_back(0);
  expectPeerError(trailing, "trailing");
}

TEST(StoreCodecTest, ResponseDecoderRejectsWrongOpUnknownCodeAndOversizedPayloads) {
  StoreResponse response;
  response.op = StoreOp::kAdd;
  auto frame = encodeStoreResponse(response);
  EXPECT_EQ(decodeStoreResponse(frame, StoreOp::kGet).status().code(), StatusCode::kPeerError);
  auto badCode = frame;
  badCode[7] = 200;
  EXPECT_EQ(decodeStoreResponse(badCode, StoreOp::kAdd).status().code(), StatusCode::kPeerError);
  // A non-GET answer carries no payload; an error message is bounded; neither is read.
  auto payload = frame;
  wire::store<std::uint32_t>(payload.data() + 8, 1);
  auto out = decodeStoreResponse(payload, StoreOp::kAdd);
  ASSERT_FALSE(out);
  EXPECT_NE(out.status().message().find("exceeds the limit"), std::string::npos) << out.status().message();
  auto longError = frame;
  longError[7] = static_cast<std::uint8_t>(StatusCode::kTimeout);
  wire::store<std::uint32_t>(longError.data() + 8, static_cast<std::uint32_t>(kStoreMaxErrorBytes + 1));
  EXPECT_EQ(decodeStoreResponse(longError, StoreOp::kAdd).status().code(), StatusCode::kPeerError);
  auto hugeValue = encodeStoreResponse(StoreResponse{});
  wire::store<std::uint32_t>(hugeValue.data() + 8, UINT32_MAX);
  auto huge = decodeStoreResponse(hugeValue, StoreOp::kGet);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.status().message().find("exceeds the limit"), std::string::npos) << huge.status().message();
}

// GET-MANY's answer: every value, in order, empty ones too; a value length that runs past
// the payload is refused before anything is copied.
TEST(StoreCodecTest, GetManyAnswersEveryValueInOrderAndBoundsEachLength) {
  StoreResponse many;
  many.op = StoreOp::kGetMany;
  many.values = {bytes("one"), {}, bytes("three\0")};
  auto frame = encodeStoreResponse(many);
  auto got = decodeStoreResponse(frame, StoreOp::kGetMany);
  ASSERT_TRUE(got) << got.status().toString();
  ASSERT_EQ(got->values.size(), 3u);
  EXPECT_EQ(text(got->values[0]), "one");
  EXPECT_TRUE(got->values[1].empty());
  EXPECT_EQ(got->values[2], bytes("three\0"));
  auto overrun = frame;  // the first value claims more bytes than the payload holds
  wire::store<std::uint32_t>(overrun.data() + kStoreResponseHeaderBytes, 1000);
  auto bad = decodeStoreResponse(overrun, StoreOp::kGetMany);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), StatusCode::kPeerError);
  EXPECT_NE(bad.status().message().find("a value of 1000 bytes"), std::string::npos) << bad.status().message();
  auto cut = frame;  // a length field cut short: the payload ends 2 bytes into it
  cut.resize(kStoreResponseHeaderBytes + 4 + 3 + 2);
  wire::store<std::uint32_t>(cut.data() + 8, 4 + 3 + 2);
  EXPECT_EQ(decodeStoreResponse(cut, StoreOp::kGetMany).status().code(), StatusCode::kPeerError);
}

// ---- StoreState --------------------------------------------------------------------

TEST(StoreStateTest, GetWaitsForTheKeyAndWakesOnSet) {
  StoreState state;
  Result<std::vector<std::uint8_t>> got = internalError("not run");
  std::thread getter([&] { got = state.get("late", in(milliseconds(30000))); });
  ASSERT_TRUE(pollUntil([&] { return state.waiterCount() == 1; }, milliseconds(10000)));
  EXPECT_TRUE(state.set("late", bytes("here")));
  getter.join();
  ASSERT_TRUE(got) << got.status().toString();
  EXPECT_EQ(text(got.value()), "here");
  EXPECT_EQ(state.waiterCount(), 0u);
}

TEST(StoreStateTest, GetReturnsAnExistingKeyEvenPastItsDeadline) {
  StoreState state;
  ASSERT_TRUE(state.set("k", bytes("v")));
  auto got = state.get("k", Clock::now() - milliseconds(1));
  ASSERT_TRUE(got);
  EXPECT_EQ(text(got.value()), "v");
}

TEST(StoreStateTest, AddIsAtomicAcrossThreads) {
  StoreState state;
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 500;
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        auto v = state.add("counter", 1);
        seen[static_cast<std::size_t>(t)].push_back(v ? v.value() : -1);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  // Every add returned a distinct value, 1..N: none was lost or duplicated.
  EXPECT_EQ(all.size(), std::size_t{kThreads * kAddsPerThread});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAddsPerThread);
  EXPECT_EQ(text(state.get("counter", Clock::now()).value()), std::to_string(kThreads * kAddsPerThread));
}

TEST(StoreStateTest, AddKeepsDecimalTextAndRejectsNonIntegersAndOverflow) {
  StoreState state;
  EXPECT_EQ(state.add("n", 5).value(), 5);
  EXPECT_EQ(state.add("n", -7).value(), -2);
  EXPECT_EQ(text(state.get("n", Clock::now()).value()), "-2");
  ASSERT_TRUE(state.set("word", bytes("seven")));
  EXPECT_EQ(state.add("word", 1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(state.set("empty", {}));
  EXPECT_EQ(state.add("empty", 1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(state.add("big", INT64_MAX));
  EXPECT_EQ(state.add("big", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state.add("big", 0).value(), INT64_MAX);
}

TEST(StoreStateTest, WaitTimesOutWithTimeoutNamingAMissingKey) {
  StoreState state;
  ASSERT_TRUE(state.set("present", bytes("1")));
  Status st = state.wait({"present", "missing"}, in(milliseconds(20)));
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("1 of 2 keys missing (e.g. 'missing')"), std::string::npos) << st.message();
  EXPECT_EQ(state.get("missing", in(milliseconds(5))).status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(state.wait({"present"}, in(milliseconds(5))));
  EXPECT_TRUE(state.wait({}, Clock::now()));
  EXPECT_EQ(state.waiterCount(), 0u);
}

TEST(StoreStateTest, CheckAndDeleteReportPresence) {
  StoreState state;
  EXPECT_FALSE(state.check({"a"}).value());
  EXPECT_TRUE(state.check({}).value());
  ASSERT_TRUE(state.set("a", bytes("1")));
  ASSERT_TRUE(state.set("b", bytes("2")));
  EXPECT_TRUE(state.check({"a", "b"}).value());
  EXPECT_FALSE(state.check({"a", "c"}).value());
  EXPECT_TRUE(state.del("a").value());
  EXPECT_FALSE(state.del("a").value());
  EXPECT_FALSE(state.check({"a"}).value());
  EXPECT_EQ(state.keyCount(), 1u);
}

TEST(StoreStateTest, ShutdownWakesBlockedCallsWithPeerError) {
  StoreState state;
  Status waited;
  Result<std::vector<std::uint8_t>> got = internalError("not run");
  std::thread getter([&] { got = state.get("never", TimePoint::max()); });
  std::thread waiter([&] { waited = state.wait({"never"}, in(milliseconds(60000))); });
  ASSERT_TRUE(pollUntil([&] { return state.waiterCount() == 2; }, milliseconds(10000)));
  state.shutdown();
  getter.join();
  waiter.join();
  EXPECT_EQ(got.status().code(), StatusCode::kPeerError);
  EXPECT_EQ(waited.code(), StatusCode::kPeerError);
  EXPECT_EQ(state.get("never", TimePoint::max()).status().code(), StatusCode::kPeerError);
}

// ---- Helpers over a Store, ranks as threads ----------------------------------------

// Runs fn(rank) on worldSize threads; returns each rank's Status.
std::vector<Status> runRanks(int worldSize, const std::function<Status(int)>& fn) {
  std::vector<Status> results(static_cast<std::size_t>(worldSize));
  std::vector<std::thread> threads;
  for (int r = 0; r < worldSize; ++r) {
    threads.emplace_back([&, r] { results[static_cast<std::size_t>(r)] = fn(r); });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Every rank: barrier, then allgather blobs of several sizes, checked byte by byte.
Status barrierAndAllGather(Store& store, int rank, int worldSize) {
  const TimePoint deadline = in(milliseconds(60000));
  MERIDIAN_RETURN_IF_ERROR(storeBarrier(store, "barrier/0", worldSize, deadline));
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{1} << 20}) {
    const std::string prefix = fmt::format("gather/{}", size);
    auto all = storeAllGather(store, prefix, rank, worldSize, blobFor(rank, size), deadline);
    if (!all) return all.status();
    if (all->size() != static_cast<std::size_t>(worldSize)) return internalError("wrong count {}", all->size());
    for (int r = 0; r < worldSize; ++r) {
      if (all.value()[static_cast<std::size_t>(r)] != blobFor(r, size)) {
        return internalError("rank {}: blob of rank {} (size {}) differs", rank, r, size);
      }
    }
  }
  return storeBarrier(store, "barrier/1", worldSize, deadline);
}

class StoreHelpersRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(StoreHelpersRanksTest, BarrierAndAllGatherAgreeAcrossRanksOnStoreState) {
  const int worldSize = GetParam();
  StoreState state;
  auto results = runRanks(worldSize, [&](int rank) { return barrierAndAllGather(state, rank, worldSize); });
  for (int r = 0; r < worldSize; ++r) EXPECT_TRUE(results[static_cast<std::size_t>(r)]) << results[static_cast<std::size_t>(r)].toString();
}

INSTANTIATE_TEST_SUITE_P(Ranks, StoreHelpersRanksTest, ::testing::Values(1, 2, 3, 7));

TEST(StoreHelpersTest, BarrierTimesOutSayingHowManyArrived) {
  StoreState state;
  Status st = storeBarrier(state, "lonely", 3, in(milliseconds(20)));
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("1 of 3 ranks arrived"), std::string::npos) << st.message();
}

TEST(StoreHelpersTest, ReusedBarrierPrefixAndBadRanksAreInvalidArguments) {
  StoreState state;
  ASSERT_TRUE(storeBarrier(state, "once", 1, in(milliseconds(1000))));
  EXPECT_EQ(storeBarrier(state, "once", 1, in(milliseconds(1000))).code(), StatusCode::kInvalidArgument);
  const std::vector<std::uint8_t> blob = bytes("x");
  EXPECT_EQ(storeAllGather(state, "g", 3, 3, blob, in(milliseconds(10))).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(storeAllGather(state, "g", -1, 3, blob, in(milliseconds(10))).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- The real server over loopback -------------------------------------------------

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::start("127.0.0.1", 0, kSecret);
    ASSERT_TRUE(server) << server.status().toString();
    server_ = std::move(server).value();
    ASSERT_NE(server_->port(), 0);
  }

  std::string address() const { return fmt::format("127.0.0.1:{}", server_->port()); }

  std::unique_ptr<TcpStore> connectClient(const std::string& secret = kSecret) {
    auto store = TcpStore::connect(address(), secret, in(milliseconds(10000)));
    EXPECT_TRUE(store) << store.status().toString();
    return store ? std::move(store).value() : nullptr;
  }

  // A raw, unauthenticated socket to the server.
  UniqueFd rawSocket() {
    auto fd = tcp::connectTo(tcp::HostPort{"127.0.0.1", server_->port()}, "", in(milliseconds(10000)));
    EXPECT_TRUE(fd) << fd.status().toString();
    return fd ? std::move(fd).value() : UniqueFd();
  }

  // True when a store client still gets correct answers.
  static void expectServes(Store& store, const std::string& key) {
    ASSERT_TRUE(store.set(key, bytes("alive")));
    auto got = store.get(key, in(milliseconds(10000)));
    ASSERT_TRUE(got) << got.status().toString();
    EXPECT_EQ(text(got.value()), "alive");
  }

  std::unique_ptr<StoreServer> server_;
};

// ---- A listening socket handed over by a launcher (MERIDIAN_STORE_FD) ------------------

// The bound port of a socket.
std::uint16_t portOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  return ntohs(a.sin_port);
}

TEST(StoreServerAdoptTest, ServesOnAnInheritedListeningSocket) {
  auto listener = tcp::listenOn("127.0.0.1", 0, /*nonBlocking=*/false);
  ASSERT_TRUE(listener) << listener.status().toString();
  const std::uint16_t port = portOf(listener->get());
  const int fd = listener->release();
  auto server = StoreServer::adopt(fd, port, kSecret);
  ASSERT_TRUE(server) << server.status().toString();
  EXPECT_EQ(server.value()->port(), port) << "the socket given, not a new one";
  EXPECT_NE(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "rank 0's own children must not inherit it";
  auto store = TcpStore::connect(fmt::format("127.0.0.1:{}", port), kSecret, in(milliseconds(10000)));
  ASSERT_TRUE(store) << store.status().toString();
  ASSERT_TRUE(store.value()->set("k", bytes("v")));
  auto got = store.value()->get("k", in(milliseconds(10000)));
  ASSERT_TRUE(got) << got.status().toString();
  EXPECT_EQ(text(got.value()), "v");
}

TEST(StoreServerAdoptTest, RefusesWhatIsNotAListeningTcpSocketAndLeavesItOpen) {
  auto listener = tcp::listenOn("127.0.0.1", 0, /*nonBlocking=*/false);
  ASSERT_TRUE(listener) << listener.status().toString();
  const std::uint16_t port = portOf(listener->get());
  UniqueFd udp(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  UniqueFd unlistened(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int pipeEnds[2] = {-1, -1};
  ASSERT_EQ(::pipe2(pipeEnds, O_CLOEXEC), 0);
  UniqueFd pipeRead(pipeEnds[0]), pipeWrite(pipeEnds[1]);
  const int closedNumber = ::dup(pipeRead.get());
  ASSERT_GE(closedNumber, 0);
  ASSERT_EQ(::close(closedNumber), 0);
  const struct {
    int fd;
    std::uint16_t expectedPort;
    const char* why;
  } cases[] = {
      {udp.get(), 0, "not an IPv4 TCP socket"},
      {unlistened.get(), 0, "not listening"},
      {pipeRead.get(), 0, "not a socket"},
      {closedNumber, 0, "not open"},
      {listener->get(), static_cast<std::uint16_t>(port == 65535 ? 1 : port + 1), "not the store's"},
  };
  for (const auto& c : cases) {
    auto server = StoreServer::adopt(c.fd, c.expectedPort, kSecret);
    ASSERT_FALSE(server) << c.why;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(server.status().message().find(c.why), std::string::npos) << server.status().message();
    if (c.fd != closedNumber) {
      EXPECT_NE(::fcntl(c.fd, F_GETFD), -1) << c.why << ": a refused descriptor stays open";
    }
  }
}

TEST_F(TcpStoreTest, ServesEveryOpOverLoopback) {
  auto store = connectClient();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->set("k", bytes("v1")));
  EXPECT_EQ(text(store->get("k", in(milliseconds(1000))).value()), "v1");
  ASSERT_TRUE(store->set("k", bytes("v2")));
  EXPECT_EQ(text(store->get("k", in(milliseconds(1000))).value()), "v2");
  ASSERT_TRUE(store->set("empty", {}));
  EXPECT_TRUE(store->get("empty", in(milliseconds(1000))).value().empty());
  EXPECT_EQ(store->add("n", 3).value(), 3);
  EXPECT_EQ(store->add("n", 4).value(), 7);
  EXPECT_EQ(store->add("k", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->wait({"k", "n"}, in(milliseconds(1000))));
  auto many = store->getMany({"n", "k", "empty"}, in(milliseconds(1000)));
  ASSERT_TRUE(many) << many.status().toString();
  ASSERT_EQ(many->size(), 3u);
  EXPECT_EQ(text((*many)[0]), "7");
  EXPECT_EQ(text((*many)[1]), "v2");
  EXPECT_TRUE((*many)[2].empty());
  EXPECT_EQ(store->getMany({"k", "missing"}, in(milliseconds(30))).status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(store->check({"k", "n"}).value());
  EXPECT_FALSE(store->check({"k", "zz"}).value());
  EXPECT_TRUE(store->del("k").value());
  EXPECT_FALSE(store->del("k").value());
  EXPECT_FALSE(store->check({"k"}).value());
  // The server's answers (kInvalidArgument above) leave the connection usable.
  expectServes(*store, "after");
}

// An all-gather's two requests leave together (one round trip): the SET is in before the
// GET-MANY waits, two clients meet, the answers are matched to their requests, and the
// connection goes on serving in step afterwards.
TEST_F(TcpStoreTest, SetAndGetManyPipelinesTheTwoRequestsAndAnswersEachInOrder) {
  auto a = connectClient();
  auto b = connectClient();
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  Result<std::vector<std::vector<std::uint8_t>>> fromA = internalError("not run");
  std::thread other([&] { fromA = a->setAndGetMany("ag/0", bytes("zero"), {"ag/1"}, in(milliseconds(5000))); });
  auto fromB = b->setAndGetMany("ag/1", bytes("one"), {"ag/0"}, in(milliseconds(5000)));
  other.join();
  ASSERT_TRUE(fromA) << fromA.status().toString();
  ASSERT_TRUE(fromB) << fromB.status().toString();
  ASSERT_EQ(fromA->size(), 1u);
  ASSERT_EQ(fromB->size(), 1u);
  EXPECT_EQ(text(fromA->front()), "one");
  EXPECT_EQ(text(fromB->front()), "zero");
  // Nobody else's key comes: the SET stays in, the wait times out, the stream stays in step.
  auto alone = a->setAndGetMany("ag/2", bytes("two"), {"ag/3"}, in(milliseconds(30)));
  EXPECT_EQ(alone.status().code(), StatusCode::kTimeout) << alone.status().toString();
  EXPECT_EQ(text(b->get("ag/2", in(milliseconds(1000))).value()), "two");
  expectServes(*a, "after-pipelined");
  // The store in memory does the same, one request after the other.
  StoreState state;
  ASSERT_TRUE(state.set("m/1", bytes("x")));
  auto local = state.setAndGetMany("m/0", bytes("y"), {"m/1"}, in(milliseconds(1000)));
  ASSERT_TRUE(local) << local.status().toString();
  EXPECT_EQ(text(local->front()), "x");
  EXPECT_EQ(text(state.get("m/0", in(milliseconds(1000))).value()), "y");
}

TEST_F(TcpStoreTest, GetTimesOutWithTimeoutAndTheConnectionStaysUsable) {
  auto store = connectClient();
  ASSERT_TRUE(store);
  auto got = store->get("missing", in(milliseconds(30)));
  EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().toString();
  EXPECT_EQ(store->wait({"missing"}, in(milliseconds(30))).code(), StatusCode::kTimeout);
  expectServes(*store, "k");
}

TEST_F(TcpStoreTest, OversizedKeyIsRejectedLocallyAndTheConnectionStaysUsable) {
  auto store = connectClient();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->set(std::string(kStoreMaxKeyBytes + 1, 'k'), bytes("v")).code(), StatusCode::kInvalidArgument);
  expectServes(*store, "k");
}

TEST_F(TcpStoreTest, SevenRanksAsThreadsBarrierAllGatherAndCount) {
  constexpr int kWorld = 7;
  auto results = runRanks(kWorld, [&](int rank) -> Status {
    auto store = TcpStore::connect(address(), kSecret, in(milliseconds(30000)));
    if (!store) return store.status();
    MERIDIAN_RETURN_IF_ERROR(barrierAndAllGather(*store.value(), rank, kWorld));
    MERIDIAN_RETURN_IF_ERROR(store.value()->add("joined", 1).status());
    MERIDIAN_RETURN_IF_ERROR(storeBarrier(*store.value(), "barrier/2", kWorld, in(milliseconds(30000))));
    auto joined = store.value()->get("joined", in(milliseconds(1000)));
    if (!joined) return joined.status();
    if (text(joined.value()) != std::to_string(kWorld)) return internalError("joined = {}", text(joined.value()));
    return Status::ok();
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(results[static_cast<std::size_t>(r)]) << "rank " << r << ": " << results[static_cast<std::size_t>(r)].toString();
  }
}

TEST_F(TcpStoreTest, OneClientIsSafeToShareAcrossThreads) {
  auto store = connectClient();
  ASSERT_TRUE(store);
  auto results = runRanks(4, [&](int) -> Status {
    for (int i = 0; i < 100; ++i) MERIDIAN_RETURN_IF_ERROR(store->add("shared", 1).status());
    return Status::ok();
  });
  for (const Status& st : results) EXPECT_TRUE(st) << st.toString();
  EXPECT_EQ(text(store->get("shared", in(milliseconds(1000))).value()), "400");
}

TEST_F(TcpStoreTest, WrongSecretIsRefusedClearlyAndTheServerKeepsServing) {
  auto before = connectClient();
  ASSERT_TRUE(before);
  auto intruder = TcpStore::connect(address(), "not-the-job-secret", in(milliseconds(10000)));
  ASSERT_FALSE(intruder);
  EXPECT_EQ(intruder.status().code(), StatusCode::kPeerError);
  EXPECT_NE(intruder.status().message().find("job secret"), std::string::npos) << intruder.status().message();
  expectServes(*before, "before");
  auto after = connectClient();
  ASSERT_TRUE(after);
  expectServes(*after, "after");
}

TEST_F(TcpStoreTest, GarbageClientIsDroppedWithoutAffectingOthers) {
  auto before = connectClient();
  ASSERT_TRUE(before);
  UniqueFd garbage = rawSocket();
  ASSERT_TRUE(garbage.valid());
  std::vector<std::uint8_t> noise(4096);
  randomBytes(noise);
  noise[0] = 0;  // never the handshake magic
  ASSERT_TRUE(tcp::sendAll(garbage.get(), noise.data(), noise.size(), in(milliseconds(10000))));
  // The server hangs up on it (an error, not a timeout)...
  std::uint8_t byte = 0;
  Status dropped = tcp::recvAll(garbage.get(), &byte, 1, in(milliseconds(10000)));
  EXPECT_EQ(dropped.code(), StatusCode::kPeerError) << dropped.toString();
  // ...and everyone else carries on.
  expectServes(*before, "before");
  auto after = connectClient();
  ASSERT_TRUE(after);
  expectServes(*after, "after");
}

TEST_F(TcpStoreTest, AuthenticatedClientSendingABadFrameIsDroppedAlone) {
  auto before = connectClient();
  ASSERT_TRUE(before);
  UniqueFd fd = rawSocket();
  ASSERT_TRUE(fd.valid());
  tcp::ConnectInfo info;
  info.kind = tcp::ConnectionKind::kStore;
  auto keys = tcp::clientHandshake(fd.get(), kSecret, WireSecurity::kEncrypt, info, in(milliseconds(10000)));
  ASSERT_TRUE(keys.isOk()) << keys.status().toString();
  tcp::SealedSocket conn(fd.get(), keys.value());
  // Announces a 4 GiB value: refused from the header alone.
  auto header = requestHeader(StoreOp::kSet, 1, UINT32_MAX);
  ASSERT_TRUE(conn.send(header, in(milliseconds(10000))));
  std::uint8_t byte = 0;
  Status dropped = tcp::recvAll(fd.get(), &byte, 1, in(milliseconds(10000)));
  EXPECT_EQ(dropped.code(), StatusCode::kPeerError) << dropped.toString();
  expectServes(*before, "before");
}

TEST_F(TcpStoreTest, ServerShutdownWhileAClientBlocksInGetGivesThatClientAnError) {
  auto store = connectClient();
  ASSERT_TRUE(store);
  Result<std::vector<std::uint8_t>> got = internalError("not run");
  const TimePoint start = Clock::now();
  std::thread getter([&] { got = store->get("never", in(milliseconds(120000))); });
  ASSERT_TRUE(pollUntil([&] { return server_->waiterCount() == 1; }, milliseconds(10000)));
  server_.reset();
  getter.join();
  EXPECT_EQ(got.status().code(), StatusCode::kPeerError) << got.status().toString();
  EXPECT_LT(Clock::now() - start, milliseconds(60000));
  // The connection is gone for good: later calls fail at once, not at a deadline.
  EXPECT_EQ(store->set("k", bytes("v")).code(), StatusCode::kPeerError);
}

// The way a job ends: rank 0 hosts the store, waits until every other rank said "done",
// and leaves at once. The last rank's SET was applied (that is what woke rank 0), so its
// reply must still reach it rather than the connection being cut under it.
TEST_F(TcpStoreTest, TheRequestThatLetsTheHostLeaveIsStillAnswered) {
  for (int round = 0; round < 50; ++round) {
    if (!server_) SetUp();
    auto host = connectClient();
    auto last = connectClient();
    ASSERT_TRUE(host && last);
    Status waited = internalError("not run");
    std::thread owner([&] {
      waited = host->wait({"done"}, in(milliseconds(10000)));
      server_.reset();  // leaves the moment the key is there
    });
    ASSERT_TRUE(pollUntil([&] { return server_ && server_->waiterCount() == 1; }, milliseconds(10000)));
    const Status set = last->set("done", bytes("1"));
    owner.join();
    ASSERT_TRUE(waited) << waited.toString();
    ASSERT_TRUE(set) << "round " << round << ": " << set.toString();
  }
}

TEST_F(TcpStoreTest, ConnectGivesUpAtTheDeadlineWhenNoServerListens) {
  const std::string gone = address();
  server_.reset();
  auto store = TcpStore::connect(gone, kSecret, in(milliseconds(200)));
  ASSERT_FALSE(store);
  EXPECT_EQ(store.status().code(), StatusCode::kTimeout) << store.status().toString();
}

TEST_F(TcpStoreTest, ClientsDisconnectingIsHarmless) {
  for (int i = 0; i < 20; ++i) {
    auto store = connectClient();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->add("visits", 1));
  }
  auto store = connectClient();
  ASSERT_TRUE(store);
  EXPECT_EQ(text(store->get("visits", in(milliseconds(1000))).value()), "20");
}

}  // namespace
}  // namespace meridian::bootstrap
