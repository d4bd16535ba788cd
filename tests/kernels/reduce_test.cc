// Checks the CPU reduction, cast and scaling kernels against plain scalar references: every
// type x op at odd lengths on unaligned pointers, and every f16/bf16 bit pattern.
#include "kernels/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/types.h"

namespace meridian::kernels {

// Readable parameter names in gtest output ("f16" rather than "1-byte object <02>").
void PrintTo(DataType type, std::ostream* os) { *os << toString(type); }
void PrintTo(ReduceOp op, std::ostream* os) { *os << toString(op); }

namespace {

using Rng = std::mt19937_64;
constexpr std::uint64_t kSeed = 20240611;

// 0 and 1, a vector tail (7), around the 256-element f16/bf16 block, and a long odd length.
constexpr std::array<std::size_t, 7> kCounts{0, 1, 7, 255, 256, 257, 4099};
constexpr std::array<DataType, 6> kAllTypes{DataType::kF32, DataType::kF64, DataType::kF16,
                                            DataType::kBF16, DataType::kI32, DataType::kI64};
constexpr std::array<ReduceOp, 5> kAllOps{ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                          ReduceOp::kMax, ReduceOp::kAvg};

// ---- Scalar references -------------------------------------------------------------------

// Float min/max: NaN if either input is NaN (the kernel's documented rule), else std::min/max.
template <typename F>
F refCombineFloat(F a, F b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return std::isnan(b) ? b : (std::isnan(a) ? a : std::min(a, b));
    case ReduceOp::kMax: return std::isnan(b) ? b : (std::isnan(a) ? a : std::max(a, b));
  }
  throw std::logic_error("bad op");
}

template <typename I>
I refCombineInt(I a, I b, ReduceOp op) {
  using U = std::make_unsigned_t<I>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return static_cast<I>(static_cast<U>(a) + static_cast<U>(b));
    case ReduceOp::kProd: return static_cast<I>(static_cast<U>(a) * static_cast<U>(b));
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
  }
  throw std::logic_error("bad op");
}

// Independent binary16 decode by arithmetic (no bit tricks).
double refDecodeF16(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude = 0;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}

// Independent float -> binary16 by rounding in double (nearbyint rounds half to even).
// NaN is not handled here.
std::uint16_t refEncodeF16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | 0x7c00);
  int e = 0;
  std::frexp(a, &e);
  const int exponent = std::max(e - 1, -14);
  const double quantum = std::ldexp(1.0, exponent - 10);
  const double r = std::nearbyint(a / quantum) * quantum;
  if (r >= 65536.0) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (r < std::ldexp(1.0, -14)) {
    return static_cast<std::uint16_t>(sign | static_cast<unsigned>(r / std::ldexp(1.0, -24)));
  }
  std::frexp(r, &e);
  const int biased = e - 1 + 15;
  const auto mantissa = static_cast<unsigned>((std::ldexp(r, -(e - 1)) - 1.0) * 1024.0);
  return static_cast<std::uint16_t>(sign | (static_cast<unsigned>(biased) << 10) | mantissa);
}

// Independent float -> bfloat16, rounding in double. NaN is not handled here.
std::uint16_t refEncodeBF16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | 0x7f80);
  int e = 0;
  std::frexp(a, &e);
  const int exponent = std::max(e - 1, -126);
  const double quantum = std::ldexp(1.0, exponent - 7);
  const double r = std::nearbyint(a / quantum) * quantum;
  if (r >= std::ldexp(1.0, 128)) return static_cast<std::uint16_t>(sign | 0x7f80);
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(static_cast<float>(r));
  return static_cast<std::uint16_t>(sign | (bits >> 16));
}

bool isHalfNan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool isBF16Nan(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0; }

// ---- Per-type traits for the generic tests -------------------------------------------------

template <typename F>
F randomFloat(Rng& rng) {
  // One element in 32 is special, so NaN/inf/zero/subnormal paths run inside the loops.
  constexpr std::array<F, 8> kSpecial{std::numeric_limits<F>::quiet_NaN(),
                                      -std::numeric_limits<F>::quiet_NaN(),
                                      std::numeric_limits<F>::infinity(),
                                      -std::numeric_limits<F>::infinity(),
                                      F{0},
                                      -F{0},
                                      std::numeric_limits<F>::denorm_min(),
                                      std::numeric_limits<F>::max()};
  if (rng() % 32 == 0) return kSpecial[rng() % kSpecial.size()];
  return std::uniform_real_distribution<F>(F{-4}, F{4})(rng);
}

template <typename F>
bool sameFloat(F a, F b) {
  if (std::isnan(a) && std::isnan(b)) return true;  // payload choice is not specified
  return std::memcmp(&a, &b, sizeof(F)) == 0;
}

