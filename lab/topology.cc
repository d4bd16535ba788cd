// The topology file parser, the unit parsers and printers, and the Topology lookups.
#include "lab/topology.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace meridian::lab {

namespace {

// Limits on link values: beyond them a value is a typo, not an experiment.
// The default queue: 50 ms at the rate, about a WAN round trip, so TCP-like senders can fill the
// link without the queue itself adding seconds of delay. The floor keeps a slow (or unlimited) link
// able to hold a few jumbo frames, and is above kMaxMtu, so a default queue always fits a packet.
constexpr double kDefaultQueueMs = 50;
constexpr std::uint64_t kMinDefaultQueueBytes = 64 * 1024;
// Integers above this are no longer exact in a double.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

constexpr std::size_t kMaxTopologyNameChars = 24;
constexpr std::size_t kMaxRegionNameChars = 10;
// Names listed in a "not found" error before "...".
constexpr std::size_t kMaxListedNames = 16;

// ---- Numbers with units ----

// A unit: a value written in `name` is value * mul / div in the base unit (us, bit/s, bytes).
// Two factors so that ns -> us divides by 1000 exactly instead of multiplying by an inexact 0.001.
struct Unit {
  std::string_view name;
  double mul;
  double div;
};

double toBase(double value, const Unit& unit) { return value * unit.mul / unit.div; }

// Largest first: the printers take the first unit the value reaches.
constexpr Unit kDurationUnits[] = {{"s", 1e6, 1}, {"ms", 1e3, 1}, {"us", 1, 1}, {"ns", 1, 1e3}};
constexpr Unit kMicroSign = {"\u00b5s", 1, 1};  // "µs", accepted, never printed
constexpr Unit kRateUnits[] = {
    {"Tbit", 1e12, 1}, {"Gbit", 1e9, 1}, {"Mbit", 1e6, 1}, {"kbit", 1e3, 1}, {"bit", 1, 1}};
constexpr Unit kBinaryByteUnits[] = {{"GiB", 1073741824.0, 1}, {"MiB", 1048576.0, 1}, {"KiB", 1024.0, 1}};
constexpr Unit kByteUnits[] = {{"B", 1, 1},   {"KB", 1e3, 1},        {"kB", 1e3, 1}, {"KiB", 1024.0, 1},
                               {"MB", 1e6, 1}, {"MiB", 1048576.0, 1}, {"GB", 1e9, 1}, {"GiB", 1073741824.0, 1}};

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

std::optional<double> parseNumber(std::string_view text) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

// "38ms" -> 38 and "ms". A space between number and unit is fine ("38 ms").
struct Quantity {
  double value = 0;
  std::string_view unit;
};

// The number in front of a unit, checked to be usable: finite and not negative (none of the
// quantities here can be negative). `what` names the quantity in the error ("delay", "rate").
Result<Quantity> splitQuantity(std::string_view text, std::string_view what, std::string_view example) {
  const std::string_view t = trim(text);
  Quantity q;
  const char* end = t.data() + t.size();
  auto [ptr, ec] = std::from_chars(t.data(), end, q.value);
  if (ec == std::errc::result_out_of_range) return invalidArgument("{} '{}' is out of range", what, text);
  if (ec != std::errc()) return invalidArgument("{} '{}' is not a number, expected e.g. {}", what, text, example);
  if (!std::isfinite(q.value)) return invalidArgument("{} '{}' is not a finite number", what, text);
  // signbit also catches "-0", which is harmless but certainly not what was meant.
  if (std::signbit(q.value)) return invalidArgument("{} '{}' is negative", what, text);
  q.unit = trim(std::string_view(ptr, static_cast<std::size_t>(end - ptr)));
  return q;
}

const Unit* findUnit(std::span<const Unit> units, std::string_view name) {
  for (const Unit& u : units) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

Result<double> parseDurationAs(std::string_view text, std::string_view what) {
  MERIDIAN_ASSIGN_OR_RETURN(Quantity q, splitQuantity(text, what, "38ms"));
  if (q.unit.empty()) {
    // Zero is zero in any unit; anything else without a unit is a guess we refuse to make.
    if (q.value == 0) return 0.0;
    return invalidArgument("{} needs a unit, e.g. 38ms (got '{}'; units: ns, us, ms, s)", what, text);
  }
  const Unit* unit = findUnit(kDurationUnits, q.unit);
  if (unit == nullptr && q.unit == kMicroSign.name) unit = &kMicroSign;
  if (unit == nullptr) {
    return invalidArgument("{} '{}' has an unknown unit '{}' (expected ns, us, ms or s)", what, text, q.unit);
  }
  return toBase(q.value, *unit);
}

Result<double> parseRateAs(std::string_view text, std::string_view what) {
  if (trim(text) == "unlimited") return 0.0;
  MERIDIAN_ASSIGN_OR_RETURN(Quantity q, splitQuantity(text, what, "400Mbit"));
  double bitsPerSec = q.value;
  if (q.unit.empty()) {
    // A bare number could be bits or bytes per second: only zero is unambiguous.
    if (q.value == 0) return 0.0;
    return invalidArgument("{} needs a unit, e.g. 400Mbit (got '{}')", what, text);
  }
  // A decimal prefix (k, M, G, T; either case, as tc accepts "mbit"), then "bit", "bps" or nothing.
  std::string_view rest = q.unit;
  switch (rest.front()) {
    case 'k': case 'K': bitsPerSec *= 1e3; rest.remove_prefix(1); break;
    case 'm': case 'M': bitsPerSec *= 1e6; rest.remove_prefix(1); break;
    case 'g': case 'G': bitsPerSec *= 1e9; rest.remove_prefix(1); break;
    case 't': case 'T': bitsPerSec *= 1e12; rest.remove_prefix(1); break;
    default: break;
  }
  if (!rest.empty() && rest != "bit" && rest != "bps") {
    if (rest.find('B') != std::string_view::npos) {
      return invalidArgument("{} '{}' is in bytes; rates are in bits per second, e.g. 400Mbit", what, text);
    }
    return invalidArgument("{} '{}' has an unknown unit '{}' (expected bit, kbit, Mbit, Gbit or Tbit)", what, text,
                           q.unit);
  }
  if (bitsPerSec > kMaxRateBitsPerSec) return invalidArgument("{} '{}' is above the limit of 1Tbit", what, text);
  return bitsPerSec;
}

Result<std::uint64_t> parseBytesAs(std::string_view text, std::string_view what) {
  MERIDIAN_ASSIGN_OR_RETURN(Quantity q, splitQuantity(text, what, "2MiB"));
  double bytes = q.value;
  if (!q.unit.empty()) {
    const Unit* unit = findUnit(kByteUnits, q.unit);
    if (unit == nullptr) {
      return invalidArgument("{} '{}' has an unknown unit '{}' (expected B, KB, KiB, MB, MiB, GB, GiB or none)",
                             what, text, q.unit);
    }
    bytes = toBase(q.value, *unit);
  }
  if (bytes > kMaxExactInteger) return invalidArgument("{} '{}' is out of range", what, text);
  // "1.1KB" is 1100.0000000000002 in binary floating point: round what is a whole number up to noise.
  const double whole = std::round(bytes);
  if (std::fabs(bytes - whole) > 1e-9 * std::max(1.0, bytes)) {
    return invalidArgument("{} '{}' is not a whole number of bytes", what, text);
  }
  return static_cast<std::uint64_t>(whole);
}

Result<double> parseFractionAs(std::string_view text, std::string_view what) {
  MERIDIAN_ASSIGN_OR_RETURN(Quantity q, splitQuantity(text, what, "0.5%"));
  if (q.unit == "%") {
    if (q.value > 100) return invalidArgument("{} '{}' is above 100%", what, text);
    return q.value / 100;
  }
  if (!q.unit.empty()) {
    return invalidArgument("{} '{}' has an unknown unit '{}' (expected a percentage like 0.5% or a fraction "
                           "like 0.005)", what, text, q.unit);
  }
  if (q.value > 1) {
    return invalidArgument("{} '{}' is above 1 (a fraction: 0.005 or 0.5% for half a percent)", what, text);
  }
  return q.value;
}

// The shortest text that names `value` (in the base unit) exactly in the largest unit it reaches,
// so that printing and parsing again gives the same double; `fallback` is the base unit, in which
// any value prints exactly.
std::string formatInUnits(double value, std::span<const Unit> units, const Unit& fallback) {
  for (const Unit& unit : units) {
    const double scaled = value * unit.div / unit.mul;
    if (std::fabs(scaled) < 1) continue;
    const std::string digits = fmt::format("{}", scaled);
    const auto back = parseNumber(digits);
    if (back && toBase(*back, unit) == value) return digits + std::string(unit.name);
  }
  return fmt::format("{}{}", value * fallback.div / fallback.mul, fallback.name);
}

std::string joinNames(std::span<const std::string_view> names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  return out;
}

// "a, b, c" for an error message; a long list is cut short, with the count.
template <typename T>
std::string nameList(const std::vector<T>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < kMaxListedNames; ++i) {
    if (i > 0) out += ", ";
    out += items[i].name;
  }
  if (items.size() > kMaxListedNames) out += fmt::format(", ... ({} in all)", items.size());
  return out;
}

template <typename T>
Result<int> findByName(const std::vector<T>& items, const std::string& name, std::string_view kind,
                       std::string_view plural) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].name == name) return static_cast<int>(i);
  }
  return invalidArgument("unknown {} '{}' ({}: {})", kind, name, plural, nameList(items));
}

