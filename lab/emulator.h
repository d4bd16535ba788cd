// The WAN emulator: one thread that owns a TUN interface per (node, plane). It reads
// each IPv4 packet a node sends on a plane, finds the destination node from the address,
// passes it through the LinkModel of (plane, source region, destination region), holds it
// until its delivery time and writes it into the destination node's TUN interface.
//
// It also serves a control socket (one JSON request per connection, one JSON reply):
//   {"cmd":"status"}                                  the links, their parameters and counters
//   {"cmd":"set","plane":P,"src":R,"dst":R,"both":true,"change":{...}}   change links live
//   {"cmd":"restore","plane":P,"src":R,"dst":R,"both":true}             back to the topology
//   {"cmd":"shutdown"}
// where change keys are delay_us, jitter_us, rate_bps, queue_bytes, loss, cut.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fd.h"
#include "core/status.h"
#include "lab/link_model.h"
#include "lab/topology.h"

namespace meridian::lab {

struct EmulatorStats {
  std::uint64_t packetsIn = 0;
  std::uint64_t packetsOut = 0;
  std::uint64_t bytesIn = 0;
  std::uint64_t unroutable = 0;     // not IPv4, or to an address no node has
  std::uint64_t overflowDrops = 0;  // over the emulator's own buffer budget
  std::uint64_t writeErrors = 0;
  // How late packets left against their delivery time (the emulator's own error).
  std::uint64_t lateSumNs = 0;
  std::uint64_t lateMaxNs = 0;
  std::uint64_t lateOver100us = 0;
};

class Emulator {
 public:
  // tuns[node][plane]: non-blocking TUN fds. controlListen: a listening Unix socket (may
  // be invalid, then there is no control).
  Emulator(Topology topology, std::vector<std::vector<UniqueFd>> tuns, UniqueFd controlListen);
  ~Emulator();
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  // Sets up epoll, the timer and (when handleSignals) SIGTERM/SIGINT handling; then
  // forwards packets until shutdown (a control request, requestStop() or a signal).
  // prepare() errors mean it cannot run at all; run() calls prepare() when needed.
  Status prepare(bool handleSignals);
  Status run(bool handleSignals);
  void requestStop();

  // Applies a control request and returns the reply (also used in tests, without sockets).
  nlohmann::json handle(const nlohmann::json& request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Client side of the control socket: sends `request`, returns the reply, or an error
// naming the socket when the emulator is not there.
Result<nlohmann::json> controlRequest(const std::string& socketPath, const nlohmann::json& request,
                                      int timeoutMs = 5000);

// The maximum bytes of packets the emulator holds at once (beyond it packets drop and
// overflowDrops counts them).
inline constexpr std::uint64_t kEmulatorBufferBudgetBytes = 512ull << 20;

}  // namespace meridian::lab
