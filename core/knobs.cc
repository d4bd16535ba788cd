// Knob lookup, validation and the generated README table.
#include "core/knobs.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meridian {

namespace {
#define MERIDIAN_STRING_KNOB_ENTRY(id, name, def, doc) knobs::id,
#define MERIDIAN_INT_KNOB_ENTRY(id, name, def, min, max, doc) knobs::id,
#define MERIDIAN_CHOICE_KNOB_ENTRY(id, name, def, choices, doc) knobs::id,
constexpr KnobInfo kAllKnobs[] = {MERIDIAN_KNOBS(MERIDIAN_STRING_KNOB_ENTRY, MERIDIAN_INT_KNOB_ENTRY,
                                                 MERIDIAN_INT_KNOB_ENTRY, MERIDIAN_CHOICE_KNOB_ENTRY)};
#undef MERIDIAN_CHOICE_KNOB_ENTRY
#undef MERIDIAN_INT_KNOB_ENTRY
#undef MERIDIAN_STRING_KNOB_ENTRY

// What an int knob may be: [lo, hi], and 0 besides when zero.
struct IntRange {
  std::int64_t lo;
  std::int64_t hi;
  bool zero;
  bool allows(std::int64_t v) const { return (v >= lo && v <= hi) || (zero && v == 0); }
};

// Byte counts read best with the suffixes parseByteSize takes: 65536 -> "64k".
std::string rangeBound(const KnobInfo& knob, std::int64_t v) {
  const bool bytes = std::string_view(knob.name).ends_with("_BYTES");
  if (bytes && v > 0) {
    for (const auto& [shift, suffix] : {std::pair{30, 'g'}, std::pair{20, 'm'}, std::pair{10, 'k'}}) {
      if (v % (std::int64_t{1} << shift) == 0 && v != std::numeric_limits<std::int64_t>::max()) {
        return fmt::format("{}{}", v >> shift, suffix);
      }
    }
  }
  return std::to_string(v);
}

std::string rangeText(const KnobInfo& knob, const IntRange& r) {
  const std::string interval = fmt::format("in [{}, {}]", rangeBound(knob, r.lo), rangeBound(knob, r.hi));
  return r.zero && !(r.lo <= 0 && r.hi >= 0) ? "0 or " + interval : interval;
}

template <typename T>
T valueOrThrow(Result<T> r) {
  if (!r.isOk()) throw ConfigError(r.status().message());
  return std::move(r).value();
}

}  // namespace

std::span<const KnobInfo> allKnobs() { return kAllKnobs; }

bool knobIsSet(const KnobInfo& knob) {
  const char* v = std::getenv(knob.name);
  return v != nullptr && *v != '\0';
}

std::string knobString(const KnobInfo& knob) {
  const char* v = std::getenv(knob.name);
  if (v != nullptr && *v != '\0') return v;
  return knob.defaultValue;
}

Result<std::int64_t> readByteSize(const std::string& text, const std::string& what) {
  if (text.empty()) return invalidArgument("{}: empty value, expected an integer", what);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE) return invalidArgument("{}='{}': not an integer", what, text);
  std::int64_t mult = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'k': case 'K': mult = 1LL << 10; break;
      case 'm': case 'M': mult = 1LL << 20; break;
      case 'g': case 'G': mult = 1LL << 30; break;
      default: return invalidArgument("{}='{}': not an integer", what, text);
    }
    ++end;
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
    if (*end != '\0') return invalidArgument("{}='{}': not an integer", what, text);
  }
  if (v > std::numeric_limits<std::int64_t>::max() / mult ||
      v < std::numeric_limits<std::int64_t>::min() / mult) {
    return invalidArgument("{}='{}': out of range", what, text);
  }
  return static_cast<std::int64_t>(v) * mult;
}

std::int64_t parseByteSize(const std::string& text, const std::string& what) {
  return valueOrThrow(readByteSize(text, what));
}

std::string knobRangeText(const KnobInfo& knob) {
  return rangeText(knob, IntRange{knob.minValue, knob.maxValue, knob.zeroAllowed});
}

Result<std::int64_t> readKnobInt(const KnobInfo& knob, std::int64_t min, std::int64_t max) {
  const std::string text = knobString(knob);
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t v, readByteSize(text, knob.name));
  // The declared range, narrowed to the caller's.
  const IntRange range{std::max(min, knob.minValue), std::min(max, knob.maxValue),
                       knob.zeroAllowed && min <= 0 && max >= 0};
  if (!range.allows(v)) return invalidArgument("{}='{}': not {}", knob.name, text, rangeText(knob, range));
  return v;
}

std::int64_t knobInt(const KnobInfo& knob) { return valueOrThrow(readKnobInt(knob)); }

std::int64_t knobInt(const KnobInfo& knob, std::int64_t min, std::int64_t max) {
  return valueOrThrow(readKnobInt(knob, min, max));
}

std::vector<std::string> knobChoices(const KnobInfo& knob) {
  std::vector<std::string> out;
  const std::string_view all = knob.choices;
  std::size_t start = 0;
  while (start < all.size()) {
    std::size_t bar = all.find('|', start);
    if (bar == std::string_view::npos) bar = all.size();
    out.emplace_back(all.substr(start, bar - start));
    start = bar + 1;
  }
  return out;
}

Result<std::string> readKnobChoice(const KnobInfo& knob, std::string_view given) {
  std::string value = given.empty() ? knobString(knob) : std::string(given);
  const std::vector<std::string> choices = knobChoices(knob);
  if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
    return invalidArgument("{}='{}': not one of {}", knob.name, value, fmt::join(choices, ", "));
  }
  return value;
}

std::string knobChoice(const KnobInfo& knob, std::string_view given) {
  return valueOrThrow(readKnobChoice(knob, given));
}

std::string knobTypeName(const KnobInfo& k) {
  switch (k.type) {
    case KnobType::kInt: return (k.zeroAllowed ? "int, " : "int ") + knobRangeText(k);
    case KnobType::kString: return "string";
    case KnobType::kChoice: {
      std::string out = "one of";
      const auto choices = knobChoices(k);
      for (std::size_t i = 0; i < choices.size(); ++i) out += fmt::format("{} `{}`", i == 0 ? "" : ",", choices[i]);
      return out;
    }
  }
  return "?";
}

std::string knobMarkdownTable() {
  std::string out = "| variable | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const KnobInfo& k : allKnobs()) {
    out += fmt::format("| `{}` | {} | {} | {} |\n", k.name, knobTypeName(k),
                       *k.defaultValue ? fmt::format("`{}`", k.defaultValue) : std::string("(unset)"), k.doc);
  }
  return out;
}

std::vector<std::string> splitCommaList(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(std::move(item));
    start = end + 1;
  }
  return out;
}

std::string joinCommaList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += ',';
    out += s;
  }
  return out;
}

}  // namespace meridian