bool isLower(char c) { return c >= 'a' && c <= 'z'; }
bool isDigit(char c) { return c >= '0' && c <= '9'; }

// Later values win, field by field: how default, intra and the links entries combine.
void mergeInto(LinkChange& into, const LinkChange& from) {
  if (from.delayUs) into.delayUs = from.delayUs;
  if (from.jitterUs) into.jitterUs = from.jitterUs;
  if (from.rateBitsPerSec) into.rateBitsPerSec = from.rateBitsPerSec;
  if (from.loss) into.loss = from.loss;
  if (from.queueBytes) into.queueBytes = from.queueBytes;
  if (from.cut) into.cut = from.cut;
}

// ---- The YAML file ----

constexpr std::string_view kTopKeys[] = {"name", "time_scale", "mtu", "regions", "planes"};
constexpr std::string_view kRegionKeys[] = {"name", "nodes"};
constexpr std::string_view kPlaneKeys[] = {"name", "carries", "default", "intra", "links"};
constexpr std::string_view kLinkKeys[] = {"delay", "jitter", "rate", "queue", "loss"};
constexpr std::string_view kEntryKeys[] = {"between", "from", "to", "delay", "jitter", "rate", "queue", "loss"};

// One `key: value` of a YAML map.
struct Field {
  YAML::Node key;
  YAML::Node value;
  // Where a problem with the value is: an empty value (`delay:`) has no position of its own, and
  // yaml-cpp gives it the position of whatever follows.
  YAML::Mark mark() const { return value.IsNull() ? key.Mark() : value.Mark(); }
};
using Fields = std::map<std::string, Field, std::less<>>;

