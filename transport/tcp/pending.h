// Limits on connections that have not authenticated yet, for every listener that runs the
// server side of the handshake (the TCP device's data listeners, the bootstrap store).
// Anyone who can reach a port can open connections and say nothing: without a bound, a few
// thousand of them exhaust the server's descriptors and memory before anyone checks a
// secret. PendingConnections bounds them per listener and per source address and gives each
// a deadline; it does no I/O (its owner closes what it says to close). Eviction policy:
// oldest first. A new connection from a source at its cap closes that source's oldest
// pending one; else, at the listener's cap, the oldest of all. A flood therefore only ever
// displaces handshakes that have waited longest (the flood's own, or a client slower than
// the flood's rate), and a legitimate client that finishes its handshake in a round trip
// gets in even while thousands of idle connections keep arriving. Single-threaded: the
// owner's loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"

namespace meridian::transport::tcp {

struct PendingLimits {
  std::size_t perListener = 256;
  std::size_t perSource = 32;
  std::chrono::milliseconds handshakeTimeout{10000};
};

class PendingConnections {
 public:
  explicit PendingConnections(PendingLimits limits) : limits_(limits) {}
  PendingConnections(const PendingConnections&) = delete;
  PendingConnections& operator=(const PendingConnections&) = delete;

  enum class Eviction : std::uint8_t { kNone, kSourceFull, kListenerFull };
  struct Admitted {
    TimePoint deadline;
    int evictedFd = -1;  // a pending connection to close now (-1: none)
    Eviction why = Eviction::kNone;
  };
  // Counts `fd` (from IPv4 address `source`, host order) as pending until remove(fd),
  // making room first as the header says.
  Admitted admit(int fd, std::uint32_t source, TimePoint now);
  // Forgets `fd` (its handshake finished, failed, or it was closed); unknown fds are fine.
  void remove(int fd);
  // Pending fds whose deadline has passed at `now`, oldest first; they are forgotten here.
  std::vector<int> expire(TimePoint now);
  // The earliest deadline (TimePoint::max() when nothing is pending).
  TimePoint nextDeadline() const;
  std::size_t size() const { return order_.size(); }
  std::size_t fromSource(std::uint32_t source) const;
  const PendingLimits& limits() const { return limits_; }

 private:
  struct Entry {
    int fd;
    std::uint32_t source;
    TimePoint deadline;
  };
  void erase(std::list<Entry>::iterator it);
  PendingLimits limits_;
  std::list<Entry> order_;  // by arrival (and so by deadline)
  std::unordered_map<int, std::list<Entry>::iterator> byFd_;
  std::unordered_map<std::uint32_t, std::size_t> perSource_;
};

// What an eviction says in a log line.
const char* toString(PendingConnections::Eviction why);

// The peer's IPv4 address of an accepted socket in host order (0 when it has none).
std::uint32_t peerIpv4(int fd);

}  // namespace meridian::transport::tcp
