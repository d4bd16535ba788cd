// A flood of idle connections, as an attacker without the secret would open them. Header-only,
// for tests that link the transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "core/fd.h"
#include "tests/common/poll.h"
#include "tests/common/resources.h"
#include "transport/tcp/socket.h"

namespace meridian::testing {

// Opens `count` connections from `localIp` to `target` that never say a word, `batch` at a
// time; after each batch waits (up to `timeout` in all) until the server has closed all but
// `keep` of them, so the flood stays within the listen backlog (beyond it the kernel, not the
// server, would drop connections). Fewer than `count` come back when a connect fails or the
// server falls behind; callers check the size.
inline std::vector<UniqueFd> floodIdleConnections(const HostPort& target, const char* localIp, std::size_t count,
                                                  std::size_t keep, std::size_t batch = 256,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const TimePoint deadline = Clock::now() + timeout;
  std::vector<UniqueFd> flood;
  while (flood.size() < count) {
    for (std::size_t i = 0; i < batch && flood.size() < count; ++i) {
      auto fd = transport::tcp::startConnect(target, localIp);
      if (!fd) return flood;
      flood.push_back(std::move(fd).value());
    }
    const std::size_t due = flood.size() > keep ? flood.size() - keep : 0;
    if (!pollUntil([&] { return closedByPeer(flood) >= due; }, deadline, std::chrono::milliseconds(10))) return flood;
  }
  return flood;
}

}  // namespace meridian::testing