const Field* findField(const Fields& fields, std::string_view key) {
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

class TopologyParser {
 public:
  explicit TopologyParser(std::string source) : source_(std::move(source)) {}

  Result<Topology> parse(const std::string& text) {
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      return fail(e.mark, "invalid YAML: {}", e.msg);
    }
    // A second document would be ignored silently by a plain load: most likely a mistake.
    if (documents.size() > 1) return fail(documents[1].Mark(), "a second YAML document ('---'); one topology per file");
    const YAML::Node root = documents.empty() ? YAML::Node() : documents[0];
    if (root.IsNull()) return fail(YAML::Mark(), "the file is empty (expected name, regions and planes)");
    MERIDIAN_ASSIGN_OR_RETURN(Fields top, readMap(root, kTopKeys, "the topology"));

    Topology topology;
    topology.source = source_;
    // Fixed order, whatever the order in the file: planes need the regions and the mtu.
    MERIDIAN_ASSIGN_OR_RETURN(topology.name, topologyName(top, root));
    if (const Field* f = findField(top, "time_scale")) {
      MERIDIAN_ASSIGN_OR_RETURN(topology.timeScale, timeScale(*f));
    }
    if (const Field* f = findField(top, "mtu")) {
      MERIDIAN_ASSIGN_OR_RETURN(topology.mtu, mtu(*f));
    }
    const Field* regions = findField(top, "regions");
    if (regions == nullptr) return fail(root.Mark(), "missing key 'regions' (a list of {{name, nodes}})");
    MERIDIAN_RETURN_IF_ERROR(parseRegions(*regions, topology));
    const Field* planes = findField(top, "planes");
    if (planes == nullptr) return fail(root.Mark(), "missing key 'planes' (a list of networks between the regions)");
    MERIDIAN_RETURN_IF_ERROR(parsePlanes(*planes, topology));
    return topology;
  }

 private:
  // "file:line: plane wan-a: message". A mark without a position (an empty file) counts as line 1.
  template <typename... Args>
  Status fail(const YAML::Mark& mark, fmt::format_string<Args...> f, Args&&... args) const {
    const int line = mark.line >= 0 ? mark.line + 1 : 1;
    return invalidArgument("{}:{}: {}{}", source_, line, where_.empty() ? std::string() : where_ + ": ",
                           fmt::format(f, std::forward<Args>(args)...));
  }

  // The keys of a map, each checked against `allowed` and seen once.
  Result<Fields> readMap(const YAML::Node& node, std::span<const std::string_view> allowed, std::string_view what,
                         const YAML::Mark& fallback = YAML::Mark()) const {
    if (!node.IsMap()) {
      return fail(node.IsNull() ? fallback : node.Mark(), "{} must be a map of 'key: value' entries", what);
    }
    Fields fields;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) return fail(key.Mark(), "keys must be plain names");
      const std::string& name = key.Scalar();
      if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
        return fail(key.Mark(), "unknown key '{}' (expected {})", name, joinNames(allowed));
      }
      auto [pos, inserted] = fields.try_emplace(name, Field{key, it->second});
      if (!inserted) {
        return fail(key.Mark(), "duplicate key '{}' (first on line {})", name, pos->second.key.Mark().line + 1);
      }
    }
    return fields;
  }

  Result<std::string> scalar(const Field& field) const {
    if (field.value.IsNull()) return fail(field.key.Mark(), "'{}' has no value", field.key.Scalar());
    if (!field.value.IsScalar()) {
      return fail(field.value.Mark(), "'{}' must be a single value, not a {}", field.key.Scalar(),
                  field.value.IsMap() ? "map" : "list");
    }
    return field.value.Scalar();
  }

  Result<int> integer(const Field& field) const {
    MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(field));
    int v = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc() || ptr != end) {
      return fail(field.mark(), "'{}' must be a whole number, got '{}'", field.key.Scalar(), text);
    }
    return v;
  }

  Result<std::string> topologyName(const Fields& top, const YAML::Node& root) const {
    const Field* f = findField(top, "name");
    if (f == nullptr) return fail(root.Mark(), "missing key 'name' (the topology's name, e.g. three-regions)");
    MERIDIAN_ASSIGN_OR_RETURN(std::string name, scalar(*f));
    const bool charsOk =
        std::all_of(name.begin(), name.end(), [](char c) { return isLower(c) || isDigit(c) || c == '-'; });
    if (name.empty() || name.size() > kMaxTopologyNameChars || !charsOk) {
      return fail(f->mark(), "topology name '{}' must be 1 to {} characters of a-z, 0-9 and '-'", name,
                  kMaxTopologyNameChars);
    }
    return name;
  }

  Result<double> timeScale(const Field& field) const {
    MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(field));
    const auto v = parseNumber(trim(text));
    // Written as !(v > 0) so that NaN fails too.
    if (!v || !(*v > 0) || *v > 10) {
      return fail(field.mark(), "time_scale must be a number above 0 and at most 10, got '{}'", text);
    }
    return *v;
  }

  Result<int> mtu(const Field& field) const {
    MERIDIAN_ASSIGN_OR_RETURN(int v, integer(field));
    if (v < kMinMtu || v > kMaxMtu) return fail(field.mark(), "mtu {} is outside {}..{}", v, kMinMtu, kMaxMtu);
    return v;
  }

  Status parseRegions(const Field& field, Topology& topology) const {
    if (!field.value.IsSequence() || field.value.size() == 0) {
      return fail(field.mark(), "'regions' must be a non-empty list of {{name, nodes}}");
    }
    std::map<std::string, int> firstLine;
    int totalNodes = 0;
    for (auto it = field.value.begin(); it != field.value.end(); ++it) {
      const YAML::Node node = *it;
      MERIDIAN_ASSIGN_OR_RETURN(Fields fields, readMap(node, kRegionKeys, "a region", field.mark()));
      const Field* nameField = findField(fields, "name");
      if (nameField == nullptr) return fail(node.Mark(), "a region needs a name");
      MERIDIAN_ASSIGN_OR_RETURN(std::string name, scalar(*nameField));
      // No '-' in region names: node names are "<region>-<i>" and must split back unambiguously.
      const bool charsOk = !name.empty() && isLower(name.front()) &&
                           std::all_of(name.begin(), name.end(), [](char c) { return isLower(c) || isDigit(c); });
      if (!charsOk || name.size() > kMaxRegionNameChars) {
        return fail(nameField->mark(),
                    "region name '{}' must be 1 to {} characters of a-z and 0-9, starting with a letter", name,
                    kMaxRegionNameChars);
      }
      const int line = nameField->mark().line + 1;
      if (auto [pos, inserted] = firstLine.try_emplace(name, line); !inserted) {
        return fail(nameField->mark(), "duplicate region '{}' (first on line {})", name, pos->second);
      }
      const Field* nodesField = findField(fields, "nodes");
      if (nodesField == nullptr) return fail(node.Mark(), "region {} needs 'nodes' (how many nodes it has)", name);
      MERIDIAN_ASSIGN_OR_RETURN(int nodes, integer(*nodesField));
      if (nodes < 1) return fail(nodesField->mark(), "region {} has {} nodes, it needs at least 1", name, nodes);
      totalNodes += std::min(nodes, kMaxNodes + 1);  // capped: no overflow on absurd counts
      if (totalNodes > kMaxNodes) {
        return fail(nodesField->mark(), "more than {} nodes in all (each plane's addresses are one /24)", kMaxNodes);
      }
      topology.regions.push_back(Region{name, nodes});
    }
    for (int r = 0; r < static_cast<int>(topology.regions.size()); ++r) {
      for (int i = 0; i < topology.regions[r].nodes; ++i) {
        const int index = static_cast<int>(topology.nodes.size());
        topology.nodes.push_back(Node{fmt::format("{}-{}", topology.regions[r].name, i + 1), r, i, index});
      }
    }
    return Status::ok();
  }

  Result<int> region(const Topology& topology, const YAML::Node& node) const {
    if (!node.IsScalar()) return fail(node.Mark(), "expected a region name");
    auto found = findByName(topology.regions, node.Scalar(), "region", "regions");
    if (!found) return fail(node.Mark(), "{}", found.status().message());
    return found.value();
  }

  Result<double> durationField(const Field& field) const {
    MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(field));
    auto us = parseDurationAs(text, field.key.Scalar());
    if (!us) return fail(field.mark(), "{}", us.status().message());
    if (us.value() > kMaxLinkDelayUs) {
      return fail(field.mark(), "{} '{}' is above the limit of {}", field.key.Scalar(), text,
                  formatDuration(kMaxLinkDelayUs));
    }
    return us.value();
  }

  // The link values (delay, jitter, rate, queue, loss) among `fields`.
  Result<LinkChange> linkValues(const Fields& fields) const {
    LinkChange change;
    if (const Field* f = findField(fields, "delay")) {
      MERIDIAN_ASSIGN_OR_RETURN(change.delayUs, durationField(*f));
    }
    if (const Field* f = findField(fields, "jitter")) {
      MERIDIAN_ASSIGN_OR_RETURN(change.jitterUs, durationField(*f));
    }
    if (const Field* f = findField(fields, "rate")) {
      MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(*f));
      auto rate = parseRateAs(text, "rate");
      if (!rate) return fail(f->mark(), "{}", rate.status().message());
      change.rateBitsPerSec = rate.value();
    }
    if (const Field* f = findField(fields, "queue")) {
      MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(*f));
      auto bytes = parseBytesAs(text, "queue");
      if (!bytes) return fail(f->mark(), "{}", bytes.status().message());
      if (bytes.value() > kMaxQueueBytes) return fail(f->mark(), "queue '{}' is above the limit of 1GiB", text);
      change.queueBytes = bytes.value();
    }
    if (const Field* f = findField(fields, "loss")) {
      MERIDIAN_ASSIGN_OR_RETURN(std::string text, scalar(*f));
      auto loss = parseFractionAs(text, "loss");
      if (!loss) return fail(f->mark(), "{}", loss.status().message());
      change.loss = loss.value();
    }
    return change;
  }

  Result<LinkChange> linkBlock(const Field& field) const {
    MERIDIAN_ASSIGN_OR_RETURN(Fields fields, readMap(field.value, kLinkKeys, fmt::format("'{}'", field.key.Scalar()),
                                                     field.mark()));
    return linkValues(fields);
  }

  // The ordered (source, destination) region pairs a links entry applies to.
  Result<std::vector<std::pair<int, int>>> entryPairs(const Topology& topology, const Fields& fields,
                                                      const YAML::Node& entry) const {
    const Field* between = findField(fields, "between");
    const Field* from = findField(fields, "from");
    const Field* to = findField(fields, "to");
    if (between != nullptr && (from != nullptr || to != nullptr)) {
      const Field* extra = from != nullptr ? from : to;
      return fail(extra->key.Mark(),
                  "a links entry has either 'between' (both directions) or 'from' and 'to' (one direction), not both");
    }
    if (between != nullptr) {
      const YAML::Node& pair = between->value;
      if (!pair.IsSequence() || pair.size() != 2) {
        return fail(between->mark(), "'between' must be a list of two regions, e.g. [london, virginia]");
      }
      MERIDIAN_ASSIGN_OR_RETURN(int a, region(topology, pair[0]));
      MERIDIAN_ASSIGN_OR_RETURN(int b, region(topology, pair[1]));
      if (a == b) return std::vector<std::pair<int, int>>{{a, a}};  // the inside of one region
      return std::vector<std::pair<int, int>>{{a, b}, {b, a}};
    }
    if (from == nullptr && to == nullptr) {
      return fail(entry.Mark(),
                  "a links entry needs 'between: [a, b]' (both directions) or 'from' and 'to' (one direction)");
    }
    if (from == nullptr) return fail(to->key.Mark(), "a links entry with 'to' needs 'from' too");
    if (to == nullptr) return fail(from->key.Mark(), "a links entry with 'from' needs 'to' too");
    if (from->value.IsNull()) return fail(from->key.Mark(), "'from' has no value");
    if (to->value.IsNull()) return fail(to->key.Mark(), "'to' has no value");
    MERIDIAN_ASSIGN_OR_RETURN(int a, region(topology, from->value));
    MERIDIAN_ASSIGN_OR_RETURN(int b, region(topology, to->value));
    return std::vector<std::pair<int, int>>{{a, b}};
  }

  Status parsePlane(const YAML::Node& node, const YAML::Mark& fallback, std::map<std::string, int>& firstLine,
                    Topology& topology) {
    where_.clear();
    MERIDIAN_ASSIGN_OR_RETURN(Fields fields, readMap(node, kPlaneKeys, "a plane", fallback));
    const Field* nameField = findField(fields, "name");
    if (nameField == nullptr) return fail(node.Mark(), "a plane needs a name");
    MERIDIAN_ASSIGN_OR_RETURN(std::string name, scalar(*nameField));
    const bool charsOk =
        !name.empty() && isLower(name.front()) &&
        std::all_of(name.begin(), name.end(), [](char c) { return isLower(c) || isDigit(c) || c == '-'; });
    if (!charsOk) {
      return fail(nameField->mark(), "plane name '{}' must be a-z, 0-9 and '-', starting with a letter", name);
    }
    if (name.size() > kMaxPlaneNameChars) {
      return fail(nameField->mark(),
                  "plane name '{}' is {} characters, at most {} (it is also the interface name inside each node)",
                  name, name.size(), kMaxPlaneNameChars);
    }
    if (auto [pos, inserted] = firstLine.try_emplace(name, nameField->mark().line + 1); !inserted) {
      return fail(nameField->mark(), "duplicate plane '{}' (first on line {})", name, pos->second);
    }
    where_ = "plane " + name;
    bool fabric = false;
    if (const Field* f = findField(fields, "carries")) {
      MERIDIAN_ASSIGN_OR_RETURN(std::string carries, scalar(*f));
      if (carries != "tcp" && carries != "fabric") {
        return fail(f->mark(), "carries '{}': expected tcp (Meridian's TCP path, the default) or fabric", carries);
      }
      fabric = carries == "fabric";
      if (fabric && topology.fabricPlane() >= 0) {
        return fail(f->mark(), "a second plane that carries fabric ({} already does); at most one",
                    topology.planes[static_cast<std::size_t>(topology.fabricPlane())].name);
      }
    }

    const std::size_t n = topology.regions.size();
    LinkChange base;
    if (const Field* f = findField(fields, "default")) {
      MERIDIAN_ASSIGN_OR_RETURN(base, linkBlock(*f));
    }
    std::vector<LinkChange> merged(n * n, base);
    if (const Field* f = findField(fields, "intra")) {
      MERIDIAN_ASSIGN_OR_RETURN(LinkChange intra, linkBlock(*f));
      for (std::size_t r = 0; r < n; ++r) mergeInto(merged[r * n + r], intra);
    }
    if (const Field* links = findField(fields, "links")) {
      // An empty `links:` is allowed: default and intra may already cover every pair (one region).
      if (!links->value.IsNull() && !links->value.IsSequence()) {
        return fail(links->mark(), "'links' must be a list of entries with 'between' or 'from' and 'to'");
      }
      for (auto it = links->value.begin(); it != links->value.end(); ++it) {
        const YAML::Node entry = *it;
        MERIDIAN_ASSIGN_OR_RETURN(Fields entryFields, readMap(entry, kEntryKeys, "a links entry", links->mark()));
        MERIDIAN_ASSIGN_OR_RETURN(auto pairs, entryPairs(topology, entryFields, entry));
        MERIDIAN_ASSIGN_OR_RETURN(LinkChange change, linkValues(entryFields));
        if (change.empty()) {
          return fail(entry.Mark(), "a links entry that sets nothing (expected {})", joinNames(kLinkKeys));
        }
        for (auto [src, dst] : pairs) mergeInto(merged[static_cast<std::size_t>(src) * n + dst], change);
      }
    }

    Plane plane;
    plane.name = name;
    plane.fabric = fabric;
    for (std::size_t src = 0; src < n; ++src) {
      for (std::size_t dst = 0; dst < n; ++dst) {
        const LinkChange& change = merged[src * n + dst];
        const std::string& srcName = topology.regions[src].name;
        const std::string& dstName = topology.regions[dst].name;
        if (!change.delayUs) {
          return fail(node.Mark(), "no delay for {} -> {} (add a links entry)", srcName, dstName);
        }
        LinkParams link = change.applyTo(LinkParams{});
        if (link.queueBytes < static_cast<std::uint64_t>(topology.mtu)) {
          return fail(node.Mark(), "the queue of {} -> {} ({}) cannot hold one packet of the mtu ({} bytes)", srcName,
                      dstName, formatBytes(link.queueBytes), topology.mtu);
        }
        plane.links.push_back(link);
      }
    }
    topology.planes.push_back(std::move(plane));
    where_.clear();
    return Status::ok();
  }

  Status parsePlanes(const Field& field, Topology& topology) {
    if (!field.value.IsSequence() || field.value.size() == 0) {
      return fail(field.mark(), "'planes' must be a non-empty list of planes");
    }
    if (field.value.size() > static_cast<std::size_t>(kMaxPlanes)) {
      return fail(field.mark(), "{} planes, at most {} allowed", field.value.size(), kMaxPlanes);
    }
    std::map<std::string, int> firstLine;
    for (auto it = field.value.begin(); it != field.value.end(); ++it) {
      MERIDIAN_RETURN_IF_ERROR(parsePlane(*it, field.mark(), firstLine, topology));
    }
    if (topology.fabricPlane() >= 0 && topology.planes.size() == 1) {
      return fail(field.mark(), "the only plane carries fabric; at least one plane must carry tcp (the ranks' "
                                "control connections, which also carry the fabric's endpoint names)");
    }
    return Status::ok();
  }

  std::string source_;
  std::string where_;  // "plane wan-a" while inside a plane: the prefix of error messages
};

}  // namespace

