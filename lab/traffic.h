// Cross-traffic: a real competing flow between two lab nodes. A paced UDP sender in the
// source node and a sink in the destination node, both through the emulator, so the flow
// takes its share of the link's rate and queue like any other traffic.
#pragma once

#include <atomic>
#include <string>

#include "core/status.h"
#include "lab/lab.h"

namespace meridian::lab {

struct CrossTrafficOptions {
  std::string plane;
  std::string src;  // a node, or a region (its first node)
  std::string dst;
  double rateBitsPerSec = 0;
  double durationSec = 0;       // 0: until *stop
  std::size_t datagramBytes = 0;  // 0: fills the plane's MTU
  bool quiet = false;           // no summary line
};

struct CrossTrafficResult {
  double seconds = 0;
  std::uint64_t sentBytes = 0;
  std::uint64_t receivedBytes = 0;
};

// Runs the flow on this thread until the duration ends or *stop turns true.
Result<CrossTrafficResult> runCrossTraffic(const LabState& lab, const CrossTrafficOptions& options,
                                           const std::atomic<bool>* stop);

// A node by name, or a region's first node.
Result<int> nodeOrRegion(const Topology& t, const std::string& name);

}  // namespace meridian::lab
