// Element types and reduction operators shared by kernels, collectives and the trainer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace meridian::kernels {

enum class DataType : std::uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64 };
enum class ReduceOp : std::uint8_t { kSum, kProd, kMin, kMax, kAvg };

// Size of one element in bytes.
constexpr std::size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kF32: return 4;
    case DataType::kF64: return 8;
    case DataType::kF16: return 2;
    case DataType::kBF16: return 2;
    case DataType::kI32: return 4;
    case DataType::kI64: return 8;
  }
  return 0;
}

std::string_view toString(DataType t);
std::string_view toString(ReduceOp op);
// Accepts the names toString prints ("f32", "bf16", "sum", ...); nullopt otherwise.
std::optional<DataType> parseDataType(std::string_view name);
std::optional<ReduceOp> parseReduceOp(std::string_view name);

}  // namespace meridian::kernels
