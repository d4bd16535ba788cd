// PathMonitor: the routing layer's view of every path to every peer. It owns the prober,
// runs a congestion detector per (peer, path) on each probe round, and turns the states
// into multipath weights: a congested path keeps a small weight (it still carries chunks,
// so its recovery is seen in delivered rates too), the others share the traffic. The
// weights go to the caller through `apply` (the communicator hands them to its channels);
// with adaptive off they stay neutral and only the figures are kept.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "routing/congestion.h"
#include "routing/prober.h"

namespace meridian::routing {

// Weight of a congested path next to clear ones (1.0): small, not zero.
inline constexpr double kCongestedPathWeight = 0.1;
// Weight of a path whose probes all go unanswered (down): it carries nothing while another
// path is up. Without it a peer that had sent nothing since a plane was cut would learn of
// the cut only by losing a chunk to it and waiting out the stall limit.
inline constexpr double kDownPathWeight = 0.0;
// A path is down after this many probes in a row went unanswered (each waits out the echo
// timeout), and up again after this many echoes in a row.
inline constexpr std::uint64_t kDownAfterLostProbes = 3;
inline constexpr std::uint64_t kUpAfterEchoes = 3;

struct PathView {
  int peer = 0;
  int path = 0;
  PathFigures figures;
  CongestionState state = CongestionState::kClear;
  std::string reason;
  double weight = 1.0;
  bool down = false;  // no echo for kDownAfterLostProbes probes in a row
  // The channel's delivery rate as last judged (a round in which the path was busy; see
  // busyDeliveryRate); 0 until one was.
  double judgedBytesPerSec = 0;
};

struct PathEvent {
  std::int64_t atUs = 0;
  int peer = 0;
  int path = 0;
  CongestionState state = CongestionState::kClear;
  std::string reason;
};

// Weights for one peer's paths from their states: congested ones get
// kCongestedPathWeight, clear ones 1. With every path congested all get kCongestedPathWeight:
// equal weights, so nothing moves (there is nowhere better), and a path that stays congested
// while another one comes and goes is never "raised" (see MultipathChannel::setPathWeights).
// Paths marked in `down` (may be shorter than `states`) get kDownPathWeight while any path is
// up, and count as neither clear nor congested; with every path down all are congested.
// `unjudgedUp`: the channel also has live paths that probes do not reach (fabric and
// shared-memory paths, which keep their own weight): they count as up, and while no judged
// path is clear the judged ones keep 1, so the channel's measured rates, not a verdict the
// other paths cannot be held to, share the data between the kinds.
std::vector<double> weightsFor(const std::vector<CongestionState>& states, const std::vector<bool>& down = {},
                               bool unjudgedUp = false);

class PathMonitor {
 public:
  using ApplyWeights = std::function<void(int peer, const std::vector<double>& weights)>;
  // The data channel's figures for a peer's paths (index i = probe path i); empty when there
  // is no channel. Their delivery rates feed the detectors' rate-collapse trigger, on rounds
  // in which the path was busy (busyDeliveryRate).
  using ReadPaths = std::function<std::vector<transport::PathStats>(int peer)>;

  // `apply` is called from the monitor's thread whenever a peer's weights change; `readPaths`
  // (may be empty: then no rate is judged) from the same thread once per round and peer.
  // The monitor reads the time from probe.clock, and with probe.startThread false it starts
  // no thread either: the caller drives prober() and tick() (tests).
  static Result<std::unique_ptr<PathMonitor>> create(ProberOptions probe, bool adaptive, ApplyWeights apply,
                                                     ReadPaths readPaths = {}, CongestionConfig congestion = {});
  ~PathMonitor();
  PathMonitor(const PathMonitor&) = delete;
  PathMonitor& operator=(const PathMonitor&) = delete;

  std::vector<std::string> endpoints() const;
  Status setPeer(int rank, const std::vector<std::string>& endpoints);
  std::vector<PathView> paths() const;
  // Congestion state changes so far (the last 1000).
  std::vector<PathEvent> events() const;
  bool adaptive() const;

  // One round, as the monitor's thread runs it each probe interval: judge every path on the
  // prober's figures now and hand out the weights that changed. Call it by hand only when
  // probe.startThread was false, as the prober's probeRound() and drainSockets().
  void tick();
  Prober& prober();

 private:
  struct Impl;
  explicit PathMonitor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::routing