// ---- LinkChange, Topology ----

LinkParams LinkChange::applyTo(LinkParams p) const {
  // A queue still at the default for the old rate follows a new rate: `set rate=10Mbit` on a link
  // with a default 400 Mbit/s queue should not leave 2 s of buffering behind it.
  const bool queueWasDefault = p.queueBytes == 0 || p.queueBytes == defaultQueueBytes(p.rateBitsPerSec);
  if (delayUs) p.delayUs = *delayUs;
  if (jitterUs) p.jitterUs = *jitterUs;
  if (rateBitsPerSec) p.rateBitsPerSec = *rateBitsPerSec;
  if (loss) p.loss = *loss;
  if (cut) p.cut = *cut;
  if (queueBytes) {
    p.queueBytes = *queueBytes;
  } else if (queueWasDefault) {
    p.queueBytes = 0;
  }
  // 0 means "the default": resolve it here, so that a LinkParams from applyTo is complete.
  if (p.queueBytes == 0) p.queueBytes = defaultQueueBytes(p.rateBitsPerSec);
  return p;
}

bool LinkChange::empty() const { return !delayUs && !jitterUs && !rateBitsPerSec && !loss && !queueBytes && !cut; }

// `wanted`, not `name`: that is a member of Topology.
Result<int> Topology::findRegion(const std::string& wanted) const {
  return findByName(regions, wanted, "region", "regions");
}