template <typename F, DataType kDataType>
struct FloatTraits {
  using T = F;
  static constexpr DataType kType = kDataType;
  static T random(Rng& rng) { return randomFloat<F>(rng); }
  static T combine(T a, T b, ReduceOp op) { return refCombineFloat(a, b, op); }
  static bool same(T a, T b) { return sameFloat(a, b); }
};

template <typename I, DataType kDataType>
struct IntTraits {
  using T = I;
  static constexpr DataType kType = kDataType;
  static T random(Rng& rng) { return std::uniform_int_distribution<I>()(rng); }
  static T combine(T a, T b, ReduceOp op) { return refCombineInt(a, b, op); }
  static bool same(T a, T b) { return a == b; }
};

// f16/bf16 stored as bits; the reference widens, combines in f32 and rounds once.
template <DataType kDataType>
struct HalfTraits {
  using T = std::uint16_t;
  static constexpr DataType kType = kDataType;
  static constexpr bool kBF16 = kDataType == DataType::kBF16;
  static float toFloat(T v) { return kBF16 ? bf16ToFloat(v) : f16ToFloat(v); }
  static T fromFloat(float v) { return kBF16 ? floatToBF16(v) : floatToF16(v); }
  static T random(Rng& rng) { return fromFloat(randomFloat<float>(rng)); }
  static T combine(T a, T b, ReduceOp op) {
    return fromFloat(refCombineFloat(toFloat(a), toFloat(b), op));
  }
  static bool isNan(T v) { return kBF16 ? isBF16Nan(v) : isHalfNan(v); }
  static bool same(T a, T b) { return a == b || (isNan(a) && isNan(b)); }
};

template <typename Fn>
void visitType(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::kF32: fn.template operator()<FloatTraits<float, DataType::kF32>>(); return;
    case DataType::kF64: fn.template operator()<FloatTraits<double, DataType::kF64>>(); return;
    case DataType::kF16: fn.template operator()<HalfTraits<DataType::kF16>>(); return;
    case DataType::kBF16: fn.template operator()<HalfTraits<DataType::kBF16>>(); return;
    case DataType::kI32: fn.template operator()<IntTraits<std::int32_t, DataType::kI32>>(); return;
    case DataType::kI64: fn.template operator()<IntTraits<std::int64_t, DataType::kI64>>(); return;
  }
  FAIL() << "unknown type";
}

// count + 1 random elements; tests use data() + 1 so the buffer is not vector-aligned.
template <typename Traits>
std::vector<typename Traits::T> randomBuffer(std::size_t count, Rng& rng) {
  std::vector<typename Traits::T> out(count + 1);
  for (auto& v : out) v = Traits::random(rng);
  return out;
}

template <typename Traits>
void expectSameElements(const typename Traits::T* got, const typename Traits::T* want,
                        std::size_t count, const std::string& what) {
  for (std::size_t i = 0; i < count; ++i) {
    if (!Traits::same(got[i], want[i])) {
      ADD_FAILURE() << what << ": first mismatch at element " << i << " of " << count
                    << " (got " << +got[i] << ", want " << +want[i] << ")";
      return;
    }
  }
}

template <typename Traits>
std::vector<typename Traits::T> referenceCombine(const typename Traits::T* a,
                                                 const typename Traits::T* b,
                                                 std::size_t count, ReduceOp op) {
  std::vector<typename Traits::T> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = Traits::combine(a[i], b[i], op);
  return out;
}

// ---- Reductions, parameterised over every type x op ----------------------------------------

class ReduceTest : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {
 protected:
  DataType type() const { return std::get<0>(GetParam()); }
  ReduceOp op() const { return std::get<1>(GetParam()); }
  std::string label(std::size_t count) const {
    return std::string(toString(type())) + " " + std::string(toString(op())) +
           " count=" + std::to_string(count);
  }
};

TEST_P(ReduceTest, ReduceIntoMatchesScalarReferenceForOddLengthsAndUnalignedPointers) {
  visitType(type(), [&]<typename Traits>() {
    Rng rng(kSeed);
    for (std::size_t count : kCounts) {
      auto dst = randomBuffer<Traits>(count, rng);
      const auto src = randomBuffer<Traits>(count, rng);
      const auto srcBefore = src;
      const auto want = referenceCombine<Traits>(dst.data() + 1, src.data() + 1, count, op());
      reduceInto(dst.data() + 1, src.data() + 1, count, type(), op());
      expectSameElements<Traits>(dst.data() + 1, want.data(), count, label(count));
      EXPECT_EQ(0, std::memcmp(src.data(), srcBefore.data(), src.size() * sizeof(src[0])))
          << label(count) << ": source modified";
    }
  });
}

