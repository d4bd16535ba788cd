// Rate-limited logging: for lines an outsider can provoke at will (refused connections), so
// that a flood of them costs a few lines a second, not a line per attempt. Each reason gets
// its own LogRateLimiter; a line that gets through says how many were held back before it.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

#include "core/clock.h"
#include "core/log.h"

namespace meridian {

// At most `linesPerWindow` lines per `window` (a fixed window that starts at the first line
// after the previous one ended); the others are counted, not printed. Any thread may call it.
// Time is an argument so that tests can drive it.
class LogRateLimiter {
 public:
  explicit LogRateLimiter(std::uint32_t linesPerWindow = 3, std::chrono::milliseconds window = std::chrono::seconds(1))
      : linesPerWindow_(linesPerWindow), window_(window) {}

  // True when a line may be printed now; *heldBack then gets the lines suppressed since the
  // last one printed (to say so on this one).
  bool allow(TimePoint now, std::uint64_t* heldBack);
  // Lines printed and suppressed so far (tests and diagnostics).
  std::uint64_t printed() const;
  std::uint64_t suppressed() const;

 private:
  const std::uint32_t linesPerWindow_;
  const std::chrono::milliseconds window_;
  mutable std::mutex mu_;
  TimePoint windowStart_{};
  std::uint32_t inWindow_ = 0;
  std::uint64_t heldBack_ = 0;  // since the last printed line
  std::uint64_t printed_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace meridian

// MLOG_LIMITED(limiter, kTransport, warn, "refused {}: {}", peer, why): logs through
// `limiter` at spdlog level `lvl`; a line after suppressed ones ends with "(N similar lines
// suppressed)". Counted by the limiter even when the level is filtered out.
#define MLOG_LIMITED(limiter, subsys, lvl, ...)                                                          \
  do {                                                                                                   \
    std::uint64_t mlogHeldBack_ = 0;                                                                     \
    if ((limiter).allow(::meridian::Clock::now(), &mlogHeldBack_) &&                                     \
        ::meridian::log::enabled(::meridian::Subsys::subsys, spdlog::level::lvl)) {                      \
      ::meridian::log::logger().log(spdlog::level::lvl, "[{}] {}{}", ::meridian::toString(::meridian::Subsys::subsys), \
                                    fmt::format(__VA_ARGS__),                                            \
                                    mlogHeldBack_ == 0 ? std::string()                                   \
                                                       : fmt::format(" ({} similar lines suppressed)", mlogHeldBack_)); \
    }                                                                                                    \
  } while (0)