Result<int> Topology::findNode(const std::string& wanted) const { return findByName(nodes, wanted, "node", "nodes"); }

Result<int> Topology::findPlane(const std::string& wanted) const {
  return findByName(planes, wanted, "plane", "planes");
}

std::string Topology::address(int plane, int node) const { return fmt::format("198.18.{}.{}", plane, node + 1); }

int Topology::fabricPlane() const {
  for (std::size_t p = 0; p < planes.size(); ++p) {
    if (planes[p].fabric) return static_cast<int>(p);
  }
  return -1;
}

std::uint64_t defaultQueueBytes(double rateBitsPerSec) {
  // Unlimited (0) has no rate limiter for packets to wait in front of: the floor will do. Written
  // as !(x > 0) so that NaN lands here too.
  if (!(rateBitsPerSec > 0)) return kMinDefaultQueueBytes;
  // In this order (not rate / 8 * 0.05) so that round rates give whole bytes without rounding noise.
  const double bytes = std::ceil(rateBitsPerSec * kDefaultQueueMs / 8000);
  // Capped at the parser's limit (reached above about 170 Gbit/s), so a default is always valid.
  if (bytes >= static_cast<double>(kMaxQueueBytes)) return kMaxQueueBytes;
  return std::max(kMinDefaultQueueBytes, static_cast<std::uint64_t>(bytes));
}

