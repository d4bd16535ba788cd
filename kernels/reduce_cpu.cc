// CPU reduction, cast and scaling kernels: plain loops that GCC vectorises, cloned for
// x86-64-v4 (AVX-512)/AVX2/baseline and picked once at load time. The reference for reduce.cu.
#include "kernels/reduce.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/half_bits.h"

// Hot loops get one copy per ISA; the dynamic loader picks one through an ifunc.
// x86-64-v4 (AVX-512 F/BW/DQ/VL) rather than plain avx512f: without BW the 16-bit loops
// stay at 256 bits, and v4 is the faster clone on the f16/bf16 paths (bench/). Defining
// MERIDIAN_KERNEL_CLONES (e.g. empty) on the command line pins one ISA to test that clone.
#ifndef MERIDIAN_KERNEL_CLONES
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MERIDIAN_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MERIDIAN_KERNEL_CLONES
#endif
#endif
// Helpers are forced inline so they are compiled (and vectorised) for each clone's ISA.
#define MERIDIAN_KERNEL_INLINE [[gnu::always_inline]] inline

namespace meridian::kernels {
namespace {

// Half-precision inputs are widened this many elements at a time into stack buffers.
constexpr std::size_t kHalfBlockElems = 256;

// ---- Element-wise operators -------------------------------------------------------------

// Integers wrap (computed unsigned). Float min/max return NaN when either input is NaN, so
// the result does not depend on operand order; otherwise they match std::min/std::max.
template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE T combine(T a, T b) {
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg || kOp == ReduceOp::kProd) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      const U ua = static_cast<U>(a);
      const U ub = static_cast<U>(b);
      return static_cast<T>(kOp == ReduceOp::kProd ? ua * ub : ua + ub);
    } else {
      return kOp == ReduceOp::kProd ? a * b : a + b;
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    if constexpr (std::is_floating_point_v<T>) {
      return (b < a || b != b) ? b : a;
    } else {
      return b < a ? b : a;
    }
  } else {
    static_assert(kOp == ReduceOp::kMax);
    if constexpr (std::is_floating_point_v<T>) {
      return (a < b || b != b) ? b : a;
    } else {
      return a < b ? b : a;
    }
  }
}

// One loop per aliasing pattern so each can promise the compiler no overlap (__restrict).
template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE void combineDistinct(T* __restrict out, const T* __restrict x,
                                            const T* __restrict y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = combine<kOp>(x[i], y[i]);
}

template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE void combineIntoFirst(T* __restrict io, const T* __restrict y,
                                             std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) io[i] = combine<kOp>(io[i], y[i]);
}

template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE void combineIntoSecond(T* __restrict io, const T* __restrict x,
                                              std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) io[i] = combine<kOp>(x[i], io[i]);
}

template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE void combineSelf(T* __restrict io, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) io[i] = combine<kOp>(io[i], io[i]);
}

// out[i] = x[i] op y[i]; out may equal x and/or y, otherwise nothing overlaps out.
template <ReduceOp kOp, typename T>
MERIDIAN_KERNEL_INLINE void combineAny(T* out, const T* x, const T* y, std::size_t n) {
  if (out == x && out == y) {
    combineSelf<kOp>(out, n);
  } else if (out == x) {
    combineIntoFirst<kOp>(out, y, n);
  } else if (out == y) {
    combineIntoSecond<kOp>(out, x, n);
  } else {
    combineDistinct<kOp>(out, x, y, n);
  }
}

template <typename T>
MERIDIAN_KERNEL_INLINE void combineOp(T* out, const T* x, const T* y, std::size_t n,
                                      ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: combineAny<ReduceOp::kSum>(out, x, y, n); return;
    case ReduceOp::kProd: combineAny<ReduceOp::kProd>(out, x, y, n); return;
    case ReduceOp::kMin: combineAny<ReduceOp::kMin>(out, x, y, n); return;
    case ReduceOp::kMax: combineAny<ReduceOp::kMax>(out, x, y, n); return;
  }
}

// ---- Half precision through f32 blocks ---------------------------------------------------

template <bool kBF16>
MERIDIAN_KERNEL_INLINE void widenHalf(const std::uint16_t* __restrict src,
                                      float* __restrict dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = kBF16 ? bf16ToFloatInline(src[i]) : f16ToFloatInline(src[i]);
  }
}

