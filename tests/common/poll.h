// pollUntil: how a test waits for something another thread or process does. It checks the
// predicate until it holds or a deadline passes, instead of sleeping for a guessed time that is
// too short on a loaded machine and too long everywhere else. Header-only, for every test.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "core/clock.h"

namespace meridian::testing {

// How long pollUntil rests between two checks unless told otherwise: short enough that a
// test goes on at once, long enough not to steal a core from what it waits for.
inline constexpr std::chrono::milliseconds kPollEvery{2};

// Calls `done` until it returns true (then true) or `deadline` passes (then false, after one
// last check at the deadline). `done` runs on the calling thread, `every` apart; make it
// cheap or pass a longer `every` (one that starts a process, say).
template <class Predicate>
bool pollUntil(Predicate&& done, TimePoint deadline, std::chrono::milliseconds every = kPollEvery) {
  for (;;) {
    if (done()) return true;
    const TimePoint now = Clock::now();
    if (now >= deadline) return false;
    // The rest between checks orders nothing: the predicate does.
    std::this_thread::sleep_for(std::min<Clock::duration>(every, deadline - now));
  }
}

// The same with a timeout from now.
template <class Predicate>
bool pollUntil(Predicate&& done, std::chrono::milliseconds timeout, std::chrono::milliseconds every = kPollEvery) {
  return pollUntil(std::forward<Predicate>(done), Clock::now() + timeout, every);
}

}  // namespace meridian::testing
