// Failure detection (issue 28): which peers this rank declares lost, and why.
//
// A peer is lost when nothing has been heard from it for `timeout` (MERIDIAN_PEER_TIMEOUT_MS):
// no probe echo on any path, no link-state row, no byte on its channel. The routing thread
// sends a row to every peer each link-state interval (1 s), so that every live peer is heard
// several times per timeout even where probes are off and no collective runs; those rows are
// the heartbeats. A peer whose channel failed (a connection reset by the kernel: its process
// is gone) is lost at once. Each loss is reported once, with its reason.
//
// Pure: times come in, nothing is read or sent here.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"

namespace meridian::routing {

class FailureDetector {
 public:
  struct Lost {
    int peer = -1;
    std::string why;
  };

  // Every peer counts as heard at `start`: a peer gets a whole timeout to speak first.
  FailureDetector(int self, int worldSize, std::chrono::milliseconds timeout, TimePoint start);

  // A sign of life from `peer` at `at` (a later call with an earlier time changes nothing).
  void heard(int peer, TimePoint at);
  // `peer`'s channel failed: it is lost at the next tick, for `why`.
  void failed(int peer, std::string why);
  // `peer` left on purpose (it closed its channel with nothing outstanding): it is gone, but
  // never reported as lost.
  void left(int peer);
  bool gone(int peer) const { return peers_[static_cast<std::size_t>(peer)].gone; }
  // The peers declared lost since the previous tick, each once.
  std::vector<Lost> tick(TimePoint now);

  bool lost(int peer) const { return peers_[static_cast<std::size_t>(peer)].lost; }
  int lostCount() const;

 private:
  struct Peer {
    TimePoint lastHeard{};
    std::optional<std::string> failure;
    bool lost = false;
    bool gone = false;  // lost or left: nothing more to report
  };
  int self_;
  std::chrono::milliseconds timeout_;
  std::vector<Peer> peers_;
};

}  // namespace meridian::routing