template <bool kBF16>
MERIDIAN_KERNEL_INLINE void narrowHalf(const float* __restrict src,
                                       std::uint16_t* __restrict dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = kBF16 ? floatToBF16Inline(src[i]) : floatToF16Inline(src[i]);
  }
}

// Each block of x and y is read before the block of out is written, so out may equal x/y.
template <bool kBF16>
MERIDIAN_KERNEL_INLINE void combineHalf(std::uint16_t* out, const std::uint16_t* x,
                                        const std::uint16_t* y, std::size_t n, ReduceOp op) {
  alignas(64) float blockX[kHalfBlockElems];
  alignas(64) float blockY[kHalfBlockElems];
  for (std::size_t base = 0; base < n; base += kHalfBlockElems) {
    const std::size_t m = std::min(kHalfBlockElems, n - base);
    widenHalf<kBF16>(x + base, blockX, m);
    widenHalf<kBF16>(y + base, blockY, m);
    combineOp<float>(blockX, blockX, blockY, m, op);
    narrowHalf<kBF16>(blockX, out + base, m);
  }
}

template <bool kBF16>
MERIDIAN_KERNEL_INLINE void scaleHalf(std::uint16_t* __restrict data, std::size_t n,
                                      float factor) {
  alignas(64) float block[kHalfBlockElems];
  for (std::size_t base = 0; base < n; base += kHalfBlockElems) {
    const std::size_t m = std::min(kHalfBlockElems, n - base);
    widenHalf<kBF16>(data + base, block, m);
    for (std::size_t i = 0; i < m; ++i) block[i] *= factor;
    narrowHalf<kBF16>(block, data + base, m);
  }
}

// ---- Cloned entry points (one ifunc per type, the op switch inside) ----------------------

MERIDIAN_KERNEL_CLONES void combineF32(float* out, const float* x, const float* y,
                                       std::size_t n, ReduceOp op) {
  combineOp<float>(out, x, y, n, op);
}
MERIDIAN_KERNEL_CLONES void combineF64(double* out, const double* x, const double* y,
                                       std::size_t n, ReduceOp op) {
  combineOp<double>(out, x, y, n, op);
}
MERIDIAN_KERNEL_CLONES void combineI32(std::int32_t* out, const std::int32_t* x,
                                       const std::int32_t* y, std::size_t n, ReduceOp op) {
  combineOp<std::int32_t>(out, x, y, n, op);
}
MERIDIAN_KERNEL_CLONES void combineI64(std::int64_t* out, const std::int64_t* x,
                                       const std::int64_t* y, std::size_t n, ReduceOp op) {
  combineOp<std::int64_t>(out, x, y, n, op);
}
MERIDIAN_KERNEL_CLONES void combineBF16(std::uint16_t* out, const std::uint16_t* x,
                                        const std::uint16_t* y, std::size_t n, ReduceOp op) {
  combineHalf<true>(out, x, y, n, op);
}
MERIDIAN_KERNEL_CLONES void combineF16(std::uint16_t* out, const std::uint16_t* x,
                                       const std::uint16_t* y, std::size_t n, ReduceOp op) {
  combineHalf<false>(out, x, y, n, op);
}

MERIDIAN_KERNEL_CLONES void scaleF32(float* __restrict data, std::size_t n, float factor) {
  for (std::size_t i = 0; i < n; ++i) data[i] *= factor;
}
MERIDIAN_KERNEL_CLONES void scaleF64(double* __restrict data, std::size_t n, double factor) {
  for (std::size_t i = 0; i < n; ++i) data[i] *= factor;
}
MERIDIAN_KERNEL_CLONES void scaleBF16(std::uint16_t* __restrict data, std::size_t n,
                                      float factor) {
  scaleHalf<true>(data, n, factor);
}
MERIDIAN_KERNEL_CLONES void scaleF16(std::uint16_t* __restrict data, std::size_t n,
                                     float factor) {
  scaleHalf<false>(data, n, factor);
}

