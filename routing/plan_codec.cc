// Plan announcements as JSON text (the text parser keeps its own stack: hostile nesting
// cannot exhaust the thread's).
#include "routing/plan_codec.h"

#include <utility>

#include <nlohmann/json.hpp>

namespace meridian::routing {

namespace {

using nlohmann::json;

bool samePlan(const Plan& a, const Plan& b) {
  return a.algorithm == b.algorithm && a.ringOrder == b.ringOrder && a.groups == b.groups &&
         a.crossOrder == b.crossOrder && a.root == b.root;
}

json encodePlan(const Plan& p) {
  return {{"a", static_cast<int>(p.algorithm)}, {"o", p.ringOrder}, {"g", p.groups}, {"x", p.crossOrder},
          {"r", p.root}, {"s", p.predictedSec}};
}

bool intArray(const json& j, int lo, int hi) {
  if (!j.is_array()) return false;
  for (const json& e : j) {
    if (!e.is_number_integer() || e.get<std::int64_t>() < lo || e.get<std::int64_t>() > hi) return false;
  }
  return true;
}

Result<Plan> decodePlan(const json& j, int ranks) {
  if (!j.is_object()) return invalidArgument("plan announcement: a plan is not an object");
  for (const char* key : {"a", "o", "g", "x", "r", "s"}) {
    if (!j.contains(key)) return invalidArgument("plan announcement: a plan lacks '{}'", key);
  }
  const json &a = j["a"], &o = j["o"], &g = j["g"], &x = j["x"], &r = j["r"], &s = j["s"];
  if (!a.is_number_integer() || a.get<std::int64_t>() < 0 ||
      a.get<std::int64_t>() > static_cast<int>(Algorithm::kParameterServer)) {
    return invalidArgument("plan announcement: unknown algorithm");
  }
  if (!intArray(o, 0, ranks - 1) || !intArray(x, 0, ranks - 1) || !g.is_array() || g.size() > static_cast<std::size_t>(ranks) ||
      !r.is_number_integer() || !s.is_number()) {
    return invalidArgument("plan announcement: malformed plan fields");
  }
  Plan p;
  p.algorithm = static_cast<Algorithm>(a.get<int>());
  p.ringOrder = o.get<std::vector<int>>();
  for (const json& grp : g) {
    if (!intArray(grp, 0, ranks - 1)) return invalidArgument("plan announcement: malformed group");
    p.groups.push_back(grp.get<std::vector<int>>());
  }
  p.crossOrder = x.get<std::vector<int>>();
  const auto root = r.get<std::int64_t>();
  if (root < 0 || root >= ranks) return invalidArgument("plan announcement: root {} outside 0..{}", root, ranks - 1);
  p.root = static_cast<int>(root);
  p.predictedSec = s.get<double>();
  MERIDIAN_RETURN_IF_ERROR(validatePlan(p, ranks));
  return p;
}

}  // namespace

std::vector<std::uint8_t> encodeAnnouncement(const PlanAnnouncement& a) {
  json j{{"e", a.epoch}, {"n", a.nextCheckpoint}, {"why", a.reason}};
  if (a.table) {
    json plans = json::array(), classes = json::array();
    std::vector<const Plan*> unique;
    for (std::size_t c = 0; c < a.table->plans.size(); ++c) {
      const Plan& p = a.table->plans[c];
      std::size_t k = 0;
      while (k < unique.size() && !samePlan(*unique[k], p)) ++k;
      if (k == unique.size()) {
        unique.push_back(&p);
        plans.push_back(encodePlan(p));
      }
      classes.push_back({a.table->classBytes[c], k});
    }
    j["t"] = {{"p", std::move(plans)}, {"c", std::move(classes)}};
  }
  const std::string text = j.dump();
  return {text.begin(), text.end()};
}

Result<PlanAnnouncement> decodeAnnouncement(std::span<const std::uint8_t> bytes, int ranks) {
  if (bytes.size() > kMaxAnnouncementBytes) {
    return invalidArgument("plan announcement of {} bytes exceeds {}", bytes.size(), kMaxAnnouncementBytes);
  }
  if (ranks < 1) return invalidArgument("plan announcement for {} ranks", ranks);
  const json j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("plan announcement: not a JSON object");
  const auto e = j.find("e"), n = j.find("n"), why = j.find("why");
  if (e == j.end() || !e->is_number_unsigned() || n == j.end() || !n->is_number_unsigned() || why == j.end() ||
      !why->is_string()) {
    return invalidArgument("plan announcement: needs unsigned e and n and a string why");
  }
  PlanAnnouncement a;
  a.epoch = e->get<std::uint64_t>();
  a.nextCheckpoint = n->get<std::uint64_t>();
  a.reason = why->get<std::string>();
  const auto t = j.find("t");
  if (t != j.end() && a.epoch == 0) return invalidArgument("plan announcement: a table needs an epoch > 0");
  if (t == j.end()) return a;
  if (!t->is_object() || !t->contains("p") || !t->contains("c") || !(*t)["p"].is_array() || !(*t)["c"].is_array()) {
    return invalidArgument("plan announcement: malformed table");
  }
  const json &plans = (*t)["p"], &classes = (*t)["c"];
  if (classes.empty() || classes.size() > kMaxPlanClasses || plans.size() > classes.size()) {
    return invalidArgument("plan announcement: {} classes, {} plans", classes.size(), plans.size());
  }
  std::vector<Plan> decoded;
  for (const json& p : plans) {
    MERIDIAN_ASSIGN_OR_RETURN(Plan plan, decodePlan(p, ranks));
    decoded.push_back(std::move(plan));
  }
  PlanTable table;
  for (const json& c : classes) {
    if (!c.is_array() || c.size() != 2 || !c[0].is_number_unsigned() || !c[1].is_number_unsigned() ||
        c[1].get<std::uint64_t>() >= decoded.size()) {
      return invalidArgument("plan announcement: a class is not [bytes, plan index]");
    }
    const auto b = c[0].get<std::uint64_t>();
    if (!table.classBytes.empty() && b <= table.classBytes.back()) {
      return invalidArgument("plan announcement: class sizes must increase");
    }
    table.classBytes.push_back(static_cast<std::size_t>(b));
    table.plans.push_back(decoded[static_cast<std::size_t>(c[1].get<std::uint64_t>())]);
  }
  a.table = std::move(table);
  return a;
}

}  // namespace meridian::routing