TEST_P(ReduceTest, ReduceIntoDistinctOutputLeavesInputsUntouched) {
  visitType(type(), [&]<typename Traits>() {
    Rng rng(kSeed + 1);
    for (std::size_t count : kCounts) {
      const auto a = randomBuffer<Traits>(count, rng);
      const auto b = randomBuffer<Traits>(count, rng);
      const auto aBefore = a;
      const auto bBefore = b;
      std::vector<typename Traits::T> out(count + 1);
      reduce(out.data() + 1, a.data() + 1, b.data() + 1, count, type(), op());
      const auto want = referenceCombine<Traits>(a.data() + 1, b.data() + 1, count, op());
      expectSameElements<Traits>(out.data() + 1, want.data(), count, label(count));
      EXPECT_EQ(0, std::memcmp(a.data(), aBefore.data(), a.size() * sizeof(a[0])));
      EXPECT_EQ(0, std::memcmp(b.data(), bBefore.data(), b.size() * sizeof(b[0])));
    }
  });
}

TEST_P(ReduceTest, ReduceWithOutputEqualToFirstInputMatchesReference) {
  visitType(type(), [&]<typename Traits>() {
    Rng rng(kSeed + 2);
    for (std::size_t count : kCounts) {
      auto a = randomBuffer<Traits>(count, rng);
      const auto b = randomBuffer<Traits>(count, rng);
      const auto want = referenceCombine<Traits>(a.data() + 1, b.data() + 1, count, op());
      reduce(a.data() + 1, a.data() + 1, b.data() + 1, count, type(), op());
      expectSameElements<Traits>(a.data() + 1, want.data(), count, label(count));
    }
  });
}

TEST_P(ReduceTest, ReduceWithOutputEqualToSecondInputKeepsOperandOrder) {
  visitType(type(), [&]<typename Traits>() {
    Rng rng(kSeed + 3);
    for (std::size_t count : kCounts) {
      const auto a = randomBuffer<Traits>(count, rng);
      auto b = randomBuffer<Traits>(count, rng);
      const auto want = referenceCombine<Traits>(a.data() + 1, b.data() + 1, count, op());
      reduce(b.data() + 1, a.data() + 1, b.data() + 1, count, type(), op());
      expectSameElements<Traits>(b.data() + 1, want.data(), count, label(count));
    }
  });
}

TEST_P(ReduceTest, ReduceOfBufferWithItselfMatchesReference) {
  visitType(type(), [&]<typename Traits>() {
    Rng rng(kSeed + 4);
    for (std::size_t count : kCounts) {
      auto a = randomBuffer<Traits>(count, rng);
      const auto want = referenceCombine<Traits>(a.data() + 1, a.data() + 1, count, op());
      auto viaReduce = a;
      reduce(viaReduce.data() + 1, viaReduce.data() + 1, viaReduce.data() + 1, count, type(),
             op());
      expectSameElements<Traits>(viaReduce.data() + 1, want.data(), count, label(count));
      reduceInto(a.data() + 1, a.data() + 1, count, type(), op());
      expectSameElements<Traits>(a.data() + 1, want.data(), count, label(count));
      // Two distinct outputs from equal inputs.
      auto x = randomBuffer<Traits>(count, rng);
      std::vector<typename Traits::T> out(count + 1);
      reduce(out.data() + 1, x.data() + 1, x.data() + 1, count, type(), op());
      const auto wantX = referenceCombine<Traits>(x.data() + 1, x.data() + 1, count, op());
      expectSameElements<Traits>(out.data() + 1, wantX.data(), count, label(count));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const auto& paramInfo) {
                           return std::string(toString(std::get<0>(paramInfo.param))) + "_" +
                                  std::string(toString(std::get<1>(paramInfo.param)));
                         });

TEST(ReduceEdgeTest, CountZeroTouchesNothingAndAcceptsNullPointers) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      EXPECT_NO_THROW(reduceInto(nullptr, nullptr, 0, type, op));
      EXPECT_NO_THROW(reduce(nullptr, nullptr, nullptr, 0, type, op));
    }
    EXPECT_NO_THROW(divideBy(nullptr, 0, type, 3));
    EXPECT_NO_THROW(scale(nullptr, 0, type, 0.5));
  }
}

