// CPU reduction, cast and scaling kernels (the reference for the CUDA twins). Counts are
// in elements. f16 and bf16 are reduced in f32 and rounded to nearest even once per call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace meridian::kernels {

// dst[i] = dst[i] op src[i] for i < count. kAvg reduces like kSum (divide afterwards
// with scaleByInverse). dst and src may not overlap unless equal.
void reduceInto(void* dst, const void* src, std::size_t count, DataType type, ReduceOp op);

// dst[i] = a[i] op b[i]; dst may equal a or b.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, ReduceOp op);

// data[i] /= divisor (integers: truncating division; floats: multiply by 1/divisor).
void divideBy(void* data, std::size_t count, DataType type, std::int64_t divisor);

// data[i] *= factor (floating types only; integers are rounded toward zero).
void scale(void* data, std::size_t count, DataType type, double factor);

// Conversions. Narrowing rounds to nearest even; NaN stays NaN, overflow becomes inf.
void castF32ToBF16(const float* src, std::uint16_t* dst, std::size_t count);
void castBF16ToF32(const std::uint16_t* src, float* dst, std::size_t count);
void castF32ToF16(const float* src, std::uint16_t* dst, std::size_t count);
void castF16ToF32(const std::uint16_t* src, float* dst, std::size_t count);

// Scalar conversions (the reference the vector loops are tested against).
float bf16ToFloat(std::uint16_t v);
std::uint16_t floatToBF16(float v);
float f16ToFloat(std::uint16_t v);
std::uint16_t floatToF16(float v);

}  // namespace meridian::kernels
