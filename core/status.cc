// Status rendering.
#include "core/status.h"

#include <cstring>

namespace meridian {

std::string_view toString(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kPathError: return "path error";
    case StatusCode::kPeerError: return "peer error";
    case StatusCode::kCommError: return "communicator error";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kAgain: return "again";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (isOk()) return "ok";
  return fmt::format("{}: {}", meridian::toString(code_), message_);
}

std::string errnoText(int err) {
  char buf[256];
  // GNU strerror_r: returns the text, in buf or in a static string.
  return ::strerror_r(err, buf, sizeof(buf));
}

Status Status::withContext(std::string_view context) const {
  if (isOk()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

}  // namespace meridian