TEST(ReduceEdgeTest, FloatMinAndMaxReturnNaNWhenEitherSideIsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::array<float, 3> dst{nan, 1.0f, nan};
    const std::array<float, 3> src{1.0f, nan, nan};
    reduceInto(dst.data(), src.data(), dst.size(), DataType::kF32, op);
    for (float v : dst) EXPECT_TRUE(std::isnan(v)) << toString(op);

    std::array<double, 2> dstF64{std::nan(""), 2.0};
    const std::array<double, 2> srcF64{2.0, std::nan("")};
    reduceInto(dstF64.data(), srcF64.data(), dstF64.size(), DataType::kF64, op);
    for (double v : dstF64) EXPECT_TRUE(std::isnan(v)) << toString(op);

    std::array<std::uint16_t, 2> dstBF16{floatToBF16(nan), floatToBF16(3.0f)};
    const std::array<std::uint16_t, 2> srcBF16{floatToBF16(3.0f), floatToBF16(nan)};
    reduceInto(dstBF16.data(), srcBF16.data(), dstBF16.size(), DataType::kBF16, op);
    for (std::uint16_t v : dstBF16) EXPECT_TRUE(isBF16Nan(v)) << toString(op);
  }
}

// std::min/std::max keep the first operand on ties, so -0/+0 shows which side is which.
TEST(ReduceEdgeTest, MinMaxOfSignedZerosKeepFirstOperandWhateverTheOutput) {
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    const std::array<float, 2> a{-0.0f, 0.0f};
    const std::array<float, 2> b{0.0f, -0.0f};
    std::array<float, 2> out{};
    reduce(out.data(), a.data(), b.data(), 2, DataType::kF32, op);
    EXPECT_TRUE(std::signbit(out[0]) && !std::signbit(out[1])) << toString(op);
    auto intoA = a;
    reduce(intoA.data(), intoA.data(), b.data(), 2, DataType::kF32, op);
    EXPECT_TRUE(std::signbit(intoA[0]) && !std::signbit(intoA[1])) << toString(op);
    auto intoB = b;
    reduce(intoB.data(), a.data(), intoB.data(), 2, DataType::kF32, op);
    EXPECT_TRUE(std::signbit(intoB[0]) && !std::signbit(intoB[1])) << toString(op);
  }
}

TEST(ReduceEdgeTest, IntegerSumAndProductWrapAround) {
  std::array<std::int32_t, 2> i32{std::numeric_limits<std::int32_t>::max(), 65536};
  const std::array<std::int32_t, 2> one{1, 65536};
  reduceInto(i32.data(), one.data(), 1, DataType::kI32, ReduceOp::kSum);
  EXPECT_EQ(i32[0], std::numeric_limits<std::int32_t>::min());
  reduceInto(i32.data() + 1, one.data() + 1, 1, DataType::kI32, ReduceOp::kProd);
  EXPECT_EQ(i32[1], 0);  // 2^32 wraps to 0

  std::array<std::int64_t, 1> i64{std::numeric_limits<std::int64_t>::min()};
  const std::array<std::int64_t, 1> minusOne{-1};
  reduceInto(i64.data(), minusOne.data(), 1, DataType::kI64, ReduceOp::kSum);
  EXPECT_EQ(i64[0], std::numeric_limits<std::int64_t>::max());
}

