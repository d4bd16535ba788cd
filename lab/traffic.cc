#include "lab/traffic.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lab/netns.h"

namespace meridian::lab {

Result<int> nodeOrRegion(const Topology& t, const std::string& name) {
  auto node = t.findNode(name);
  if (node.isOk()) return node;
  auto region = t.findRegion(name);
  if (!region.isOk()) return invalidArgument("'{}' is neither a node nor a region of this lab", name);
  for (const Node& n : t.nodes) {
    if (n.region == region.value()) return n.index;
  }
  return invalidArgument("region '{}' has no nodes", name);
}

Result<CrossTrafficResult> runCrossTraffic(const LabState& lab, const CrossTrafficOptions& o,
                                           const std::atomic<bool>* stop) {
  const Topology& t = lab.topology;
  MERIDIAN_ASSIGN_OR_RETURN(int plane, t.findPlane(o.plane));
  MERIDIAN_ASSIGN_OR_RETURN(int src, nodeOrRegion(t, o.src));
  MERIDIAN_ASSIGN_OR_RETURN(int dst, nodeOrRegion(t, o.dst));
  if (src == dst) return invalidArgument("cross-traffic from {} to itself never crosses a link", o.src);
  if (!(o.rateBitsPerSec > 0)) return invalidArgument("cross-traffic needs --rate > 0");
  const std::size_t bytes =
      o.datagramBytes > 0 ? o.datagramBytes : static_cast<std::size_t>(t.mtu) - 28;  // IPv4 + UDP headers
  if (bytes < 16 || bytes > 65000) return invalidArgument("datagram size {} is out of range 16..65000", bytes);

  const std::string dstAddr = t.address(plane, dst);
  MERIDIAN_ASSIGN_OR_RETURN(UniqueFd sink, socketIn(lab.namespaceOf(dst), AF_INET, SOCK_DGRAM));
  sockaddr_in bindTo = ipv4Address(dstAddr, 0);
  socklen_t len = sizeof(bindTo);
  if (::bind(sink.get(), reinterpret_cast<sockaddr*>(&bindTo), sizeof(bindTo)) != 0 ||
      ::getsockname(sink.get(), reinterpret_cast<sockaddr*>(&bindTo), &len) != 0) {
    return internalError("cross-traffic sink on {}: {}", dstAddr, std::strerror(errno));
  }
  timeval tv{0, 100'000};
  if (::setsockopt(sink.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    return internalError("cross-traffic sink on {}: SO_RCVTIMEO: {}", dstAddr, errnoText(errno));
  }
  MERIDIAN_ASSIGN_OR_RETURN(UniqueFd sender, socketIn(lab.namespaceOf(src), AF_INET, SOCK_DGRAM));
  sockaddr_in from = ipv4Address(t.address(plane, src), 0);
  if (::bind(sender.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(sender.get(), reinterpret_cast<sockaddr*>(&bindTo), sizeof(bindTo)) != 0) {
    return internalError("cross-traffic sender {} -> {}: {}", t.address(plane, src), dstAddr, std::strerror(errno));
  }

  CrossTrafficResult result;
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> received{0};
  std::thread drain([&] {
    std::vector<char> buf(65536);
    while (!done.load(std::memory_order_relaxed)) {
      ssize_t n = ::recv(sink.get(), buf.data(), buf.size(), 0);
      if (n > 0) received.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    }
  });
  std::vector<char> payload(bytes, 'x');
  const auto start = std::chrono::steady_clock::now();
  const double interval = static_cast<double>(bytes) * 8.0 / o.rateBitsPerSec;  // seconds per datagram
  std::uint64_t sent = 0;
  for (std::uint64_t i = 0;; ++i) {
    const double due = static_cast<double>(i) * interval;
    if (o.durationSec > 0 && due >= o.durationSec) break;
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) break;
    // Absolute pacing: a late wake-up sends what is due at once, so the average rate holds.
    auto dueAt = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(due));
    if (dueAt > std::chrono::steady_clock::now()) std::this_thread::sleep_until(dueAt);
    if (::send(sender.get(), payload.data(), payload.size(), 0) > 0) sent += bytes;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // What is still in flight through the emulator arrives within the link's delay.
  const auto& l = t.link(plane, t.nodes[static_cast<std::size_t>(src)].region, t.nodes[static_cast<std::size_t>(dst)].region);
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(l.delayUs * t.timeScale * 2 + 50'000)));
  done = true;
  drain.join();
  result.sentBytes = sent;
  result.receivedBytes = received.load();
  if (!o.quiet) {
    double secs = result.seconds > 0 ? result.seconds : 1;
    std::printf("cross-traffic %s %s -> %s: sent %.1f Mbit/s, received %.1f Mbit/s over %.1f s (%.1f%% lost)\n",
                o.plane.c_str(), t.nodes[static_cast<std::size_t>(src)].name.c_str(),
                t.nodes[static_cast<std::size_t>(dst)].name.c_str(), static_cast<double>(sent) * 8e-6 / secs,
                static_cast<double>(result.receivedBytes) * 8e-6 / secs, result.seconds,
                sent > 0 ? 100.0 * (1.0 - static_cast<double>(result.receivedBytes) / static_cast<double>(sent)) : 0.0);
    std::fflush(stdout);
  }
  return result;
}

}  // namespace meridian::lab
