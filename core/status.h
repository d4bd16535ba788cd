// Status and Result<T>: how the data path reports errors. Codes are grouped by what
// the caller must do about them, not by where they came from.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace meridian {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kPathError,        // one path to a peer failed: reroute over the others
  kPeerError,        // the peer is unreachable or misbehaved: reconnect or give up on it
  kCommError,        // the communicator is broken: abort it
  kInvalidArgument,  // the caller passed something wrong: fix the call
  kTimeout,          // a deadline passed: retry later or abort
  kAgain,            // not now (back-pressure): call again
  kInternal,         // a broken invariant inside Meridian: a bug, report it
};

std::string_view toString(StatusCode code);
inline std::ostream& operator<<(std::ostream& os, StatusCode code) { return os << toString(code); }

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string toString() const;

  // Returns a copy with `context: ` prepended to the message.
  Status withContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define MERIDIAN_STATUS_HELPER(fn, code)                                    \
  template <typename... Args>                                               \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {                \
    return Status(code, fmt::format(f, std::forward<Args>(args)...));       \
  }
MERIDIAN_STATUS_HELPER(pathError, StatusCode::kPathError)
MERIDIAN_STATUS_HELPER(peerError, StatusCode::kPeerError)
MERIDIAN_STATUS_HELPER(commError, StatusCode::kCommError)
MERIDIAN_STATUS_HELPER(invalidArgument, StatusCode::kInvalidArgument)
MERIDIAN_STATUS_HELPER(timeoutError, StatusCode::kTimeout)
MERIDIAN_STATUS_HELPER(againStatus, StatusCode::kAgain)
MERIDIAN_STATUS_HELPER(internalError, StatusCode::kInternal)
#undef MERIDIAN_STATUS_HELPER

// The text of an errno value ("Connection refused"), for the message of a failed system
// call: internalError("pipe: {}", errnoText(errno)). Thread-safe, unlike strerror.
std::string errnoText(int err);

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).isOk()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an ok Status without a value");
    }
  }

  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const {
    static const Status kOkStatus;
    return isOk() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace meridian

// Propagate a non-ok Status to the caller.
#define MERIDIAN_RETURN_IF_ERROR(expr)              \
  do {                                              \
    ::meridian::Status _mer_st = (expr);            \
    if (!_mer_st.isOk()) return _mer_st;            \
  } while (0)

#define MERIDIAN_CONCAT_INNER(a, b) a##b
#define MERIDIAN_CONCAT(a, b) MERIDIAN_CONCAT_INNER(a, b)
#define MERIDIAN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.isOk()) return tmp.status();                \
  lhs = std::move(tmp).value()
#define MERIDIAN_ASSIGN_OR_RETURN(lhs, expr) \
  MERIDIAN_ASSIGN_OR_RETURN_IMPL(MERIDIAN_CONCAT(_mer_res_, __LINE__), lhs, expr)