TEST(ReduceEdgeTest, HalfSumRoundsToNearestEvenOnce) {
  // bf16 has 8 significant bits: 1 + 2^-8 is a tie and stays at 1; 1 + 3 * 2^-8 is a tie
  // too and goes up to the even 1 + 2^-6.
  std::array<std::uint16_t, 2> dst{floatToBF16(1.0f), floatToBF16(1.0f)};
  const std::array<std::uint16_t, 2> src{floatToBF16(0.00390625f), floatToBF16(0.01171875f)};
  reduceInto(dst.data(), src.data(), dst.size(), DataType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(bf16ToFloat(dst[0]), 1.0f);
  EXPECT_EQ(bf16ToFloat(dst[1]), 1.015625f);
  // f16 saturates to inf: 65504 + 16 is the tie between 65504 and 65536 (inf), even is inf.
  std::array<std::uint16_t, 1> big{floatToF16(65504.0f)};
  const std::array<std::uint16_t, 1> sixteen{floatToF16(16.0f)};
  reduceInto(big.data(), sixteen.data(), 1, DataType::kF16, ReduceOp::kSum);
  EXPECT_EQ(big[0], 0x7c00);
}

TEST(ReduceEdgeTest, RejectsUnknownEnumsAndPartialOverlap) {
  std::array<float, 8> buf{};
  const auto badType = static_cast<DataType>(42);
  const auto badOp = static_cast<ReduceOp>(42);
  EXPECT_THROW(reduceInto(buf.data(), buf.data() + 4, 4, badType, ReduceOp::kSum),
               std::invalid_argument);
  EXPECT_THROW(reduceInto(buf.data(), buf.data() + 4, 4, DataType::kF32, badOp),
               std::invalid_argument);
  EXPECT_THROW(reduce(buf.data(), buf.data(), buf.data() + 4, 4, badType, ReduceOp::kSum),
               std::invalid_argument);
  EXPECT_THROW(reduce(buf.data(), buf.data(), buf.data() + 4, 4, DataType::kF32, badOp),
               std::invalid_argument);
  EXPECT_THROW(divideBy(buf.data(), 4, badType, 2), std::invalid_argument);
  EXPECT_THROW(scale(buf.data(), 4, badType, 2.0), std::invalid_argument);
  EXPECT_THROW(reduceInto(buf.data(), buf.data() + 1, 4, DataType::kF32, ReduceOp::kSum),
               std::invalid_argument);
  EXPECT_THROW(reduce(buf.data() + 1, buf.data(), buf.data() + 4, 4, DataType::kF32,
                      ReduceOp::kSum),
               std::invalid_argument);
  EXPECT_NO_THROW(reduceInto(buf.data(), buf.data() + 4, 4, DataType::kF32, ReduceOp::kSum));
}

// ---- divideBy and scale --------------------------------------------------------------------

TEST(DivideByTest, IntegersTruncateTowardZero) {
  std::array<std::int32_t, 6> i32{7, -7, 5, -5, 0, std::numeric_limits<std::int32_t>::min()};
  divideBy(i32.data(), i32.size(), DataType::kI32, 2);
  EXPECT_EQ(i32, (std::array<std::int32_t, 6>{3, -3, 2, -2, 0, -1073741824}));

  std::array<std::int64_t, 4> i64{100, -100, 99, std::numeric_limits<std::int64_t>::max()};
  divideBy(i64.data(), i64.size(), DataType::kI64, -7);
  EXPECT_EQ(i64, (std::array<std::int64_t, 4>{-14, 14, -14, -1317624576693539401}));

  // The one overflowing quotient wraps like the other integer ops.
  std::array<std::int64_t, 2> minOverMinusOne{std::numeric_limits<std::int64_t>::min(), 5};
  divideBy(minOverMinusOne.data(), 2, DataType::kI64, -1);
  EXPECT_EQ(minOverMinusOne[0], std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(minOverMinusOne[1], -5);
  std::array<std::int32_t, 1> i32Min{std::numeric_limits<std::int32_t>::min()};
  divideBy(i32Min.data(), 1, DataType::kI32, -1);
  EXPECT_EQ(i32Min[0], std::numeric_limits<std::int32_t>::min());

  std::array<std::int32_t, 1> small{123456};
  divideBy(small.data(), 1, DataType::kI32, std::int64_t{1} << 40);
  EXPECT_EQ(small[0], 0);
}

TEST(DivideByTest, RejectsZeroDivisor) {
  std::array<float, 2> f{1.0f, 2.0f};
  EXPECT_THROW(divideBy(f.data(), f.size(), DataType::kF32, 0), std::invalid_argument);
  std::array<std::int32_t, 2> i{1, 2};
  EXPECT_THROW(divideBy(i.data(), i.size(), DataType::kI32, 0), std::invalid_argument);
}

// f32 and f16/bf16 multiply by the factor rounded to f32 (f16/bf16 through f32), f64 in f64.
template <typename Traits>
typename Traits::T scaledReference(typename Traits::T v, double factor) {
  using T = typename Traits::T;
  if constexpr (std::is_same_v<T, double>) {
    return v * factor;
  } else if constexpr (std::is_same_v<T, float>) {
    return v * static_cast<float>(factor);
  } else if constexpr (requires { Traits::toFloat(v); }) {
    return Traits::fromFloat(Traits::toFloat(v) * static_cast<float>(factor));
  } else {
    ADD_FAILURE() << "integer types are not scaled through this reference";
    return v;
  }
}

// Floats multiply by the reciprocal: 1/divisor in f32 for f32/f16/bf16, in f64 for f64.
TEST(DivideByTest, FloatsMultiplyByReciprocalForOddLengths) {
  for (DataType type : {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16}) {
    visitType(type, [&]<typename Traits>() {
      Rng rng(kSeed + 5);
      for (std::size_t count : kCounts) {
        auto data = randomBuffer<Traits>(count, rng);
        std::vector<typename Traits::T> want(count);
        for (std::size_t i = 0; i < count; ++i) {
          want[i] = scaledReference<Traits>(data[i + 1], 1.0 / 3.0);
        }
        divideBy(data.data() + 1, count, type, 3);
        expectSameElements<Traits>(data.data() + 1, want.data(), count,
                                   std::string(toString(type)) + " count=" + std::to_string(count));
      }
    });
  }
}

TEST(ScaleTest, FloatsMultiplyByFactorForOddLengths) {
  constexpr double kFactor = -0.3;
  for (DataType type : {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16}) {
    visitType(type, [&]<typename Traits>() {
      Rng rng(kSeed + 6);
      for (std::size_t count : kCounts) {
        auto data = randomBuffer<Traits>(count, rng);
        std::vector<typename Traits::T> want(count);
        for (std::size_t i = 0; i < count; ++i) {
          want[i] = scaledReference<Traits>(data[i + 1], kFactor);
        }
        scale(data.data() + 1, count, type, kFactor);
        expectSameElements<Traits>(data.data() + 1, want.data(), count,
                                   std::string(toString(type)) + " count=" + std::to_string(count));
      }
    });
  }
}

TEST(ScaleTest, IntegersRoundTowardZeroAndSaturate) {
  std::array<std::int32_t, 5> i32{5, -5, 3, std::numeric_limits<std::int32_t>::max(),
                                  std::numeric_limits<std::int32_t>::min()};
  scale(i32.data(), 3, DataType::kI32, 0.5);
  EXPECT_EQ(i32[0], 2);
  EXPECT_EQ(i32[1], -2);
  EXPECT_EQ(i32[2], 1);
  scale(i32.data() + 3, 2, DataType::kI32, 2.0);
  EXPECT_EQ(i32[3], std::numeric_limits<std::int32_t>::max());
  EXPECT_EQ(i32[4], std::numeric_limits<std::int32_t>::min());

  std::array<std::int64_t, 3> i64{1001, -1001, std::numeric_limits<std::int64_t>::max()};
  scale(i64.data(), 2, DataType::kI64, -0.75);
  EXPECT_EQ(i64[0], -750);
  EXPECT_EQ(i64[1], 750);
  scale(i64.data() + 2, 1, DataType::kI64, 4.0);
  EXPECT_EQ(i64[2], std::numeric_limits<std::int64_t>::max());

  std::array<std::int32_t, 1> nanScaled{17};
  scale(nanScaled.data(), 1, DataType::kI32, std::nan(""));
  EXPECT_EQ(nanScaled[0], 0);
}

// ---- Casts: exhaustive over half bit patterns ------------------------------------------------

std::vector<std::uint16_t> allHalfPatterns() {
  std::vector<std::uint16_t> out(65536);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint16_t>(i);
  return out;
}

TEST(CastTest, BF16ToF32IsExactForAllBitPatterns) {
  const auto patterns = allHalfPatterns();
  std::vector<float> widened(patterns.size());
  castBF16ToF32(patterns.data(), widened.data(), patterns.size());
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint32_t want = h << 16;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(widened[h]), want) << "bf16 0x" << std::hex << h;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(bf16ToFloat(static_cast<std::uint16_t>(h))), want);
  }
}

