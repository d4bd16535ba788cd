// Scalar f32 <-> bf16/f16 conversions, branch-free so they vectorise, and compiled for both
// host and device: reduce_cpu.cc inlines them into its loops and the CUDA backend into its
// kernels, so the two round every value to the same bits (kernels/reduce.h has the API).
#pragma once

#include <bit>
#include <cstdint>

#if defined(__CUDACC__)
#define MERIDIAN_HALF_INLINE __host__ __device__ __forceinline__
#else
// Forced inline so each target_clones copy of a loop gets the helpers for its own ISA.
#define MERIDIAN_HALF_INLINE [[gnu::always_inline]] inline
#endif

namespace meridian::kernels {

MERIDIAN_HALF_INLINE float halfBitsToFloat(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

MERIDIAN_HALF_INLINE std::uint32_t halfFloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}

MERIDIAN_HALF_INLINE float bf16ToFloatInline(std::uint16_t v) {
  return halfBitsToFloat(static_cast<std::uint32_t>(v) << 16);
}

// Round to nearest even by adding 0x7fff plus the lowest kept bit; NaN keeps its sign and
// top payload bits and gets the quiet bit (so a NaN never truncates to inf).
MERIDIAN_HALF_INLINE std::uint16_t floatToBF16Inline(float f) {
  const std::uint32_t bits = halfFloatToBits(f);
  const std::uint32_t keptLsb = (bits >> 16) & 1u;
  const std::uint32_t rounded = (bits + 0x7fffu + keptLsb) >> 16;
  const std::uint32_t quietNan = (bits >> 16) | 0x0040u;
  const bool isNan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(isNan ? quietNan : rounded);
}

// All ones when c holds. The f16 conversions select with these masks rather than ?: so GCC
// if-converts them (nested ?: left "control flow in loop" and no vectorisation for f16).
MERIDIAN_HALF_INLINE std::uint32_t halfMaskIf(bool c) { return 0u - static_cast<std::uint32_t>(c); }

// Exact widening (every half is a float). NaN payloads, including the quiet bit, are kept.
MERIDIAN_HALF_INLINE float f16ToFloatInline(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t expMant = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exponent = expMant & 0x0f800000u;
  const std::uint32_t isInfOrNan = halfMaskIf(exponent == 0x0f800000u);
  const std::uint32_t isSubnormal = halfMaskIf(exponent == 0);
  // Rebias 15 -> 127; exponent 31 moves on to 255.
  const std::uint32_t normal = expMant + 0x38000000u + (isInfOrNan & 0x38000000u);
  // Subnormal or zero: read the mantissa as 2^-14 * (1 + m/1024), then subtract 2^-14.
  const float subnormal = halfBitsToFloat(expMant + 0x38800000u) - 6.103515625e-05f;
  const std::uint32_t magnitude =
      (halfFloatToBits(subnormal) & isSubnormal) | (normal & ~isSubnormal);
  return halfBitsToFloat(magnitude | sign);
}

// Full IEEE binary16 with round to nearest even: subnormals via a float add against 0.5
// (whose ulp is 2^-24, the smallest half subnormal), overflow to inf, NaN kept quiet.
MERIDIAN_HALF_INLINE std::uint16_t floatToF16Inline(float f) {
  const std::uint32_t bits = halfFloatToBits(f);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t absBits = bits & 0x7fffffffu;
  // Normal: rebias the exponent by (15 - 127) << 23 (mod 2^32) and round the 13 dropped bits.
  const std::uint32_t mantOdd = (absBits >> 13) & 1u;
  const std::uint32_t normal = (absBits + 0xc8000fffu + mantOdd) >> 13;
  const std::uint32_t subnormal =
      halfFloatToBits(halfBitsToFloat(absBits) + 0.5f) - 0x3f000000u;
  const std::uint32_t isNan = halfMaskIf(absBits > 0x7f800000u);
  const std::uint32_t isInf = halfMaskIf(absBits >= 0x47800000u);  // >= 65536 before rounding
  const std::uint32_t isSubnormal = halfMaskIf(absBits < 0x38800000u);  // < 2^-14
  const std::uint32_t infOrNan = 0x7c00u | (isNan & (0x0200u | ((absBits >> 13) & 0x03ffu)));
  const std::uint32_t magnitude = (infOrNan & isInf) | (subnormal & isSubnormal) |
                                  (normal & ~(isInf | isSubnormal));
  return static_cast<std::uint16_t>(magnitude | sign);
}

}  // namespace meridian::kernels
