// Clocks: everything in Meridian measures time on the steady clock.
#pragma once

#include <chrono>
#include <cstdint>

namespace meridian {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

inline std::int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
}

inline TimePoint deadlineAfter(std::chrono::milliseconds ms) { return Clock::now() + ms; }

}  // namespace meridian
