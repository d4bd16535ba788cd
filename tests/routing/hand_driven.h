// For routing tests that drive a prober by hand on a ManualClock (ProberOptions::startThread
// false): read what reaches it without sleeping for a guessed time.
#pragma once

#include <chrono>
#include <cstddef>

#include "routing/prober.h"
#include "tests/common/poll.h"

namespace meridian::routing {

// Reads what reaches `p` until it has read `datagrams`; false after 5 s without them.
// Loopback hands datagrams over at once: the deadline only guards against one that never comes.
inline bool drain(Prober& p, std::size_t datagrams) {
  std::size_t read = 0;
  return meridian::testing::pollUntil(
      [&] {
        read += p.drainSockets();
        return read >= datagrams;
      },
      std::chrono::milliseconds(5000), std::chrono::milliseconds(1));
}

}  // namespace meridian::routing
