// The lab's topology: regions with nodes, planes (independent networks), and per plane
// a matrix over (source region, destination region) of one-way link parameters. Read
// from YAML (lab/topologies/*.yaml, format in docs/lab.md); every error names the file,
// the line and the reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::lab {

// One direction of a link between two regions (or inside one), in world time: the
// emulator multiplies delay and jitter by the topology's time scale.
struct LinkParams {
  double delayUs = 0;            // one-way propagation delay
  double jitterUs = 0;           // standard deviation of extra delay (packets stay in order)
  double rateBitsPerSec = 0;     // bottleneck rate; 0 = unlimited
  std::uint64_t queueBytes = 0;  // drop-tail queue in front of the rate limiter; 0 = default
  double loss = 0;               // probability that a packet is dropped, 0..1
  bool cut = false;              // drops everything while set
  bool operator==(const LinkParams&) const = default;
};

// A partial update of LinkParams (`meridian-lab set`, scenario events).
struct LinkChange {
  std::optional<double> delayUs, jitterUs, rateBitsPerSec, loss;
  std::optional<std::uint64_t> queueBytes;
  std::optional<bool> cut;
  LinkParams applyTo(LinkParams p) const;
  bool empty() const;
};

struct Region {
  std::string name;
  int nodes = 0;
};

struct Node {
  std::string name;  // "<region>-<i>", i from 1
  int region = 0;
  int indexInRegion = 0;
  int index = 0;  // position in Topology::nodes (region order, then index): the rank hint
};

struct Plane {
  std::string name;            // also the interface name inside each node (at most 12 chars)
  std::vector<LinkParams> links;  // [src region * regions + dst region]
  // `carries: fabric`: Meridian's fabric path (libfabric's tcp;ofi_rxm bound to this plane's
  // interface) crosses this plane instead of a TCP path. At most one plane, and at least one
  // plane stays TCP (the fabric's endpoint names travel over it).
  bool fabric = false;
};

struct Topology {
  std::string name;
  std::string source;  // file it was read from
  double timeScale = 1.0;
  int mtu = 9000;
  std::vector<Region> regions;
  std::vector<Node> nodes;
  std::vector<Plane> planes;

  const LinkParams& link(int plane, int srcRegion, int dstRegion) const {
    return planes[plane].links[srcRegion * regions.size() + dstRegion];
  }
  LinkParams& link(int plane, int srcRegion, int dstRegion) {
    return planes[plane].links[srcRegion * regions.size() + dstRegion];
  }
  Result<int> findRegion(const std::string& name) const;  // error lists the known regions
  Result<int> findNode(const std::string& name) const;    // error lists the known nodes
  Result<int> findPlane(const std::string& name) const;   // error lists the known planes
  // Node `node`'s IPv4 address on `plane`: 198.18.<plane>.<node + 1> (a /24 per plane).
  std::string address(int plane, int node) const;
  // The plane that carries the fabric path, or -1.
  int fabricPlane() const;
};

// Limits a topology must stay within (checked by the parser).
inline constexpr int kMaxPlanes = 16;
inline constexpr int kMaxNodes = 250;
inline constexpr std::size_t kMaxPlaneNameChars = 12;
inline constexpr int kMinMtu = 1280;
inline constexpr int kMaxMtu = 65000;
inline constexpr double kMaxLinkDelayUs = 10e6;  // 10 s, for delay and jitter alike
inline constexpr double kMaxRateBitsPerSec = 1e12;
inline constexpr std::uint64_t kMaxQueueBytes = std::uint64_t{1} << 30;
// Queue depth used when a link gives none: 50 ms at the link's rate, at least 64 KiB.
std::uint64_t defaultQueueBytes(double rateBitsPerSec);

Result<Topology> parseTopology(const std::string& yamlText, const std::string& sourceName);
Result<Topology> loadTopology(const std::string& path);

// Unit parsing shared by the topology, `meridian-lab set` and scenario files. Each
// returns invalidArgument naming what was expected ("38ms", "400Mbit", "2MiB", "0.5%").
Result<double> parseDurationUs(const std::string& text);  // ns, us, ms, s
Result<double> parseRateBitsPerSec(const std::string& text);  // bit, kbit, Mbit, Gbit (also K/M/G, bps)
Result<std::uint64_t> parseBytes(const std::string& text);  // B, KB, KiB, MB, MiB, GB, GiB or a plain number
Result<double> parseFraction(const std::string& text);  // "0.5%" or "0.005"

// "38ms", "400Mbit", "2MiB", "0.5%": the inverse of the parsers, for printing.
std::string formatDuration(double us);
std::string formatRate(double bitsPerSec);
std::string formatBytes(std::uint64_t bytes);

}  // namespace meridian::lab
