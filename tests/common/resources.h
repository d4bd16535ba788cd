// What tests that flood a server need from the process: more descriptors, its resident
// memory, how many of its connections the server closed, and a count of the log lines it
// printed. Header-only, for every test.
#pragma once

#include <poll.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>

#include "core/fd.h"
#include "core/log.h"

namespace meridian::testing {

// Raises RLIMIT_NOFILE to at least `wanted` (within the hard limit); false when it cannot.
inline bool raiseOpenFileLimit(rlim_t wanted) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  if (lim.rlim_cur >= wanted) return true;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < wanted) return false;
  lim.rlim_cur = wanted;
  return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
}

// This process's resident set (VmRSS of /proc/self/status), in bytes; 0 when unknown.
inline std::uint64_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmRSS:  1234 kB"
  }
  return 0;
}

// How many of `fds` (client ends) the server has closed: hung up, reset, or at EOF.
inline std::size_t closedByPeer(const std::vector<UniqueFd>& fds) {
  std::vector<pollfd> p;
  for (const UniqueFd& fd : fds) p.push_back(pollfd{fd.get(), POLLIN | POLLRDHUP, 0});
  if (::poll(p.data(), p.size(), 0) < 0) return 0;
  std::size_t closed = 0;
  for (const pollfd& x : p) closed += (x.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 ? 1 : 0;
  return closed;
}

// Counts the lines Meridian's logger prints while it lives (added as one more sink of the
// shared logger; create it before the threads whose lines it counts start).
class LogLineCounter {
 public:
  LogLineCounter() : sink_(std::make_shared<Sink>()) { log::logger().sinks().push_back(sink_); }
  ~LogLineCounter() {
    auto& sinks = log::logger().sinks();
    std::erase(sinks, sink_);
  }
  LogLineCounter(const LogLineCounter&) = delete;
  LogLineCounter& operator=(const LogLineCounter&) = delete;
  std::uint64_t lines() const { return sink_->lines.load(); }

 private:
  struct Sink final : spdlog::sinks::base_sink<std::mutex> {
    std::atomic<std::uint64_t> lines{0};
    void sink_it_(const spdlog::details::log_msg&) override { lines.fetch_add(1); }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
};

}  // namespace meridian::testing