TEST(CastTest, F16ToF32MatchesArithmeticDecodeForAllBitPatterns) {
  const auto patterns = allHalfPatterns();
  std::vector<float> widened(patterns.size());
  castF16ToF32(patterns.data(), widened.data(), patterns.size());
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float scalar = f16ToFloat(bits);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(widened[h]), std::bit_cast<std::uint32_t>(scalar))
        << "vector and scalar differ for f16 0x" << std::hex << h;
    if (isHalfNan(bits)) {
      // Sign and payload (quiet bit included) move up unchanged.
      const std::uint32_t want = ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(scalar), want) << "f16 NaN 0x" << std::hex << h;
    } else {
      const double want = refDecodeF16(bits);
      ASSERT_EQ(static_cast<double>(scalar), want) << "f16 0x" << std::hex << h;
      ASSERT_EQ(std::signbit(scalar), (h & 0x8000u) != 0) << "f16 0x" << std::hex << h;
    }
  }
}

TEST(CastTest, HalfPatternsRoundTripThroughF32AndNaNStaysQuietNaN) {
  const auto patterns = allHalfPatterns();
  std::vector<float> widened(patterns.size());
  std::vector<std::uint16_t> back(patterns.size());
  for (bool bf16 : {false, true}) {
    if (bf16) {
      castBF16ToF32(patterns.data(), widened.data(), patterns.size());
      castF32ToBF16(widened.data(), back.data(), back.size());
    } else {
      castF16ToF32(patterns.data(), widened.data(), patterns.size());
      castF32ToF16(widened.data(), back.data(), back.size());
    }
    for (std::uint32_t h = 0; h < 65536; ++h) {
      const auto bits = static_cast<std::uint16_t>(h);
      const std::uint16_t scalar = bf16 ? floatToBF16(widened[h]) : floatToF16(widened[h]);
      ASSERT_EQ(back[h], scalar) << (bf16 ? "bf16" : "f16") << " vector/scalar 0x" << std::hex << h;
      if (bf16 ? isBF16Nan(bits) : isHalfNan(bits)) {
        const std::uint16_t quietBit = bf16 ? 0x0040 : 0x0200;
        ASSERT_EQ(back[h], bits | quietBit)
            << (bf16 ? "bf16" : "f16") << " NaN 0x" << std::hex << h;
      } else {
        ASSERT_EQ(back[h], bits) << (bf16 ? "bf16" : "f16") << " 0x" << std::hex << h;
      }
    }
  }
}

