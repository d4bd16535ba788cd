// LogRateLimiter: a fixed window of a few lines, the rest counted.
#include "core/log_limit.h"

namespace meridian {

bool LogRateLimiter::allow(TimePoint now, std::uint64_t* heldBack) {
  std::lock_guard lock(mu_);
  if (inWindow_ == 0 || now - windowStart_ >= window_) {
    windowStart_ = now;
    inWindow_ = 0;
  }
  if (inWindow_ >= linesPerWindow_) {
    ++heldBack_;
    ++suppressed_;
    return false;
  }
  ++inWindow_;
  ++printed_;
  if (heldBack != nullptr) *heldBack = heldBack_;
  heldBack_ = 0;
  return true;
}

std::uint64_t LogRateLimiter::printed() const {
  std::lock_guard lock(mu_);
  return printed_;
}

std::uint64_t LogRateLimiter::suppressed() const {
  std::lock_guard lock(mu_);
  return suppressed_;
}

}  // namespace meridian
