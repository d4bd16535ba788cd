// One direction of one emulated link: a drop-tail queue in front of a rate limiter, then
// a propagation delay with optional jitter and random loss. Pure (time is passed in), so
// it is unit-tested without TUN devices; the emulator owns one per (plane, src region,
// dst region).
//
// The rate limiter is a token bucket one packet deep: the link transmits one packet at a
// time at rateBitsPerSec, so a packet that arrives while others wait is queued behind
// them, and the bytes still waiting (the backlog) are the queue. A packet that would push
// the backlog over queueBytes is dropped (drop-tail), as a router's full buffer does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>

#include "lab/topology.h"

namespace meridian::lab {

struct LinkCounters {
  std::uint64_t packets = 0;      // accepted and delivered (or in flight)
  std::uint64_t bytes = 0;
  std::uint64_t queueDrops = 0;   // queue full
  std::uint64_t lossDrops = 0;    // random loss or cut
  std::uint64_t maxBacklogBytes = 0;
};

class LinkModel {
 public:
  // `effective` already has the time scale applied (see scaled()).
  LinkModel(const LinkParams& effective, std::uint64_t seed);

  // Changes the link live at `nowNs`: packets already accepted keep their times, and the
  // bytes still queued drain at the new rate from now on.
  void configure(const LinkParams& effective, std::int64_t nowNs);
  const LinkParams& params() const { return p_; }

  // A packet of `bytes` arrives at `nowNs`: the time it reaches the other end, or nullopt
  // when it is dropped. Delivery times never decrease (no reordering), jitter included.
  std::optional<std::int64_t> admit(std::int64_t nowNs, std::size_t bytes);

  // Bytes waiting for the rate limiter at `nowNs`.
  std::uint64_t backlogBytes(std::int64_t nowNs) const;
  const LinkCounters& counters() const { return c_; }

 private:
  LinkParams p_;
  std::int64_t busyUntilNs_ = 0;     // when the limiter finishes the last accepted packet
  std::int64_t lastDeliveryNs_ = 0;  // keeps packets in order
  LinkCounters c_;
  std::mt19937_64 rng_;
};

// The parameters the emulator applies: delay and jitter multiplied by the time scale.
LinkParams scaled(const LinkParams& world, double timeScale);

}  // namespace meridian::lab
