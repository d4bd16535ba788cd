#include "lab/scenario.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <iterator>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "lab/traffic.h"

namespace meridian::lab {

namespace {

struct Where {
  const std::string& source;
  Status error(const YAML::Node& n, const std::string& why) const {
    return invalidArgument("{}:{}: {}", source, n.Mark().line + 1, why);
  }
};

Result<std::string> scalar(const Where& w, const YAML::Node& map, const char* key) {
  YAML::Node v = map[key];
  if (!v || !v.IsScalar()) return w.error(map, fmt::format("needs '{}'", key));
  return v.as<std::string>();
}

// Every action a scenario knows, by the key that names it in the file.
constexpr std::pair<const char*, ScenarioEvent::Kind> kActions[] = {
    {"degrade", ScenarioEvent::Kind::kDegrade}, {"cut", ScenarioEvent::Kind::kCut},
    {"restore", ScenarioEvent::Kind::kRestore}, {"cross-traffic", ScenarioEvent::Kind::kCrossTraffic},
    {"isolate", ScenarioEvent::Kind::kIsolate}, {"reconnect", ScenarioEvent::Kind::kReconnect},
    {"kill", ScenarioEvent::Kind::kKill},       {"drain", ScenarioEvent::Kind::kDrain},
    {"restart", ScenarioEvent::Kind::kRestart},
};

const char* kindName(ScenarioEvent::Kind k) {
  for (const auto& [name, kind] : kActions) {
    if (kind == k) return name;
  }
  return "?";
}

Result<ScenarioEvent> parseEvent(const Where& w, const YAML::Node& item, const Topology& t) {
  if (!item.IsMap()) return w.error(item, "an event is a map with 'at' and one action");
  ScenarioEvent e;
  e.line = item.Mark().line + 1;
  MERIDIAN_ASSIGN_OR_RETURN(std::string at, scalar(w, item, "at"));
  auto atUs = parseDurationUs(at);
  if (!atUs.isOk()) return w.error(item["at"], atUs.status().message());
  e.atSec = atUs.value() * 1e-6;
  YAML::Node body;
  int actions = 0;
  for (const auto& kv : item) {
    const std::string key = kv.first.as<std::string>();
    if (key == "at") continue;
    ++actions;
    body = kv.second;
    const auto* action = std::find_if(std::begin(kActions), std::end(kActions),
                                      [&](const auto& a) { return key == a.first; });
    if (action == std::end(kActions)) {
      std::string known;
      for (const auto& [name, kind] : kActions) known += (known.empty() ? "" : ", ") + std::string(name);
      return w.error(kv.first, fmt::format("unknown action '{}' (expected {})", key, known));
    }
    e.kind = action->second;
  }
  if (actions != 1) return w.error(item, "an event needs exactly one action besides 'at'");
  if (!body.IsMap()) return w.error(body, fmt::format("{} takes a map", kindName(e.kind)));
  const bool regionEvent = e.kind == ScenarioEvent::Kind::kIsolate || e.kind == ScenarioEvent::Kind::kReconnect;
  const bool nodeEvent = e.kind == ScenarioEvent::Kind::kKill || e.kind == ScenarioEvent::Kind::kDrain ||
                         e.kind == ScenarioEvent::Kind::kRestart;
  if (regionEvent || nodeEvent) {
    const char* only = regionEvent ? "region" : "node";
    for (const auto& kv : body) {
      if (kv.first.as<std::string>() != only) {
        return w.error(kv.first,
                       fmt::format("{} takes only {}, not '{}'", kindName(e.kind), only, kv.first.as<std::string>()));
      }
    }
    MERIDIAN_ASSIGN_OR_RETURN(e.src, scalar(w, body, only));
    if (nodeEvent) {
      if (auto n = t.findNode(e.src); !n.isOk()) return w.error(body, n.status().message());
      return e;
    }
    if (auto r = t.findRegion(e.src); !r.isOk()) return w.error(body, r.status().message());
    if (t.regions.size() < 2) return w.error(body, "a topology of one region has nothing to isolate it from");
    return e;
  }
  MERIDIAN_ASSIGN_OR_RETURN(e.plane, scalar(w, body, "plane"));
  if (auto p = t.findPlane(e.plane); !p.isOk()) return w.error(body, p.status().message());

  if (e.kind == ScenarioEvent::Kind::kCrossTraffic) {
    MERIDIAN_ASSIGN_OR_RETURN(e.src, scalar(w, body, "from"));
    MERIDIAN_ASSIGN_OR_RETURN(e.dst, scalar(w, body, "to"));
    for (const auto& name : {e.src, e.dst}) {
      if (auto n = nodeOrRegion(t, name); !n.isOk()) return w.error(body, n.status().message());
    }
    MERIDIAN_ASSIGN_OR_RETURN(std::string rate, scalar(w, body, "rate"));
    auto r = parseRateBitsPerSec(rate);
    if (!r.isOk() || !(r.value() > 0)) return w.error(body["rate"], "rate must be a positive rate such as 150Mbit");
    e.rateBitsPerSec = r.value();
    MERIDIAN_ASSIGN_OR_RETURN(std::string duration, scalar(w, body, "duration"));
    auto d = parseDurationUs(duration);
    if (!d.isOk() || !(d.value() > 0)) return w.error(body["duration"], "duration must be positive, such as 5s");
    e.durationSec = d.value() * 1e-6;
    for (const auto& kv : body) {
      const std::string key = kv.first.as<std::string>();
      if (key != "plane" && key != "from" && key != "to" && key != "rate" && key != "duration") {
        return w.error(kv.first, fmt::format("unknown key '{}' (expected plane, from, to, rate, duration)", key));
      }
    }
    return e;
  }

  if (body["between"]) {
    YAML::Node b = body["between"];
    if (!b.IsSequence() || b.size() != 2) return w.error(b, "between takes two regions: [a, b]");
    e.src = b[0].as<std::string>();
    e.dst = b[1].as<std::string>();
    e.bothWays = true;
    if (body["from"] || body["to"]) return w.error(body, "use either between or from/to");
  } else {
    MERIDIAN_ASSIGN_OR_RETURN(e.src, scalar(w, body, "from"));
    MERIDIAN_ASSIGN_OR_RETURN(e.dst, scalar(w, body, "to"));
    e.bothWays = false;
  }
  for (const auto& name : {e.src, e.dst}) {
    if (auto r = t.findRegion(name); !r.isOk()) return w.error(body, r.status().message());
  }
  for (const auto& kv : body) {
    const std::string key = kv.first.as<std::string>();
    if (key == "plane" || key == "between" || key == "from" || key == "to") continue;
    if (e.kind != ScenarioEvent::Kind::kDegrade) {
      return w.error(kv.first, fmt::format("{} takes only plane and between or from/to, not '{}'", kindName(e.kind), key));
    }
    const std::string v = kv.second.as<std::string>();
    Status bad = w.error(kv.second, fmt::format("bad {} '{}'", key, v));
    if (key == "delay" || key == "jitter") {
      auto us = parseDurationUs(v);
      if (!us.isOk()) return w.error(kv.second, us.status().message());
      (key == "delay" ? e.change.delayUs : e.change.jitterUs) = us.value();
    } else if (key == "rate") {
      auto r = parseRateBitsPerSec(v);
      if (!r.isOk()) return w.error(kv.second, r.status().message());
      e.change.rateBitsPerSec = r.value();
    } else if (key == "queue") {
      auto q = parseBytes(v);
      if (!q.isOk()) return w.error(kv.second, q.status().message());
      e.change.queueBytes = q.value();
    } else if (key == "loss") {
      auto l = parseFraction(v);
      if (!l.isOk()) return w.error(kv.second, l.status().message());
      e.change.loss = l.value();
    } else {
      return w.error(kv.first, fmt::format("unknown key '{}' (expected delay, jitter, rate, queue, loss)", key));
    }
  }
  if (e.kind == ScenarioEvent::Kind::kDegrade && e.change.empty()) {
    return w.error(body, "degrade needs at least one of delay, jitter, rate, queue, loss");
  }
  if (e.kind == ScenarioEvent::Kind::kCut) e.change.cut = true;
  return e;
}

}  // namespace

std::string ScenarioEvent::describe() const {
  std::string what = fmt::format("{} {} {} {} {}", kindName(kind), plane, src, bothWays ? "<->" : "->", dst);
  if (kind == Kind::kDegrade) {
    if (change.delayUs) what += " delay " + formatDuration(*change.delayUs);
    if (change.jitterUs) what += " jitter " + formatDuration(*change.jitterUs);
    if (change.rateBitsPerSec) what += " rate " + formatRate(*change.rateBitsPerSec);
    if (change.queueBytes) what += " queue " + formatBytes(*change.queueBytes);
    if (change.loss) what += fmt::format(" loss {:g}%", *change.loss * 100);
  } else if (kind == Kind::kIsolate || kind == Kind::kReconnect) {
    what = fmt::format("{} {} (every plane, both ways, to every other region)", kindName(kind), src);
  } else if (kind == Kind::kKill || kind == Kind::kDrain || kind == Kind::kRestart) {
    what = fmt::format("{} {}", kindName(kind), src);
  } else if (kind == Kind::kCrossTraffic) {
    what = fmt::format("cross-traffic {} {} -> {} at {} for {:g} s", plane, src, dst, formatRate(rateBitsPerSec),
                       durationSec);
  }
  return what;
}

Result<std::vector<ScenarioEvent>> parseScenario(const std::string& yamlText, const std::string& sourceName,
                                                 const Topology& topology) {
  const Where w{sourceName};
  YAML::Node root;
  try {
    root = YAML::Load(yamlText);
  } catch (const YAML::Exception& e) {
    return invalidArgument("{}:{}: {}", sourceName, e.mark.line + 1, e.msg);
  }
  if (!root.IsMap() || !root["events"] || !root["events"].IsSequence()) {
    return invalidArgument("{}:1: a scenario is a map with an 'events' list", sourceName);
  }
  for (const auto& kv : root) {
    if (kv.first.as<std::string>() != "events") {
      return w.error(kv.first, fmt::format("unknown key '{}' (expected events)", kv.first.as<std::string>()));
    }
  }
  std::vector<ScenarioEvent> events;
  try {
    for (const auto& item : root["events"]) {
      MERIDIAN_ASSIGN_OR_RETURN(ScenarioEvent e, parseEvent(w, item, topology));
      events.push_back(std::move(e));
    }
  } catch (const YAML::Exception& e) {
    return invalidArgument("{}:{}: {}", sourceName, e.mark.line + 1, e.msg);
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const ScenarioEvent& a, const ScenarioEvent& b) { return a.atSec < b.atSec; });
  return events;
}

