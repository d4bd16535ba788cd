// MERIDIAN_CHECK*: broken invariants and bad setup. They throw meridian::CheckError with
// the expression, both values and the place; never use them on a progress thread.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace meridian {

class CheckError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void throwCheckError(const char* file, int line, const std::string& what);

namespace detail {
template <typename T>
std::string checkValue(const T& v) {
  if constexpr (fmt::is_formattable<T>::value) {
    return fmt::format("{}", v);
  } else {
    return "<unprintable>";
  }
}
}  // namespace detail

}  // namespace meridian

#define MERIDIAN_CHECK(cond)                                                              \
  do {                                                                                    \
    if (!(cond)) ::meridian::throwCheckError(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define MERIDIAN_CHECK_MSG(cond, ...)                                                        \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::meridian::throwCheckError(__FILE__, __LINE__,                                        \
                                  std::string("check failed: " #cond ": ") + fmt::format(__VA_ARGS__)); \
  } while (0)

#define MERIDIAN_CHECK_OP(a, b, op)                                                          \
  do {                                                                                       \
    const auto& _mer_a = (a);                                                                \
    const auto& _mer_b = (b);                                                                \
    if (!(_mer_a op _mer_b))                                                                 \
      ::meridian::throwCheckError(                                                           \
          __FILE__, __LINE__,                                                                \
          fmt::format("check failed: {} {} {} ({} vs {})", #a, #op, #b,                      \
                      ::meridian::detail::checkValue(_mer_a),                                \
                      ::meridian::detail::checkValue(_mer_b)));                              \
  } while (0)

#define MERIDIAN_CHECK_EQ(a, b) MERIDIAN_CHECK_OP(a, b, ==)
#define MERIDIAN_CHECK_NE(a, b) MERIDIAN_CHECK_OP(a, b, !=)
#define MERIDIAN_CHECK_LT(a, b) MERIDIAN_CHECK_OP(a, b, <)
#define MERIDIAN_CHECK_LE(a, b) MERIDIAN_CHECK_OP(a, b, <=)
#define MERIDIAN_CHECK_GT(a, b) MERIDIAN_CHECK_OP(a, b, >)
#define MERIDIAN_CHECK_GE(a, b) MERIDIAN_CHECK_OP(a, b, >=)
