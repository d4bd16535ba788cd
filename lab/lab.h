// A running lab: its namespaces, its emulator daemon and its state directory
// (/run/meridian-lab/<name>/: state.json, topology.yaml, control.sock, emulator.log).
// The state is written before anything is created, so `down` can remove a lab whose
// `up` crashed half-way. Everything the lab creates is named "<lab>-<node>".
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "lab/topology.h"

namespace meridian::lab {

inline constexpr const char* kDefaultLabName = "mlab";
inline constexpr const char* kStateRoot = "/run/meridian-lab";

struct LabState {
  std::string name;
  std::string dir;
  Topology topology;  // as the lab runs it (time scale applied by the emulator)
  int emulatorPid = 0;
  std::vector<std::string> namespaces;
  // The management network: a bridge in the host's namespace with one veth into every node
  // (198.19.<mgmtIndex>.0/24, host 198.19.<mgmtIndex>.1). It never carries Meridian's data,
  // only what an operator's tools reach the nodes with: Prometheus scraping every rank's
  // metrics. 0: none (a lab brought up before it existed).
  int mgmtIndex = 0;
  std::string controlSocket() const { return dir + "/control.sock"; }
  // The lab's job secret (0600), handed to every node's ranks as MERIDIAN_SECRET_FILE.
  std::string secretFile() const { return dir + "/secret"; }
  std::string mgmtBridge() const { return "mrdmgmt" + std::to_string(mgmtIndex); }
  std::string mgmtAddress(int node) const { return "198.19." + std::to_string(mgmtIndex) + "." + std::to_string(node + 2); }
  // Where node `node`'s ranks serve metrics (MERIDIAN_METRICS_ADDR in the node).
  std::string metricsAddress(int node) const;
  std::string namespaceOf(int node) const { return name + "-" + topology.nodes[static_cast<std::size_t>(node)].name; }
};

Status validateLabName(const std::string& name);

struct UpOptions {
  std::string name = kDefaultLabName;
  std::optional<double> timeScale;  // overrides the file's
  bool foreground = false;          // run the emulator in this process (until SIGINT/SIGTERM)
};

// Builds the lab: namespaces, TUN interfaces, the emulator daemon. On failure nothing is
// left behind. Prints a summary to stdout.
Status labUp(const std::string& topologyFile, const UpOptions& options);

// Removes the lab (also one left by a crash): stops the emulator and the processes still
// running in its namespaces, deletes the namespaces and the state directory.
Status labDown(const std::string& name);

// The state of a lab that is up (error: "no lab named X is up").
Result<LabState> loadLab(const std::string& name);

// What a process started in `node` finds in its environment: MERIDIAN_REGION,
// MERIDIAN_LAB, MERIDIAN_LAB_NODE, MERIDIAN_LAB_RANK / MERIDIAN_LAB_NODES (a rank hint),
// MERIDIAN_LAB_ADDR_<PLANE> per plane, and MERIDIAN_PATHS (all of the node's addresses)
// unless it is set already.
std::vector<std::pair<std::string, std::string>> nodeEnvironment(const LabState& lab, int node);

// `run NODE -- CMD...`: replaces this process with CMD inside the node (returns only on
// error).
Status execInNode(const LabState& lab, const std::string& node, const std::vector<std::string>& argv);

// `exec-all -- CMD...`: one process per node (as ranks of one job: MERIDIAN_RANK,
// MERIDIAN_WORLD_SIZE, MERIDIAN_STORE on the first node's first-plane address), output
// lines prefixed with the node name; returns the worst exit code, or why the job could
// not start.
Result<int> execAll(const LabState& lab, const std::vector<std::string>& argv);

// `set` and `restore`: changes links live through the emulator.
Result<nlohmann::json> setLink(const LabState& lab, const std::string& plane, const std::string& src,
                               const std::string& dst, const LinkChange& change, bool bothWays);
Result<nlohmann::json> restoreLink(const LabState& lab, const std::string& plane, const std::string& src,
                                   const std::string& dst, bool bothWays);

// `isolate REGION` / `reconnect REGION`: every plane, both ways, between `region` and every
// other region cut, or put back as the topology has it.
Status isolateRegion(const LabState& lab, const std::string& region, bool isolate);

// Nodes taken down on purpose, to test what survives it (docs/lab.md, docs/elastic.md):
// - kill: SIGKILL to every process in the node's namespace (a crash, a reclaimed instance);
// - drain: SIGTERM to them (meridian-train leaves at its next membership boundary);
// - restart: the node's rank under `exec-all` starts again as a joiner (MERIDIAN_JOIN=on)
//   once its processes have exited (at once when they have).
// kill and drain mark the node down in the state directory; `exec-all` reads the marks, so
// the exit of a rank taken down is no failure. Returns what was done, for printing.
enum class NodeAction { kKill, kDrain, kRestart };
Result<std::string> nodeAction(const LabState& lab, const std::string& node, NodeAction action);
// For exec-all's launcher: whether `node` is marked down, and whether it was released by
// restart (true once: the marks are removed as it says so).
bool nodeTakenDown(const LabState& lab, int node);
bool nodeReleased(const LabState& lab, int node);

// `status`: the matrix per plane, the nodes, and the counters, as text.
Result<std::string> statusText(const LabState& lab);

}  // namespace meridian::lab
