// meridian-lab: emulated regions on one machine (docs/lab.md).
//
//   meridian-lab up lab/topologies/three-regions.yaml [--time-scale 0.1]
//   meridian-lab run london-1 -- ping -c 3 198.18.0.3
//   meridian-lab exec-all -- meridian-bench --ops all_reduce
//   meridian-lab set wan-a london virginia --delay 120ms --rate 50Mbit
//   meridian-lab cut wan-a london virginia      |  restore wan-a london virginia
//   meridian-lab cross-traffic wan-a london-1 virginia-1 --rate 150Mbit --duration 10s
//   meridian-lab isolate singapore              |  reconnect singapore
//   meridian-lab kill virginia-2  |  drain virginia-2  |  restart virginia-2
//   meridian-lab scenario lab/scenarios/congestion.yaml
//   meridian-lab status
//   meridian-lab down
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lab/emulator.h"
#include "lab/lab.h"
#include "lab/netns.h"
#include "lab/scenario.h"
#include "lab/traffic.h"

namespace {

using namespace meridian;
using namespace meridian::lab;

std::atomic<bool> gStop{false};
void onSignal(int) { gStop = true; }

int fail(const Status& st) {
  std::fprintf(stderr, "meridian-lab: %s\n", st.message().c_str());
  return 1;
}

// Parses --delay/--rate/... into a LinkChange (empty strings are "not given").
Result<LinkChange> changeFrom(const std::string& delay, const std::string& jitter, const std::string& rate,
                              const std::string& loss, const std::string& queue) {
  LinkChange c;
  if (!delay.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(double v, parseDurationUs(delay));
    c.delayUs = v;
  }
  if (!jitter.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(double v, parseDurationUs(jitter));
    c.jitterUs = v;
  }
  if (!rate.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(double v, parseRateBitsPerSec(rate));
    c.rateBitsPerSec = v;
  }
  if (!loss.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(double v, parseFraction(loss));
    c.loss = v;
  }
  if (!queue.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(std::uint64_t v, parseBytes(queue));
    c.queueBytes = v;
  }
  return c;
}

void printLinks(const nlohmann::json& reply) {
  for (const auto& l : reply["links"]) {
    std::printf("%s %s -> %s: delay %s, jitter %s, rate %s, queue %s, loss %g%%%s\n",
                l.value("plane", "").c_str(), l.value("src", "").c_str(), l.value("dst", "").c_str(),
                formatDuration(l.value("delay_us", 0.0)).c_str(), formatDuration(l.value("jitter_us", 0.0)).c_str(),
                l.value("rate_bps", 0.0) > 0 ? formatRate(l.value("rate_bps", 0.0)).c_str() : "unlimited",
                formatBytes(l.value("queue_bytes", 0ull)).c_str(), 100 * l.value("loss", 0.0),
                l.value("cut", false) ? ", CUT" : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meridian-lab: regions, planes and WAN links emulated on one machine (needs root and /dev/net/tun)"};
  app.require_subcommand(1);
  std::string labName = std::getenv("MERIDIAN_LAB_NAME") != nullptr ? std::getenv("MERIDIAN_LAB_NAME") : kDefaultLabName;
  app.add_option("--lab", labName, "Lab name (several labs can be up at once; env MERIDIAN_LAB_NAME)");

  std::string topologyFile;
  double timeScale = 0;
  bool foreground = false;
  auto* up = app.add_subcommand("up", "Build the lab from a topology file and start the emulator");
  up->add_option("topology", topologyFile, "Topology file (YAML)")->required();
  up->add_option("--time-scale", timeScale, "Multiply every delay and jitter by this (e.g. 0.1)");
  up->add_flag("--foreground", foreground, "Run the emulator in this process until Ctrl-C, then tear down");

  auto* down = app.add_subcommand("down", "Remove the lab: emulator, namespaces, processes in them, state");

  std::string node;
  std::vector<std::string> command;
  auto* run = app.add_subcommand("run", "Run a command inside a node (with MERIDIAN_REGION etc. set)");
  run->add_option("node", node, "Node name, e.g. london-1")->required();
  run->add_option("command", command, "Command after --")->required();

  auto* execAllCmd = app.add_subcommand("exec-all", "Run a command on every node as one job; worst exit code");
  execAllCmd->add_option("command", command, "Command after --")->required();

  std::string plane, src, dst, delay, jitter, rate, loss, queue, duration;
  bool oneWay = false;
  auto addLink = [&](CLI::App* c) {
    c->add_option("plane", plane, "Plane")->required();
    c->add_option("src", src, "Source region")->required();
    c->add_option("dst", dst, "Destination region")->required();
    c->add_flag("--one-way", oneWay, "Only src -> dst (default: both directions)");
  };
  auto* set = app.add_subcommand("set", "Change a link live");
  addLink(set);
  set->add_option("--delay", delay, "One-way delay, e.g. 80ms");
  set->add_option("--jitter", jitter, "Jitter (standard deviation), e.g. 2ms");
  set->add_option("--rate", rate, "Rate, e.g. 100Mbit");
  set->add_option("--loss", loss, "Loss, e.g. 1%");
  set->add_option("--queue", queue, "Queue depth, e.g. 1MiB");
  auto* cut = app.add_subcommand("cut", "Make a link drop everything (until restore)");
  addLink(cut);
  auto* restore = app.add_subcommand("restore", "Put a link back as the topology file has it");
  addLink(restore);

  auto* cross = app.add_subcommand("cross-traffic", "Send a real competing UDP flow between two nodes");
  cross->add_option("plane", plane, "Plane")->required();
  cross->add_option("src", src, "Source node (or region: its first node)")->required();
  cross->add_option("dst", dst, "Destination node (or region)")->required();
  cross->add_option("--rate", rate, "Sending rate, e.g. 150Mbit")->required();
  cross->add_option("--duration", duration, "How long (default: until Ctrl-C)");

  std::string region;
  auto* isolate = app.add_subcommand("isolate", "Cut a region off: every plane, both ways, to every other region");
  isolate->add_option("region", region, "Region, e.g. singapore")->required();
  auto* reconnect = app.add_subcommand("reconnect", "Put a region's links back as the topology file has them");
  reconnect->add_option("region", region, "Region")->required();

  auto* kill = app.add_subcommand("kill", "SIGKILL every process in a node; the node is down until restart");
  kill->add_option("node", node, "Node name, e.g. virginia-2")->required();
  auto* drain = app.add_subcommand("drain", "SIGTERM every process in a node (meridian-train leaves at a boundary)");
  drain->add_option("node", node, "Node name")->required();
  auto* restart = app.add_subcommand("restart", "Start a node's rank under exec-all again, as a joiner of the job");
  restart->add_option("node", node, "Node name")->required();

  std::string scenarioFile;
  auto* scenario = app.add_subcommand("scenario", "Run timed link events from a file");
  scenario->add_option("file", scenarioFile, "Scenario file (YAML)")->required();

  bool json = false;
  auto* status = app.add_subcommand("status", "Print the link matrix per plane, the counters and the nodes");
  status->add_flag("--json", json, "The emulator's raw status as JSON");

  CLI11_PARSE(app, argc, argv);
  if (Status st = validateLabName(labName); !st.isOk()) return fail(st);

  if (*up) {
    UpOptions o;
    o.name = labName;
    if (timeScale != 0) o.timeScale = timeScale;
    o.foreground = foreground;  // SIGINT/SIGTERM then reach the emulator through its signalfd
    Status st = labUp(topologyFile, o);
    return st.isOk() ? 0 : fail(st);
  }
  if (*down) {
    Status st = labDown(labName);
    if (!st.isOk()) return fail(st);
    std::printf("lab '%s' is down\n", labName.c_str());
    return 0;
  }
  if (Status st = requireRoot(); !st.isOk()) return fail(st);
  auto lab = loadLab(labName);
  if (!lab.isOk()) return fail(lab.status());

  if (*run) {
    return fail(execInNode(lab.value(), node, command));
  }
  if (*execAllCmd) {
    const Result<int> worst = execAll(lab.value(), command);
    return worst.isOk() ? worst.value() : fail(worst.status());
  }
  if (*set || *cut) {
    Result<LinkChange> change = LinkChange{};
    if (*set) {
      change = changeFrom(delay, jitter, rate, loss, queue);
      if (!change.isOk()) return fail(change.status());
    } else {
      change.value().cut = true;
    }
    auto r = setLink(lab.value(), plane, src, dst, change.value(), !oneWay);
    if (!r.isOk()) return fail(r.status());
    printLinks(r.value());
    return 0;
  }
  if (*restore) {
    auto r = restoreLink(lab.value(), plane, src, dst, !oneWay);
    if (!r.isOk()) return fail(r.status());
    printLinks(r.value());
    return 0;
  }
  if (*isolate || *reconnect) {
    if (Status st = isolateRegion(lab.value(), region, isolate->parsed()); !st.isOk()) return fail(st);
    std::printf("%s %s: every plane, both ways, to every other region\n", isolate->parsed() ? "isolated" : "reconnected",
                region.c_str());
    return 0;
  }
  if (*kill || *drain || *restart) {
    auto done = nodeAction(lab.value(), node, *kill ? NodeAction::kKill : *drain ? NodeAction::kDrain : NodeAction::kRestart);
    if (!done.isOk()) return fail(done.status());
    std::printf("%s\n", done->c_str());
    return 0;
  }
  if (::signal(SIGINT, onSignal) == SIG_ERR || ::signal(SIGTERM, onSignal) == SIG_ERR) {
    return fail(internalError("cannot handle SIGINT/SIGTERM: {}", errnoText(errno)));
  }
  if (*cross) {
    CrossTrafficOptions o;
    o.plane = plane;
    o.src = src;
    o.dst = dst;
    auto r = parseRateBitsPerSec(rate);
    if (!r.isOk()) return fail(r.status());
    o.rateBitsPerSec = r.value();
    if (!duration.empty()) {
      auto d = parseDurationUs(duration);
      if (!d.isOk()) return fail(d.status());
      o.durationSec = d.value() * 1e-6;
    }
    auto res = runCrossTraffic(lab.value(), o, &gStop);
    return res.isOk() ? 0 : fail(res.status());
  }
  if (*scenario) {
    auto events = loadScenario(scenarioFile, lab->topology);
    if (!events.isOk()) return fail(events.status());
    Status st = runScenario(lab.value(), events.value(), &gStop);
    return st.isOk() ? 0 : fail(st);
  }
  if (*status && json) {
    auto j = controlRequest(lab->controlSocket(), {{"cmd", "status"}});
    if (!j.isOk()) return fail(j.status());
    std::printf("%s\n", j.value().dump(2).c_str());
    return 0;
  }
  if (*status) {
    auto text = statusText(lab.value());
    if (!text.isOk()) return fail(text.status());
    std::fputs(text.value().c_str(), stdout);
    return 0;
  }
  return 0;
}
