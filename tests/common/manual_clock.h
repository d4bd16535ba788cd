// ManualClock: a TimeSource (core/clock.h) that moves only when the test moves it, so a
// time-driven component's test says exactly how much time passed between two events instead of
// sleeping and hoping. Any thread may read it; the test thread moves it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/clock.h"

namespace meridian::testing {

class ManualClock final : public TimeSource {
 public:
  // Starts well away from 0, as a steady clock does, so "a while ago" is never negative.
  explicit ManualClock(std::int64_t startUs = 1'000'000'000) : nowUs_(startUs) {}

  std::int64_t nowUs() const override { return nowUs_.load(std::memory_order_acquire); }
  void advance(std::chrono::microseconds by) { nowUs_.fetch_add(by.count(), std::memory_order_acq_rel); }

 private:
  std::atomic<std::int64_t> nowUs_;
};

}  // namespace meridian::testing