double halfValue(bool bf16, std::uint16_t bits) {
  return bf16 ? static_cast<double>(bf16ToFloat(bits)) : refDecodeF16(bits);
}

// Every midpoint between adjacent finite halves (all exact in f32) must round to the even
// one; above the largest finite value the tie is max + ulp / 2 and goes to inf.
TEST(CastTest, F32ToHalfRoundsEveryTieToEven) {
  for (bool bf16 : {false, true}) {
    const std::uint16_t infBits = bf16 ? 0x7f80 : 0x7c00;
    std::vector<float> ties;
    std::vector<std::uint16_t> wantBits;
    for (std::uint16_t lo = 1; lo < infBits; ++lo) {
      const auto hi = static_cast<std::uint16_t>(lo + 1);
      const double loValue = halfValue(bf16, lo);
      const double ulp = loValue - halfValue(bf16, static_cast<std::uint16_t>(lo - 1));
      const double hiValue = hi == infBits ? loValue + ulp : halfValue(bf16, hi);
      const double mid = (loValue + hiValue) / 2;
      const std::uint16_t even = (lo & 1) == 0 ? lo : hi;
      for (double sign : {1.0, -1.0}) {
        ties.push_back(static_cast<float>(sign * mid));
        ASSERT_EQ(static_cast<double>(ties.back()), sign * mid) << "tie not exact in f32";
        wantBits.push_back(static_cast<std::uint16_t>(even | (sign < 0 ? 0x8000 : 0)));
      }
    }
    std::vector<std::uint16_t> got(ties.size());
    if (bf16) {
      castF32ToBF16(ties.data(), got.data(), ties.size());
    } else {
      castF32ToF16(ties.data(), got.data(), ties.size());
    }
    for (std::size_t i = 0; i < ties.size(); ++i) {
      ASSERT_EQ(got[i], wantBits[i]) << (bf16 ? "bf16" : "f16") << " tie " << ties[i];
      ASSERT_EQ(got[i], bf16 ? floatToBF16(ties[i]) : floatToF16(ties[i]));
    }
  }
}

TEST(CastTest, F32ToHalfMatchesDoubleRoundingReferenceOnRandomBitPatterns) {
  Rng rng(kSeed + 7);
  constexpr std::size_t kSamples = 1 << 20;
  std::vector<float> values(kSamples + 1);
  for (auto& v : values) v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  // Put half the samples at exponents 2^-27 .. 2^18, where f16 rounding is interesting.
  for (std::size_t i = 0; i < values.size(); i += 2) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const std::uint32_t exponent = 100 + static_cast<std::uint32_t>(rng() % 46);
    values[i] = std::bit_cast<float>((bits & 0x807fffffu) | (exponent << 23));
  }
  std::vector<std::uint16_t> f16(kSamples + 1);
  std::vector<std::uint16_t> bf16(kSamples + 1);
  castF32ToF16(values.data() + 1, f16.data() + 1, kSamples);
  castF32ToBF16(values.data() + 1, bf16.data() + 1, kSamples);
  for (std::size_t i = 1; i <= kSamples; ++i) {
    const float v = values[i];
    ASSERT_EQ(f16[i], floatToF16(v)) << "f16 vector/scalar for " << v;
    ASSERT_EQ(bf16[i], floatToBF16(v)) << "bf16 vector/scalar for " << v;
    if (std::isnan(v)) {
      ASSERT_TRUE(isHalfNan(f16[i]));
      ASSERT_TRUE(isBF16Nan(bf16[i]));
    } else {
      ASSERT_EQ(f16[i], refEncodeF16(v)) << "f16 for " << v;
      ASSERT_EQ(bf16[i], refEncodeBF16(v)) << "bf16 for " << v;
    }
  }
}

