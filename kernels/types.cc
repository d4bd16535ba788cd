// Names of element types and reduction operators, as they appear in configuration, logs
// and benchmark labels ("f32", "bf16", "sum", ...).
#include "kernels/types.h"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

namespace meridian::kernels {
namespace {

constexpr std::array<std::pair<DataType, std::string_view>, 6> kDataTypeNames{{
    {DataType::kF32, "f32"},
    {DataType::kF64, "f64"},
    {DataType::kF16, "f16"},
    {DataType::kBF16, "bf16"},
    {DataType::kI32, "i32"},
    {DataType::kI64, "i64"},
}};

constexpr std::array<std::pair<ReduceOp, std::string_view>, 5> kReduceOpNames{{
    {ReduceOp::kSum, "sum"},
    {ReduceOp::kProd, "prod"},
    {ReduceOp::kMin, "min"},
    {ReduceOp::kMax, "max"},
    {ReduceOp::kAvg, "avg"},
}};

}  // namespace

std::string_view toString(DataType t) {
  for (const auto& [type, name] : kDataTypeNames) {
    if (type == t) return name;
  }
  throw std::invalid_argument("unknown DataType value " + std::to_string(static_cast<int>(t)));
}

std::string_view toString(ReduceOp op) {
  for (const auto& [value, name] : kReduceOpNames) {
    if (value == op) return name;
  }
  throw std::invalid_argument("unknown ReduceOp value " + std::to_string(static_cast<int>(op)));
}

std::optional<DataType> parseDataType(std::string_view name) {
  for (const auto& [type, typeName] : kDataTypeNames) {
    if (typeName == name) return type;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parseReduceOp(std::string_view name) {
  for (const auto& [value, opName] : kReduceOpNames) {
    if (opName == name) return value;
  }
  return std::nullopt;
}

}  // namespace meridian::kernels