// ---- Files ----

Result<Topology> parseTopology(const std::string& yamlText, const std::string& sourceName) {
  try {
    return TopologyParser(sourceName).parse(yamlText);
  } catch (const std::exception& e) {
    // yaml-cpp throws on some malformed input after loading too; this API never throws.
    return invalidArgument("{}: {}", sourceName, e.what());
  }
}

Result<Topology> loadTopology(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return invalidArgument("cannot read topology file {}: {}", path, std::strerror(errno));
  std::string text;
  char buffer[8192];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
  // A directory opens fine and fails on read (EISDIR).
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) return invalidArgument("cannot read topology file {}: {}", path, std::strerror(error));
  return parseTopology(text, path);
}

// ---- Units ----

Result<double> parseDurationUs(const std::string& text) { return parseDurationAs(text, "duration"); }
Result<double> parseRateBitsPerSec(const std::string& text) { return parseRateAs(text, "rate"); }
Result<std::uint64_t> parseBytes(const std::string& text) { return parseBytesAs(text, "size"); }
Result<double> parseFraction(const std::string& text) { return parseFractionAs(text, "fraction"); }

std::string formatDuration(double us) {
  if (us == 0) return "0ms";
  return formatInUnits(us, kDurationUnits, kDurationUnits[2]);
}