TEST(CastTest, F32ToF16HandlesSubnormalsOverflowAndNaN) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  EXPECT_EQ(floatToF16(tiny), 0x0001);
  EXPECT_EQ(floatToF16(tiny / 2), 0x0000);              // tie -> even (zero)
  EXPECT_EQ(floatToF16(tiny * 0.5000001f), 0x0001);     // just above the tie
  EXPECT_EQ(floatToF16(tiny * 1.5f), 0x0002);           // tie -> even (2)
  EXPECT_EQ(floatToF16(tiny * 2.5f), 0x0002);           // tie -> even (2)
  EXPECT_EQ(floatToF16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(floatToF16(-0.0f), 0x8000);
  EXPECT_EQ(floatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(floatToF16(65519.996f), 0x7bff);
  EXPECT_EQ(floatToF16(65520.0f), 0x7c00);  // tie between max and 2^16 -> inf
  EXPECT_EQ(floatToF16(1e10f), 0x7c00);
  EXPECT_EQ(floatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(floatToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToF16(std::bit_cast<float>(0x7f800001u)), 0x7e00);  // sNaN -> qNaN, not inf
  EXPECT_EQ(floatToF16(std::bit_cast<float>(0xffc02000u)), 0xfe01);  // sign and payload kept
  EXPECT_EQ(floatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);         // tie -> even
  EXPECT_EQ(floatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);     // tie -> even
}

TEST(CastTest, F32ToBF16HandlesTiesOverflowAndNaN) {
  EXPECT_EQ(floatToBF16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(floatToBF16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(floatToBF16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(floatToBF16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(floatToBF16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(floatToBF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToBF16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // sNaN -> qNaN, not inf
  EXPECT_EQ(floatToBF16(std::bit_cast<float>(0xff810000u)), 0xffc1);  // sign and payload kept
}

TEST(CastTest, VectorCastsMatchScalarForOddLengthsAndUnalignedPointers) {
  Rng rng(kSeed + 8);
  for (std::size_t count : kCounts) {
    std::vector<float> src(count + 1);
    for (auto& v : src) v = randomFloat<float>(rng);
    std::vector<std::uint16_t> narrowed(count + 1, 0xabcd);
    std::vector<float> widened(count + 1, -1.0f);
    castF32ToF16(src.data() + 1, narrowed.data() + 1, count);
    castF16ToF32(narrowed.data() + 1, widened.data() + 1, count);
    EXPECT_EQ(narrowed[0], 0xabcd);
    for (std::size_t i = 1; i <= count; ++i) {
      ASSERT_EQ(narrowed[i], floatToF16(src[i])) << "count=" << count << " i=" << i;
      ASSERT_TRUE(sameFloat(widened[i], f16ToFloat(narrowed[i])));
    }
    castF32ToBF16(src.data() + 1, narrowed.data() + 1, count);
    castBF16ToF32(narrowed.data() + 1, widened.data() + 1, count);
    for (std::size_t i = 1; i <= count; ++i) {
      ASSERT_EQ(narrowed[i], floatToBF16(src[i])) << "count=" << count << " i=" << i;
      ASSERT_TRUE(sameFloat(widened[i], bf16ToFloat(narrowed[i])));
    }
  }
}

TEST(CastTest, RejectsOverlappingBuffers) {
  std::array<float, 8> buf{};
  auto* asHalf = reinterpret_cast<std::uint16_t*>(buf.data());
  EXPECT_THROW(castF32ToBF16(buf.data(), asHalf, 4), std::invalid_argument);
  EXPECT_THROW(castF16ToF32(asHalf + 6, buf.data(), 4), std::invalid_argument);
  EXPECT_THROW(castF32ToF16(buf.data(), asHalf + 2, 2), std::invalid_argument);
}

// ---- Names ---------------------------------------------------------------------------------

TEST(TypesTest, NamesRoundTripThroughParse) {
  for (DataType type : kAllTypes) EXPECT_EQ(parseDataType(toString(type)), type);
  for (ReduceOp op : kAllOps) EXPECT_EQ(parseReduceOp(toString(op)), op);
  EXPECT_EQ(toString(DataType::kBF16), "bf16");
  EXPECT_EQ(toString(ReduceOp::kAvg), "avg");
}

TEST(TypesTest, UnknownNamesAndValuesAreRejected) {
  for (const char* name : {"", "F32", "float", "fp16", "f32 ", "sum", "bfloat16"}) {
    EXPECT_EQ(parseDataType(name), std::nullopt) << name;
  }
  for (const char* name : {"", "Sum", "mean", "average", "f32", "max "}) {
    EXPECT_EQ(parseReduceOp(name), std::nullopt) << name;
  }
  EXPECT_THROW(toString(static_cast<DataType>(42)), std::invalid_argument);
  EXPECT_THROW(toString(static_cast<ReduceOp>(42)), std::invalid_argument);
}

}  // namespace
}  // namespace meridian::kernels