MERIDIAN_KERNEL_CLONES void castF32ToBF16Loop(const float* __restrict src,
                                              std::uint16_t* __restrict dst, std::size_t n) {
  narrowHalf<true>(src, dst, n);
}
MERIDIAN_KERNEL_CLONES void castBF16ToF32Loop(const std::uint16_t* __restrict src,
                                              float* __restrict dst, std::size_t n) {
  widenHalf<true>(src, dst, n);
}
MERIDIAN_KERNEL_CLONES void castF32ToF16Loop(const float* __restrict src,
                                             std::uint16_t* __restrict dst, std::size_t n) {
  narrowHalf<false>(src, dst, n);
}
MERIDIAN_KERNEL_CLONES void castF16ToF32Loop(const std::uint16_t* __restrict src,
                                             float* __restrict dst, std::size_t n) {
  widenHalf<false>(src, dst, n);
}

// ---- Integers: not worth cloning (division and double round trips do not vectorise) ------

// Truncates toward zero; NaN becomes 0, out-of-range values saturate.
template <typename T>
T truncateSaturating(double v) {
  constexpr double kLimit = -static_cast<double>(std::numeric_limits<T>::min());  // 2^(bits-1)
  if (v != v) return 0;
  if (v >= kLimit) return std::numeric_limits<T>::max();
  if (v < -kLimit) return std::numeric_limits<T>::min();
  return static_cast<T>(v);
}

template <typename T>
void scaleIntegers(T* data, std::size_t n, double factor) {
  for (std::size_t i = 0; i < n; ++i) {
    data[i] = truncateSaturating<T>(static_cast<double>(data[i]) * factor);
  }
}

// Truncating division; the one overflowing case (min / -1) wraps like the other int ops.
template <typename T>
void divideIntegers(T* data, std::size_t n, std::int64_t divisor) {
  using U = std::make_unsigned_t<T>;
  if (divisor == -1) {
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(U{0} - static_cast<U>(data[i]));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    data[i] = static_cast<T>(static_cast<std::int64_t>(data[i]) / divisor);
  }
}

// ---- Argument checks ---------------------------------------------------------------------

[[noreturn]] void throwUnknown(const char* what, int value) {
  throw std::invalid_argument(std::string("meridian::kernels: unknown ") + what + " value " +
                              std::to_string(value));
}

std::size_t checkedTypeSize(DataType type) {
  const std::size_t size = dataTypeSize(type);
  if (size == 0) throwUnknown("DataType", static_cast<int>(type));
  return size;
}

void checkOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kAvg: return;
  }
  throwUnknown("ReduceOp", static_cast<int>(op));
}

// Two byte ranges may be identical or disjoint; a partial overlap is a caller bug.
void checkSameOrDisjoint(const void* p, const void* q, std::size_t bytes, const char* what) {
  if (p == q || bytes == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto b = reinterpret_cast<std::uintptr_t>(q);
  if (a < b + bytes && b < a + bytes) {
    throw std::invalid_argument(std::string("meridian::kernels: ") + what +
                                " buffers partially overlap");
  }
}

void checkDisjoint(const void* p, std::size_t pBytes, const void* q, std::size_t qBytes,
                   const char* what) {
  if (pBytes == 0 || qBytes == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto b = reinterpret_cast<std::uintptr_t>(q);
  if (a < b + qBytes && b < a + pBytes) {
    throw std::invalid_argument(std::string("meridian::kernels: ") + what +
                                " source and destination overlap");
  }
}

void combineTyped(void* out, const void* x, const void* y, std::size_t count, DataType type,
                  ReduceOp op) {
  switch (type) {
    case DataType::kF32:
      combineF32(static_cast<float*>(out), static_cast<const float*>(x),
                 static_cast<const float*>(y), count, op);
      return;
    case DataType::kF64:
      combineF64(static_cast<double*>(out), static_cast<const double*>(x),
                 static_cast<const double*>(y), count, op);
      return;
    case DataType::kF16:
      combineF16(static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(x),
                 static_cast<const std::uint16_t*>(y), count, op);
      return;
    case DataType::kBF16:
      combineBF16(static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(x),
                  static_cast<const std::uint16_t*>(y), count, op);
      return;
    case DataType::kI32:
      combineI32(static_cast<std::int32_t*>(out), static_cast<const std::int32_t*>(x),
                 static_cast<const std::int32_t*>(y), count, op);
      return;
    case DataType::kI64:
      combineI64(static_cast<std::int64_t*>(out), static_cast<const std::int64_t*>(x),
                 static_cast<const std::int64_t*>(y), count, op);
      return;
  }
  throwUnknown("DataType", static_cast<int>(type));
}

}  // namespace

// ---- Public API --------------------------------------------------------------------------

void reduceInto(void* dst, const void* src, std::size_t count, DataType type, ReduceOp op) {
  const std::size_t bytes = count * checkedTypeSize(type);
  checkOp(op);
  if (count == 0) return;
  checkSameOrDisjoint(dst, src, bytes, "reduceInto");
  combineTyped(dst, dst, src, count, type, op);
}

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type,
            ReduceOp op) {
  const std::size_t bytes = count * checkedTypeSize(type);
  checkOp(op);
  if (count == 0) return;
  checkSameOrDisjoint(dst, a, bytes, "reduce");
  checkSameOrDisjoint(dst, b, bytes, "reduce");
  combineTyped(dst, a, b, count, type, op);
}

