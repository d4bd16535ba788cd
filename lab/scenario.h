// Scenario files: timed link and node events for `meridian-lab scenario FILE`.
//
//   events:
//     - at: 5s
//       degrade: {plane: wan-a, between: [london, virginia], delay: 120ms, rate: 50Mbit, loss: 1%}
//     - at: 8s
//       cross-traffic: {plane: wan-a, from: london-1, to: virginia-1, rate: 150Mbit, duration: 5s}
//     - at: 10s
//       cut: {plane: wan-b, from: london, to: singapore}      # one direction
//     - at: 15s
//       restore: {plane: wan-a, between: [london, virginia]}
//     - at: 20s
//       isolate: {region: singapore}    # every plane, both ways, to every other region
//     - at: 40s
//       reconnect: {region: singapore}  # those links as the topology has them
//     - at: 45s
//       kill: {node: virginia-2}        # SIGKILL to its processes; marked down
//     - at: 50s
//       drain: {node: london-2}         # SIGTERM: meridian-train leaves at a boundary
//     - at: 60s
//       restart: {node: virginia-2}     # exec-all starts its rank again, as a joiner
//
// Times count from the start of the run. `between` changes both directions, `from`/`to`
// one; degrade takes delay, jitter, rate, queue, loss; cross-traffic takes nodes or
// regions, a rate and a duration.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "core/status.h"
#include "lab/lab.h"
#include "lab/topology.h"

namespace meridian::lab {

struct ScenarioEvent {
  enum class Kind { kDegrade, kCut, kRestore, kCrossTraffic, kIsolate, kReconnect, kKill, kDrain, kRestart };
  Kind kind = Kind::kDegrade;
  int line = 0;
  double atSec = 0;
  std::string plane, src, dst;  // isolate, reconnect: src is the region; kill, drain, restart: the node
  bool bothWays = true;
  LinkChange change;      // degrade
  double rateBitsPerSec = 0;  // cross-traffic
  double durationSec = 0;     // cross-traffic
  std::string describe() const;
};

// Parses and checks names against `topology`; errors name the file and line.
Result<std::vector<ScenarioEvent>> parseScenario(const std::string& yamlText, const std::string& sourceName,
                                                 const Topology& topology);
Result<std::vector<ScenarioEvent>> loadScenario(const std::string& path, const Topology& topology);

// Runs the events in time order (cross-traffic in the background), printing each as it
// happens; returns when the last one is over or *stop turns true.
Status runScenario(const LabState& lab, const std::vector<ScenarioEvent>& events, const std::atomic<bool>* stop);

}  // namespace meridian::lab
