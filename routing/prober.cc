#include "routing/prober.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/check.h"
#include "core/clock.h"
#include "core/fd.h"
#include "core/host_port.h"
#include "core/log.h"
#include "core/metrics.h"
#include "routing/probe_wire.h"

namespace meridian::routing {

namespace {

constexpr std::int64_t kMinRttWindowUs = 120'000'000;  // 2 minutes

Result<sockaddr_in> parseEndpoint(const std::string& text) {
  auto hp = splitHostPort(text);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (!hp.isOk() || hp->port == 0 || ::inet_pton(AF_INET, hp->host.c_str(), &a.sin_addr) != 1) {
    return invalidArgument("probe endpoint '{}' is not ip:port", text);
  }
  a.sin_port = htons(hp->port);
  return a;
}

std::string endpointText(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(a.sin_port));
}

}  // namespace

struct Prober::Impl {
  struct PathState {
    sockaddr_in remote{};
    std::string remoteText;
    // A long minimum-RTT window: congestion that lasts longer than the window would raise
    // the minimum to the queued round trip and look like no queueing at all.
    PathEstimator estimator{kMinRttWindowUs};
    std::uint64_t nextSeq = 1;
    Gauge* rtt = nullptr;
    Gauge* minRtt = nullptr;
    Gauge* jitter = nullptr;
    Gauge* loss = nullptr;
  };
  struct Peer {
    std::vector<std::unique_ptr<PathState>> paths;
  };

  ProberOptions options;
  const TimeSource* clock = &steadyTime();  // options.clock when given
  ProbeKey key{};
  std::vector<UniqueFd> sockets;  // one per local path
  std::vector<std::string> localEndpoints;
  mutable std::mutex mu;  // guards peers and counters
  std::map<int, Peer> peers;
  ProberCounters counters;
  std::atomic<bool> stop{false};
  UniqueFd wakeRead, wakeWrite;
  std::thread thread;

  void sendRound(std::int64_t now) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [rank, peer] : peers) {
      for (std::size_t p = 0; p < peer.paths.size(); ++p) {
        PathState& ps = *peer.paths[p];
        ps.estimator.expire(now, options.echoTimeout.count() * 1000);
        ProbeMessage m;
        m.type = ProbeType::kRequest;
        m.path = static_cast<std::uint16_t>(p);
        m.sessionId = options.sessionId;
        m.senderRank = options.selfRank;
        m.targetRank = rank;
        m.seq = ps.nextSeq++;
        m.sendTimeUs = now;
        auto bytes = encodeProbe(m, key);
        ps.estimator.onProbeSent(m.seq, now);
        // A probe the kernel will not take (a full buffer, a path that is down) is a lost
        // probe: the estimator counts it as one when its echo never comes.
        (void)::sendto(sockets[p].get(), bytes.data(), bytes.size(), MSG_DONTWAIT,
                       reinterpret_cast<sockaddr*>(&ps.remote), sizeof(ps.remote));
        ++counters.sent;
        publish(ps, now);
      }
    }
  }

  void publish(PathState& ps, std::int64_t now) {
    PathFigures f = ps.estimator.figures(now);
    if (!f.valid) return;
    ps.rtt->set(f.srttUs * 1e-6);
    ps.minRtt->set(f.minRttUs * 1e-6);
    ps.jitter->set(f.jitterUs * 1e-6);
    ps.loss->set(f.loss);
  }

  // Returns how many datagrams it read.
  std::size_t receive(std::size_t path) {
    std::size_t read = 0;
    for (;;) {
      std::uint8_t buf[kProbeBytes + 1];
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      ssize_t n = ::recvfrom(sockets[path].get(), buf, sizeof(buf), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) return read;
      ++read;
      const std::int64_t now = clock->nowUs();
      auto m = decodeProbe(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)), key);
      std::lock_guard<std::mutex> lock(mu);
      if (!m.isOk() || m->sessionId != options.sessionId) {
        if (counters.rejected++ < 3) {
          MLOG_WARN(kRouting, "{}: dropped a probe from {}: {}", options.name, endpointText(from),
                    m.isOk() ? std::string("another session") : m.status().message());
        }
        continue;
      }
      if (m->type == ProbeType::kRequest) {
        if (m->targetRank != options.selfRank) {
          ++counters.rejected;
          continue;
        }
        ProbeMessage echo = m.value();
        echo.type = ProbeType::kEcho;
        auto bytes = encodeProbe(echo, key);
        // An echo that cannot be sent is a lost probe to the peer, which counts it so.
        (void)::sendto(sockets[path].get(), bytes.data(), bytes.size(), MSG_DONTWAIT,
                       reinterpret_cast<sockaddr*>(&from), len);
        ++counters.echoed;
        continue;
      }
      // An echo of our request: it names us as sender and the peer as target.
      auto peer = peers.find(m->targetRank);
      if (m->senderRank != options.selfRank || peer == peers.end() || m->path >= peer->second.paths.size() ||
          m->path != path) {
        ++counters.rejected;
        continue;
      }
      PathState& ps = *peer->second.paths[m->path];
      if (ps.estimator.onEcho(m->seq, now)) {
        ++counters.echoes;
        publish(ps, now);
      }
    }
  }

  void run() {
    pthread_setname_np(pthread_self(), fmt::format("mer-probe-{}", options.selfRank).substr(0, 15).c_str());
    // Nothing leaves this thread: a broken invariant stops probing (the paths then look
    // lost to routing), not the process.
    try {
      loop();
    } catch (const std::exception& e) {
      MLOG_ERROR(kRouting, "{}: probing stopped: {}", options.name, e.what());
    }
  }

  void loop() {
    std::vector<pollfd> fds;
    for (const auto& s : sockets) fds.push_back({s.get(), POLLIN, 0});
    fds.push_back({wakeRead.get(), POLLIN, 0});
    const std::int64_t intervalUs = options.interval.count() * 1000;
    std::int64_t next = clock->nowUs();
    while (!stop.load(std::memory_order_relaxed)) {
      std::int64_t now = clock->nowUs();
      if (now >= next) {
        sendRound(now);
        // Keep the period even when a round ran late, without bursting to catch up.
        next = std::max(next + intervalUs, now + intervalUs / 2);
      }
      int waitMs = static_cast<int>(std::max<std::int64_t>(0, (next - clock->nowUs() + 999) / 1000));
      if (::poll(fds.data(), fds.size(), waitMs) <= 0) continue;
      for (std::size_t i = 0; i < sockets.size(); ++i) {
        if (fds[i].revents & POLLIN) receive(i);
      }
    }
  }
};

