// The prober: every path to every peer gets a small authenticated UDP probe each interval
// (MERIDIAN_PROBE_INTERVAL_MS); the peer's prober echoes it; the echoes feed one
// PathEstimator per (peer, path). Path p pairs this rank's local address p with the peer's
// endpoint p, as the multipath channel pairs its paths, so a probe crosses the same network
// as that path's data.
//
// Cost: 64-byte probes (92 on the wire) every 100 ms per path and direction is about
// 7.4 kbit/s, well under 1% of any path Meridian stripes over.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "routing/estimators.h"

namespace meridian::routing {

struct ProberOptions {
  std::vector<std::string> localAddresses{"127.0.0.1"};  // one per path
  std::chrono::milliseconds interval{100};
  std::chrono::milliseconds echoTimeout{2000};  // a probe without echo by then counts as lost
  std::string secret;                             // the job secret
  std::uint64_t sessionId = 0;
  int selfRank = 0;
  std::string name = "probe";                    // thread name suffix and metrics label
  // Where the prober reads the time (send and echo times, timeouts, figures); null: the
  // steady clock. A test keeps another reference to the clock it moves.
  std::shared_ptr<const TimeSource> clock;
  // false: no thread; nothing is sent or read until the caller calls probeRound() and
  // drainSockets() (tests that move a hand-driven clock).
  bool startThread = true;
};

struct ProbeRow {
  int peer = 0;
  int path = 0;
  std::string localAddress;
  std::string remoteAddress;
  PathFigures figures;
};

struct ProberCounters {
  std::uint64_t sent = 0;
  std::uint64_t echoed = 0;     // requests from peers answered
  std::uint64_t echoes = 0;     // echoes of our requests received
  std::uint64_t rejected = 0;   // bad MAC, wrong session or rank, malformed
};

class Prober {
 public:
  static Result<std::unique_ptr<Prober>> create(ProberOptions options);
  ~Prober();
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // "ip:port" of each local path's probe socket: what peers need (publish it).
  std::vector<std::string> endpoints() const;
  // Starts (or replaces) probing `rank` at its endpoints. Thread-safe.
  Status setPeer(int rank, const std::vector<std::string>& endpoints);
  // The latest figures of every (peer, path). Thread-safe.
  std::vector<ProbeRow> snapshot() const;
  ProberCounters counters() const;

  // Driving by hand, only for a prober created with startThread = false (the thread does
  // both each interval otherwise). probeRound sends one round of probes to every path;
  // drainSockets answers the requests and takes the echoes already waiting on the sockets
  // and returns how many datagrams it read. Both read the time from options.clock.
  void probeRound();
  std::size_t drainSockets();

 private:
  struct Impl;
  explicit Prober(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::routing
