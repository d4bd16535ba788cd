// Clocks: everything in Meridian measures time on the steady clock, read directly or through
// a TimeSource that tests can replace.
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

// Where a time-driven component (the prober, the path monitor) reads the time, in microseconds
// on a steady clock. Production code takes steadyTime(), which is nowUs(); a test hands in a
// clock it moves by hand, so what it checks does not depend on how fast the machine runs.
// Implementations may be read from any thread.
class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual std::int64_t nowUs() const = 0;
};

// The steady clock as a TimeSource; lives as long as the program.
inline const TimeSource& steadyTime() {
  struct Steady final : TimeSource {
    std::int64_t nowUs() const override { return meridian::nowUs(); }
  };
  static const Steady steady;
  return steady;
}

}  // namespace meridian