Prober::Prober(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Prober>> Prober::create(ProberOptions options) {
  if (options.localAddresses.empty()) return invalidArgument("the prober needs at least one local address");
  if (options.localAddresses.size() > 64) return invalidArgument("at most 64 probe paths");
  if (options.interval < std::chrono::milliseconds(1)) return invalidArgument("probe interval must be at least 1 ms");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (impl->options.clock) impl->clock = impl->options.clock.get();
  impl->key = probeKey(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(impl->options.secret.data()),
                                                    impl->options.secret.size()));
  for (const auto& addr : impl->options.localAddresses) {
    UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return internalError("probe socket: {}", std::strerror(errno));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (::inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1) return invalidArgument("bad probe address '{}'", addr);
    socklen_t len = sizeof(a);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return invalidArgument("cannot bind a probe socket to {}: {}", addr, std::strerror(errno));
    }
    impl->localEndpoints.push_back(endpointText(a));
    impl->sockets.push_back(std::move(fd));
  }
  int pipeFds[2];
  if (::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) != 0) return internalError("pipe: {}", std::strerror(errno));
  impl->wakeRead.reset(pipeFds[0]);
  impl->wakeWrite.reset(pipeFds[1]);
  Impl* raw = impl.get();
  if (impl->options.startThread) impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Prober>(new Prober(std::move(impl)));
}

Prober::~Prober() {
  impl_->stop = true;
  char c = 1;
  [[maybe_unused]] ssize_t w = ::write(impl_->wakeWrite.get(), &c, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::vector<std::string> Prober::endpoints() const { return impl_->localEndpoints; }

Status Prober::setPeer(int rank, const std::vector<std::string>& endpoints) {
  if (rank == impl_->options.selfRank) return invalidArgument("a prober does not probe its own rank");
  if (endpoints.empty()) return invalidArgument("rank {} published no probe endpoints", rank);
  Impl::Peer peer;
  const std::size_t n = std::min(endpoints.size(), impl_->sockets.size());
  auto& reg = MetricsRegistry::global();
  for (std::size_t p = 0; p < n; ++p) {
    MERIDIAN_ASSIGN_OR_RETURN(sockaddr_in remote, parseEndpoint(endpoints[p]));
    auto ps = std::make_unique<Impl::PathState>();
    ps->remote = remote;
    ps->remoteText = endpoints[p];
    MetricLabels labels{{"peer", std::to_string(rank)}, {"path", std::to_string(p)}, {"prober", impl_->options.name}};
    ps->rtt = &reg.gauge("meridian_routing_path_rtt_seconds", "Smoothed round-trip time of a path (probes)", labels);
    ps->minRtt = &reg.gauge("meridian_routing_path_min_rtt_seconds", "Lowest round trip of a path in the window", labels);
    ps->jitter = &reg.gauge("meridian_routing_path_jitter_seconds", "Round-trip variation of a path (probes)", labels);
    ps->loss = &reg.gauge("meridian_routing_path_loss_ratio", "Share of probes without an echo (0..1)", labels);
    peer.paths.push_back(std::move(ps));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->peers[rank] = std::move(peer);
  return Status::ok();
}

std::vector<ProbeRow> Prober::snapshot() const {
  const std::int64_t now = impl_->clock->nowUs();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<ProbeRow> rows;
  for (const auto& [rank, peer] : impl_->peers) {
    for (std::size_t p = 0; p < peer.paths.size(); ++p) {
      rows.push_back({rank, static_cast<int>(p), impl_->options.localAddresses[p], peer.paths[p]->remoteText,
                      peer.paths[p]->estimator.figures(now)});
    }
  }
  return rows;
}

ProberCounters Prober::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counters;
}

void Prober::probeRound() {
  MERIDIAN_CHECK(!impl_->options.startThread);
  impl_->sendRound(impl_->clock->nowUs());
}

std::size_t Prober::drainSockets() {
  MERIDIAN_CHECK(!impl_->options.startThread);
  std::size_t read = 0;
  for (std::size_t p = 0; p < impl_->sockets.size(); ++p) read += impl_->receive(p);
  return read;
}

}  // namespace meridian::routing