void divideBy(void* data, std::size_t count, DataType type, std::int64_t divisor) {
  checkedTypeSize(type);
  if (divisor == 0) throw std::invalid_argument("meridian::kernels: divideBy(0)");
  const double inverse = 1.0 / static_cast<double>(divisor);
  switch (type) {
    case DataType::kF32:
      scaleF32(static_cast<float*>(data), count, static_cast<float>(inverse));
      return;
    case DataType::kF64: scaleF64(static_cast<double*>(data), count, inverse); return;
    case DataType::kF16:
      scaleF16(static_cast<std::uint16_t*>(data), count, static_cast<float>(inverse));
      return;
    case DataType::kBF16:
      scaleBF16(static_cast<std::uint16_t*>(data), count, static_cast<float>(inverse));
      return;
    case DataType::kI32: divideIntegers(static_cast<std::int32_t*>(data), count, divisor); return;
    case DataType::kI64: divideIntegers(static_cast<std::int64_t*>(data), count, divisor); return;
  }
}

void scale(void* data, std::size_t count, DataType type, double factor) {
  checkedTypeSize(type);
  const float factorF32 = static_cast<float>(factor);
  switch (type) {
    case DataType::kF32: scaleF32(static_cast<float*>(data), count, factorF32); return;
    case DataType::kF64: scaleF64(static_cast<double*>(data), count, factor); return;
    case DataType::kF16: scaleF16(static_cast<std::uint16_t*>(data), count, factorF32); return;
    case DataType::kBF16: scaleBF16(static_cast<std::uint16_t*>(data), count, factorF32); return;
    case DataType::kI32: scaleIntegers(static_cast<std::int32_t*>(data), count, factor); return;
    case DataType::kI64: scaleIntegers(static_cast<std::int64_t*>(data), count, factor); return;
  }
}

void castF32ToBF16(const float* src, std::uint16_t* dst, std::size_t count) {
  checkDisjoint(src, count * sizeof(float), dst, count * sizeof(std::uint16_t), "castF32ToBF16");
  castF32ToBF16Loop(src, dst, count);
}

void castBF16ToF32(const std::uint16_t* src, float* dst, std::size_t count) {
  checkDisjoint(src, count * sizeof(std::uint16_t), dst, count * sizeof(float), "castBF16ToF32");
  castBF16ToF32Loop(src, dst, count);
}

void castF32ToF16(const float* src, std::uint16_t* dst, std::size_t count) {
  checkDisjoint(src, count * sizeof(float), dst, count * sizeof(std::uint16_t), "castF32ToF16");
  castF32ToF16Loop(src, dst, count);
}

void castF16ToF32(const std::uint16_t* src, float* dst, std::size_t count) {
  checkDisjoint(src, count * sizeof(std::uint16_t), dst, count * sizeof(float), "castF16ToF32");
  castF16ToF32Loop(src, dst, count);
}

float bf16ToFloat(std::uint16_t v) { return bf16ToFloatInline(v); }
std::uint16_t floatToBF16(float v) { return floatToBF16Inline(v); }
float f16ToFloat(std::uint16_t v) { return f16ToFloatInline(v); }
std::uint16_t floatToF16(float v) { return floatToF16Inline(v); }

}  // namespace meridian::kernels
