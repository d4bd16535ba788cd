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
};

namespace knobs {
#define MERIDIAN_KNOB_TYPE_Int KnobType::kInt
#define MERIDIAN_KNOB_TYPE_String KnobType::kString
#define MERIDIAN_DECLARE_KNOB(id, name, type, def, doc) \
  inline constexpr KnobInfo id{name, MERIDIAN_KNOB_TYPE_##type, def, "", doc};
#define MERIDIAN_DECLARE_CHOICE_KNOB(id, name, def, choices, doc) \
  inline constexpr KnobInfo id{name, KnobType::kChoice, def, choices, doc};
MERIDIAN_KNOBS(MERIDIAN_DECLARE_KNOB, MERIDIAN_DECLARE_CHOICE_KNOB)
#undef MERIDIAN_DECLARE_CHOICE_KNOB
#undef MERIDIAN_DECLARE_KNOB
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

// kInvalidArgument naming the variable when it is not an integer or not in [min, max].
Result<std::int64_t> readKnobInt(const KnobInfo& knob, std::int64_t min = INT64_MIN,
                                 std::int64_t max = INT64_MAX);
// The same; throws ConfigError with the same message.
std::int64_t knobInt(const KnobInfo& knob);
std::int64_t knobInt(const KnobInfo& knob, std::int64_t min, std::int64_t max);

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

// "int", "string", or "one of `a`, `b`" (markdown).
std::string knobTypeName(const KnobInfo& knob);
// The README table (markdown), generated from the declarations.
std::string knobMarkdownTable();

}  // namespace meridian
