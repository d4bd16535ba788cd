// Logging with subsystems, on spdlog. Level and subsystem filter come from MERIDIAN_LOG
// ("info", "debug:transport,collectives"); messages go to stderr with rank and subsystem.
// Thread-safe; cheap when the level is filtered out.
#pragma once

#include <cstdint>
#include <string_view>

#include <spdlog/spdlog.h>

namespace meridian {

enum class Subsys : std::uint8_t {
  kCore, kTransport, kRouting, kCollectives, kKernels, kTrainer, kMonitoring, kLab, kBench, kPlugin,
  kCount
};

std::string_view toString(Subsys s);

namespace log {

// The shared logger (created on first use from MERIDIAN_LOG).
spdlog::logger& logger();
// True when messages of `level` from `subsys` are printed.
bool enabled(Subsys subsys, spdlog::level::level_enum level);
// Re-reads MERIDIAN_LOG (tests use this after setenv). Throws ConfigError on a bad value.
void configureFromEnv();
// Adds "[rank N]" to every line from now on.
void setRank(int rank);

}  // namespace log
}  // namespace meridian

#define MERIDIAN_LOG_AT(subsys, lvl, ...)                                                 \
  do {                                                                                    \
    if (::meridian::log::enabled(subsys, lvl))                                            \
      ::meridian::log::logger().log(lvl, "[{}] {}", ::meridian::toString(subsys),         \
                                    fmt::format(__VA_ARGS__));                            \
  } while (0)

#define MLOG_TRACE(subsys, ...) MERIDIAN_LOG_AT(::meridian::Subsys::subsys, spdlog::level::trace, __VA_ARGS__)
#define MLOG_DEBUG(subsys, ...) MERIDIAN_LOG_AT(::meridian::Subsys::subsys, spdlog::level::debug, __VA_ARGS__)
#define MLOG_INFO(subsys, ...) MERIDIAN_LOG_AT(::meridian::Subsys::subsys, spdlog::level::info, __VA_ARGS__)
#define MLOG_WARN(subsys, ...) MERIDIAN_LOG_AT(::meridian::Subsys::subsys, spdlog::level::warn, __VA_ARGS__)
#define MLOG_ERROR(subsys, ...) MERIDIAN_LOG_AT(::meridian::Subsys::subsys, spdlog::level::err, __VA_ARGS__)