std::string formatRate(double bitsPerSec) {
  if (bitsPerSec == 0) return "unlimited";
  return formatInUnits(bitsPerSec, kRateUnits, kRateUnits[4]);
}

std::string formatBytes(std::uint64_t bytes) {
  // Binary units where they read well, with at most 3 decimals (2MiB, 2.5MiB, 1.125KiB); else plain
  // bytes, which is also how 1000-based sizes print (2500000B): one family of units in the output.
  // Integer arithmetic throughout, so that even sizes beyond 2^53 print exactly.
  for (const Unit& unit : kBinaryByteUnits) {
    const auto size = static_cast<std::uint64_t>(unit.mul);
    const std::uint64_t rest = bytes % size;
    // Decimals only below 1024 of the unit: 4882812.5KiB is exact but no easier to read than bytes.
    if (bytes < size || rest * 1000 % size != 0 || (rest != 0 && bytes / size >= 1024)) continue;
    std::string out = fmt::format("{}", bytes / size);
    if (rest != 0) {
      std::string decimals = fmt::format("{:03}", rest * 1000 / size);
      decimals.erase(decimals.find_last_not_of('0') + 1);
      out += "." + decimals;
    }
    return out + std::string(unit.name);
  }
  return fmt::format("{}B", bytes);
}

}  // namespace meridian::lab
