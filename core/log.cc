// Logger set-up and the MERIDIAN_LOG parser.
#include "core/log.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/knobs.h"

namespace meridian {

namespace {
constexpr std::array<std::string_view, static_cast<size_t>(Subsys::kCount)> kSubsysNames = {
    "core", "transport", "routing", "collectives", "kernels", "trainer", "monitoring", "lab", "bench",
    "plugin"};

std::atomic<int> gLevel{spdlog::level::warn};
std::atomic<std::uint32_t> gMask{~0u};
std::once_flag gInitOnce;

std::shared_ptr<spdlog::logger> makeLogger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto lg = std::make_shared<spdlog::logger>("meridian", sink);
  lg->set_pattern("%^[%H:%M:%S.%e] [meridian] [%l]%$ %v");
  lg->set_level(spdlog::level::trace);  // filtering happens in enabled()
  lg->flush_on(spdlog::level::warn);
  return lg;
}

std::shared_ptr<spdlog::logger>& loggerPtr() {
  static std::shared_ptr<spdlog::logger> lg = makeLogger();
  return lg;
}
}  // namespace

std::string_view toString(Subsys s) {
  auto i = static_cast<size_t>(s);
  return i < kSubsysNames.size() ? kSubsysNames[i] : "?";
}

namespace log {

void configureFromEnv() {
  std::string spec = knobString(knobs::kLog);
  std::string levelText = spec;
  std::uint32_t mask = ~0u;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    levelText = spec.substr(0, colon);
    mask = 0;
    std::string rest = spec.substr(colon + 1);
    size_t start = 0;
    while (start <= rest.size()) {
      size_t comma = rest.find(',', start);
      std::string name = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      bool found = false;
      for (size_t i = 0; i < kSubsysNames.size(); ++i) {
        if (kSubsysNames[i] == name) {
          mask |= 1u << i;
          found = true;
        }
      }
      if (!found) throw ConfigError("MERIDIAN_LOG: unknown subsystem '" + name + "' in '" + spec + "'");
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  auto level = spdlog::level::from_str(levelText);
  if (level == spdlog::level::off && levelText != "off") {
    throw ConfigError("MERIDIAN_LOG: unknown level '" + levelText +
                      "' (expected trace, debug, info, warn, error or off)");
  }
  gLevel.store(level, std::memory_order_relaxed);
  gMask.store(mask, std::memory_order_relaxed);
}

spdlog::logger& logger() { return *loggerPtr(); }

bool enabled(Subsys subsys, spdlog::level::level_enum level) {
  std::call_once(gInitOnce, [] {
    try {
      configureFromEnv();
    } catch (const ConfigError& e) {
      loggerPtr()->error("{} (using warn)", e.what());
    }
  });
  return level >= gLevel.load(std::memory_order_relaxed) &&
         (gMask.load(std::memory_order_relaxed) >> static_cast<unsigned>(subsys) & 1u) != 0;
}

void setRank(int rank) {
  loggerPtr()->set_pattern(fmt::format("%^[%H:%M:%S.%e] [meridian] [rank {}] [%l]%$ %v", rank));
}

}  // namespace log
}  // namespace meridian