Result<std::vector<ScenarioEvent>> loadScenario(const std::string& path, const Topology& topology) {
  std::ifstream f(path);
  if (!f) return invalidArgument("cannot read scenario file {}: {}", path, std::strerror(errno));
  std::stringstream text;
  text << f.rdbuf();
  return parseScenario(text.str(), path, topology);
}

Status runScenario(const LabState& lab, const std::vector<ScenarioEvent>& events, const std::atomic<bool>* stop) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<std::thread> flows;
  std::atomic<bool> flowsStop{false};
  Status result;
  for (const auto& e : events) {
    auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(e.atSec));
    while (std::chrono::steady_clock::now() < due && !(stop != nullptr && stop->load())) {
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(due - std::chrono::steady_clock::now(),
                                                                               std::chrono::milliseconds(50)));
    }
    if (stop != nullptr && stop->load()) break;
    std::printf("[%8.3fs] %s\n", elapsed(), e.describe().c_str());
    std::fflush(stdout);
    Status st;
    switch (e.kind) {
      case ScenarioEvent::Kind::kDegrade:
      case ScenarioEvent::Kind::kCut: st = setLink(lab, e.plane, e.src, e.dst, e.change, e.bothWays).status(); break;
      case ScenarioEvent::Kind::kRestore: st = restoreLink(lab, e.plane, e.src, e.dst, e.bothWays).status(); break;
      case ScenarioEvent::Kind::kIsolate:
      case ScenarioEvent::Kind::kReconnect:
        st = isolateRegion(lab, e.src, e.kind == ScenarioEvent::Kind::kIsolate);
        break;
      case ScenarioEvent::Kind::kKill:
      case ScenarioEvent::Kind::kDrain:
      case ScenarioEvent::Kind::kRestart: {
        const NodeAction a = e.kind == ScenarioEvent::Kind::kKill    ? NodeAction::kKill
                             : e.kind == ScenarioEvent::Kind::kDrain ? NodeAction::kDrain
                                                                     : NodeAction::kRestart;
        auto done = nodeAction(lab, e.src, a);
        st = done.status();
        if (done.isOk()) std::printf("           %s\n", done->c_str());
        break;
      }
      case ScenarioEvent::Kind::kCrossTraffic:
        flows.emplace_back([&lab, &flowsStop, e] {
          CrossTrafficOptions o{e.plane, e.src, e.dst, e.rateBitsPerSec, e.durationSec, 0, false};
          auto r = runCrossTraffic(lab, o, &flowsStop);
          if (!r.isOk()) std::fprintf(stderr, "meridian-lab: %s\n", r.status().message().c_str());
        });
        break;
    }
    if (!st.isOk()) {
      result = invalidArgument("event at line {}: {}", e.line, st.message());
      break;
    }
  }
  if (!result.isOk() || (stop != nullptr && stop->load())) flowsStop = true;
  for (auto& f : flows) f.join();
  if (result.isOk()) std::printf("[%8.3fs] scenario done\n", elapsed());
  return result;
}

}  // namespace meridian::lab
