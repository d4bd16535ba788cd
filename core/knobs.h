// Typed access to the MERIDIAN_* knobs declared in core/knob_list.h. A malformed value
// is a configuration error naming the variable, the value and what it may be, never a
// silent default. Each reader comes in two forms: a Result form (read*) for code that
// returns Status, which never throws, and a throwing form (knob*) for set-up entry points
// that document they throw ConfigError. Both give the same message for the same value.
// Knobs are read once, where a component is configured, never on the data path.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/knob_list.h"
#include "core/status.h"

namespace meridian {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class KnobType { kInt, kString, kChoice };

struct KnobInfo {
  const char* name;
  KnobType type;
  const char* defaultValue;
  const char* choices;  // kChoice: the allowed values, '|'-separated; otherwise ""
  const char* doc;
  // kInt: the allowed range [minValue, maxValue], and 0 besides when zeroAllowed.
  std::int64_t minValue = 0;
  std::int64_t maxValue = 0;
  bool zeroAllowed = false;
};

namespace knobs {
#define MERIDIAN_DECLARE_STRING_KNOB(id, name, def, doc) \
  inline constexpr KnobInfo id{name, KnobType::kString, def, "", doc};
#define MERIDIAN_DECLARE_INT_KNOB(id, name, def, min, max, doc) \
  inline constexpr KnobInfo id{name, KnobType::kInt, def, "", doc, min, max, false};
#define MERIDIAN_DECLARE_INT_OR_ZERO_KNOB(id, name, def, min, max, doc) \
  inline constexpr KnobInfo id{name, KnobType::kInt, def, "", doc, min, max, true};
#define MERIDIAN_DECLARE_CHOICE_KNOB(id, name, def, choices, doc) \
  inline constexpr KnobInfo id{name, KnobType::kChoice, def, choices, doc};
MERIDIAN_KNOBS(MERIDIAN_DECLARE_STRING_KNOB, MERIDIAN_DECLARE_INT_KNOB, MERIDIAN_DECLARE_INT_OR_ZERO_KNOB,
               MERIDIAN_DECLARE_CHOICE_KNOB)
#undef MERIDIAN_DECLARE_CHOICE_KNOB
#undef MERIDIAN_DECLARE_INT_OR_ZERO_KNOB
#undef MERIDIAN_DECLARE_INT_KNOB
#undef MERIDIAN_DECLARE_STRING_KNOB
}  // namespace knobs

// All knobs in declaration order.
std::span<const KnobInfo> allKnobs();

// The raw value: the environment variable when set and non-empty, else the default.
std::string knobString(const KnobInfo& knob);
// True when the variable is set in the environment (even to the default).
bool knobIsSet(const KnobInfo& knob);

// "a, b,c" -> {"a", "b", "c"} (blanks trimmed, empty items dropped); and back (list knobs
// such as MERIDIAN_PATHS).
std::vector<std::string> splitCommaList(const std::string& text);
std::string joinCommaList(const std::vector<std::string>& items);

// ---- Integers (k/m/g suffixes in powers of 1024) ----------------------------------------

// kInvalidArgument naming the variable and the allowed range when it is not an integer or
// outside the range its declaration allows (core/knob_list.h):
// "MERIDIAN_TCP_SOCKBUF_BYTES='1': not 0 or in [64k, 1g]". A caller that needs less passes
// [min, max]: the value must then be in both ranges.
Result<std::int64_t> readKnobInt(const KnobInfo& knob, std::int64_t min = INT64_MIN,
                                 std::int64_t max = INT64_MAX);
// The same; throws ConfigError with the same message.
std::int64_t knobInt(const KnobInfo& knob);
std::int64_t knobInt(const KnobInfo& knob, std::int64_t min, std::int64_t max);
// The range a kInt knob's declaration allows, as its messages and the README say it:
// "in [1, 16]", "0 or in [64k, 1g]" (byte knobs with k/m/g suffixes as parseByteSize reads them).
std::string knobRangeText(const KnobInfo& knob);

// Parses "123", "4k", "16M", "1g" (powers of 1024); kInvalidArgument naming `what`.
Result<std::int64_t> readByteSize(const std::string& text, const std::string& what);
// The same; throws ConfigError (command-line parsing).
std::int64_t parseByteSize(const std::string& text, const std::string& what);

// ---- Choices (enumerations) ------------------------------------------------------------

// A kChoice knob's allowed values, in declaration order.
std::vector<std::string> knobChoices(const KnobInfo& knob);
// The knob's value: `given` when not empty (an explicit option standing for the knob),
// else the environment variable, else the default. A value outside the allowed ones is
// kInvalidArgument: "MERIDIAN_ROUTING='adaptve': not one of adaptive, static".
Result<std::string> readKnobChoice(const KnobInfo& knob, std::string_view given = {});
// The same; throws ConfigError with the same message.
std::string knobChoice(const KnobInfo& knob, std::string_view given = {});

// "int in [1, 16]", "int, 0 or in [64k, 1g]", "string", or "one of `a`, `b`" (markdown).
std::string knobTypeName(const KnobInfo& knob);
// The README table (markdown), generated from the declarations.
std::string knobMarkdownTable();

}  // namespace meridian
