#include "lab/emulator.h"

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <array>
#include <memory>
#include <queue>

#include <fmt/format.h>

#include "core/log.h"

namespace meridian::lab {

namespace {

std::int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr std::size_t kMaxRequestBytes = 64 << 10;
constexpr std::int64_t kWakeEarlyNs = 60'000;  // timer wake-up ahead of a delivery, then spin
constexpr int kPacketsPerReadBurst = 64;  // per interface per wake-up: keeps interfaces fair

// epoll tags: interfaces are 0..ports-1; the rest are fixed.
constexpr std::uint64_t kTagTimer = ~0ull;
constexpr std::uint64_t kTagControl = ~0ull - 1;
constexpr std::uint64_t kTagSignal = ~0ull - 2;

}  // namespace

struct Emulator::Impl {
  struct Port {
    int node;
    int plane;
    UniqueFd fd;
  };
  struct Packet {
    std::int64_t deliverNs;
    std::uint64_t seq;
    int dstPort;
    std::uint32_t len;
    std::unique_ptr<std::uint8_t[]> data;
    bool operator>(const Packet& o) const {
      return deliverNs != o.deliverNs ? deliverNs > o.deliverNs : seq > o.seq;
    }
  };

  Topology topo;
  Topology original;  // what `restore` returns to
  std::vector<Port> ports;
  std::vector<std::vector<int>> portOf;  // [node][plane] -> index into ports
  std::vector<LinkModel> links;           // [plane][src region][dst region], flattened
  UniqueFd controlListen;
  UniqueFd epoll, timer, signals;
  std::priority_queue<Packet, std::vector<Packet>, std::greater<>> pending;
  std::vector<std::unique_ptr<std::uint8_t[]>> freeBuffers;  // each bufferBytes() long
  std::uint64_t heldBytes = 0;
  std::uint64_t seq = 0;
  std::int64_t armedNs = -1;
  std::atomic<bool> stop{false};
  EmulatorStats stats;
  std::int64_t startNs = monotonicNs();

  std::size_t linkIndex(int plane, int src, int dst) const {
    const std::size_t r = topo.regions.size();
    return (static_cast<std::size_t>(plane) * r + static_cast<std::size_t>(src)) * r + static_cast<std::size_t>(dst);
  }

  // The node a packet on `plane` is for, or -1.
  int routeOf(const std::uint8_t* p, std::size_t len, int plane) const {
    if (len < 20 || (p[0] >> 4) != 4) return -1;
    if (p[16] != 198 || p[17] != 18 || p[18] != static_cast<std::uint8_t>(plane)) return -1;
    int node = static_cast<int>(p[19]) - 1;
    return node >= 0 && node < static_cast<int>(topo.nodes.size()) ? node : -1;
  }

  void arm() {
    if (pending.empty()) {
      if (armedNs != -1) {
        itimerspec off{};
        ::timerfd_settime(timer.get(), 0, &off, nullptr);
        armedNs = -1;
      }
      return;
    }
    const std::int64_t due = pending.top().deliverNs;
    if (due == armedNs) return;
    itimerspec at{};
    // Wake a little early and spin the rest (deliverDue): waking from idle costs tens of
    // microseconds on a virtual machine, which would show as extra delay on short links.
    const std::int64_t when = std::max<std::int64_t>(due - kWakeEarlyNs, 1);
    at.it_value.tv_sec = when / 1'000'000'000;
    at.it_value.tv_nsec = when % 1'000'000'000;
    ::timerfd_settime(timer.get(), TFD_TIMER_ABSTIME, &at, nullptr);
    armedNs = due;
  }

  void deliverDue() {
    std::int64_t now = monotonicNs();
    if (!pending.empty() && pending.top().deliverNs > now && pending.top().deliverNs - now <= kWakeEarlyNs) {
      while ((now = monotonicNs()) < pending.top().deliverNs) {
      }
    }
    while (!pending.empty() && pending.top().deliverNs <= now) {
      // priority_queue::top is const: move the packet out through a const_cast, then pop.
      Packet pkt = std::move(const_cast<Packet&>(pending.top()));
      pending.pop();
      ssize_t n = ::write(ports[static_cast<std::size_t>(pkt.dstPort)].fd.get(), pkt.data.get(), pkt.len);
      const auto late = static_cast<std::uint64_t>(std::max<std::int64_t>(0, monotonicNs() - pkt.deliverNs));
      stats.lateSumNs += late;
      stats.lateMaxNs = std::max(stats.lateMaxNs, late);
      stats.lateOver100us += late > 100'000 ? 1 : 0;
      if (n == static_cast<ssize_t>(pkt.len)) {
        ++stats.packetsOut;
      } else {
        ++stats.writeErrors;
      }
      heldBytes -= bufferBytes();
      freeBuffers.push_back(std::move(pkt.data));
    }
  }

  std::size_t bufferBytes() const { return static_cast<std::size_t>(topo.mtu) + 64; }
  std::unique_ptr<std::uint8_t[]> takeBuffer() {
    if (!freeBuffers.empty()) {
      auto b = std::move(freeBuffers.back());
      freeBuffers.pop_back();
      return b;
    }
    return std::make_unique_for_overwrite<std::uint8_t[]>(bufferBytes());
  }

  void readPort(std::size_t portIdx) {
    Port& port = ports[portIdx];
    for (int i = 0; i < kPacketsPerReadBurst; ++i) {
      std::unique_ptr<std::uint8_t[]> buf = takeBuffer();
      ssize_t n = ::read(port.fd.get(), buf.get(), bufferBytes());
      if (n <= 0) {
        freeBuffers.push_back(std::move(buf));
        return;  // EAGAIN (drained) or an error on a device being torn down
      }
      const auto len = static_cast<std::size_t>(n);
      ++stats.packetsIn;
      stats.bytesIn += len;
      const int dst = routeOf(buf.get(), len, port.plane);
      if (dst < 0) {
        ++stats.unroutable;
        freeBuffers.push_back(std::move(buf));
        continue;
      }
      if (heldBytes + bufferBytes() > kEmulatorBufferBudgetBytes) {
        ++stats.overflowDrops;
        freeBuffers.push_back(std::move(buf));
        continue;
      }
      const int srcRegion = topo.nodes[static_cast<std::size_t>(port.node)].region;
      const int dstRegion = topo.nodes[static_cast<std::size_t>(dst)].region;
      auto when = links[linkIndex(port.plane, srcRegion, dstRegion)].admit(monotonicNs(), len);
      if (!when) {
        freeBuffers.push_back(std::move(buf));
        continue;
      }
      heldBytes += bufferBytes();
      pending.push(Packet{*when, seq++, portOf[static_cast<std::size_t>(dst)][static_cast<std::size_t>(port.plane)],
                          static_cast<std::uint32_t>(len), std::move(buf)});
    }
  }

  void serveControl() {
    UniqueFd c(::accept4(controlListen.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) return;
    // A local root tool on the other end; still, never let it stall forwarding for long.
    timeval tv{0, 200'000};
    if (::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        ::setsockopt(c.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
      // Without the timeouts a stuck client could stall forwarding: refuse it.
      MLOG_WARN(kLab, "emulator: control connection refused: SO_RCVTIMEO/SO_SNDTIMEO: {}", errnoText(errno));
      return;
    }
    std::string req;
    char buf[4096];
    while (req.find('\n') == std::string::npos && req.size() < kMaxRequestBytes) {
      ssize_t n = ::read(c.get(), buf, sizeof(buf));
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
    }
    nlohmann::json reply;
    auto parsed = nlohmann::json::parse(req, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      reply = {{"ok", false}, {"error", "the request is not a JSON object"}};
    } else {
      // A malformed request gets an error reply; it must never take the emulator down.
      try {
        reply = handleRequest(parsed);
      } catch (const nlohmann::json::exception& e) {
        reply = {{"ok", false}, {"error", fmt::format("malformed request: {}", e.what())}};
      }
    }
    std::string out = reply.dump() + "\n";
    std::size_t off = 0;
    while (off < out.size()) {
      ssize_t n = ::write(c.get(), out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
  }

  nlohmann::json linkJson(int plane, int src, int dst, std::int64_t now) const {
    const LinkModel& m = links[linkIndex(plane, src, dst)];
    const LinkParams& w = topo.link(plane, src, dst);
    const LinkCounters& c = m.counters();
    return {{"plane", topo.planes[static_cast<std::size_t>(plane)].name},
            {"src", topo.regions[static_cast<std::size_t>(src)].name},
            {"dst", topo.regions[static_cast<std::size_t>(dst)].name},
            {"delay_us", w.delayUs},
            {"jitter_us", w.jitterUs},
            {"rate_bps", w.rateBitsPerSec},
            {"queue_bytes", w.queueBytes},
            {"loss", w.loss},
            {"cut", w.cut},
            {"packets", c.packets},
            {"bytes", c.bytes},
            {"queue_drops", c.queueDrops},
            {"loss_drops", c.lossDrops},
            {"backlog_bytes", m.backlogBytes(now)},
            {"max_backlog_bytes", c.maxBacklogBytes}};
  }

  // Resolves plane/src/dst of a set or restore request into link indices.
  Result<std::vector<std::array<int, 3>>> targets(const nlohmann::json& r) const {
    auto str = [&](const char* k) -> Result<std::string> {
      auto it = r.find(k);
      if (it == r.end() || !it->is_string()) return invalidArgument("the request needs '{}'", k);
      return it->get<std::string>();
    };
    MERIDIAN_ASSIGN_OR_RETURN(std::string planeName, str("plane"));
    MERIDIAN_ASSIGN_OR_RETURN(std::string srcName, str("src"));
    MERIDIAN_ASSIGN_OR_RETURN(std::string dstName, str("dst"));
    MERIDIAN_ASSIGN_OR_RETURN(int plane, topo.findPlane(planeName));
    MERIDIAN_ASSIGN_OR_RETURN(int src, topo.findRegion(srcName));
    MERIDIAN_ASSIGN_OR_RETURN(int dst, topo.findRegion(dstName));
    std::vector<std::array<int, 3>> out{{plane, src, dst}};
    bool both = r.value("both", true);
    if (both && src != dst) out.push_back({plane, dst, src});
    return out;
  }

  void apply(int plane, int src, int dst) {
    links[linkIndex(plane, src, dst)].configure(scaled(topo.link(plane, src, dst), topo.timeScale), monotonicNs());
  }

  nlohmann::json handleRequest(const nlohmann::json& r) {
    if (!r.contains("cmd") || !r["cmd"].is_string()) return {{"ok", false}, {"error", "the request needs a 'cmd' string"}};
    if (r.contains("both") && !r["both"].is_boolean()) return {{"ok", false}, {"error", "'both' must be true or false"}};
    const std::string cmd = r["cmd"].get<std::string>();
    const std::int64_t now = monotonicNs();
    if (cmd == "status") {
      nlohmann::json j;
      j["ok"] = true;
      j["topology"] = topo.name;
      j["time_scale"] = topo.timeScale;
      j["uptime_s"] = static_cast<double>(now - startNs) * 1e-9;
      j["links"] = nlohmann::json::array();
      for (int p = 0; p < static_cast<int>(topo.planes.size()); ++p) {
        for (int s = 0; s < static_cast<int>(topo.regions.size()); ++s) {
          for (int d = 0; d < static_cast<int>(topo.regions.size()); ++d) j["links"].push_back(linkJson(p, s, d, now));
        }
      }
      rusage ru{};
      ::getrusage(RUSAGE_SELF, &ru);
      double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                   static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
      j["emulator"] = {{"packets_in", stats.packetsIn},       {"packets_out", stats.packetsOut},
                       {"bytes_in", stats.bytesIn},           {"unroutable", stats.unroutable},
                       {"overflow_drops", stats.overflowDrops}, {"write_errors", stats.writeErrors},
                       {"held_bytes", heldBytes},             {"cpu_s", cpu},
                       {"late_sum_us", static_cast<double>(stats.lateSumNs) * 1e-3},
                       {"late_max_us", static_cast<double>(stats.lateMaxNs) * 1e-3},
                       {"late_over_100us", stats.lateOver100us},
                       {"pid", ::getpid()}};
      return j;
    }
    if (cmd == "set" || cmd == "restore") {
      auto t = targets(r);
      if (!t.isOk()) return {{"ok", false}, {"error", t.status().message()}};
      LinkChange change;
      if (cmd == "set") {
        auto it = r.find("change");
        if (it == r.end() || !it->is_object()) return {{"ok", false}, {"error", "set needs a 'change' object"}};
        const auto& c = *it;
        for (const auto& [key, value] : c.items()) {
          if (key == "cut") {
            if (!value.is_boolean()) return {{"ok", false}, {"error", "cut must be true or false"}};
            change.cut = value.get<bool>();
            continue;
          }
          if (!value.is_number() || !(value.get<double>() >= 0)) {
            return {{"ok", false}, {"error", fmt::format("'{}' must be a number >= 0", key)}};
          }
          const double v = value.get<double>();
          auto outOfRange = [&](double limit) {
            return nlohmann::json{{"ok", false}, {"error", fmt::format("'{}' must be at most {}", key, limit)}};
          };
          if (key == "delay_us") {
            if (v > kMaxLinkDelayUs) return outOfRange(kMaxLinkDelayUs);
            change.delayUs = v;
          } else if (key == "jitter_us") {
            if (v > kMaxLinkDelayUs) return outOfRange(kMaxLinkDelayUs);
            change.jitterUs = v;
          } else if (key == "rate_bps") {
            if (v > kMaxRateBitsPerSec) return outOfRange(kMaxRateBitsPerSec);
            if (v > 0 && v < 1) return {{"ok", false}, {"error", "rate_bps must be 0 (unlimited) or at least 1"}};
            change.rateBitsPerSec = v;
          } else if (key == "queue_bytes") {
            if (v > static_cast<double>(kMaxQueueBytes)) return outOfRange(static_cast<double>(kMaxQueueBytes));
            change.queueBytes = static_cast<std::uint64_t>(v);
          } else if (key == "loss") {
            if (v > 1) return {{"ok", false}, {"error", "loss must be within 0..1"}};
            change.loss = v;
          } else {
            return {{"ok", false}, {"error", fmt::format("unknown link setting '{}'", key)}};
          }
        }
      }
      nlohmann::json changed = nlohmann::json::array();
      for (const auto& [p, s, d] : t.value()) {
        topo.link(p, s, d) = cmd == "set" ? change.applyTo(topo.link(p, s, d)) : original.link(p, s, d);
        apply(p, s, d);
        changed.push_back(linkJson(p, s, d, now));
      }
      return {{"ok", true}, {"links", changed}};
    }
    if (cmd == "shutdown") {
      stop = true;
      return {{"ok", true}};
    }
    return {{"ok", false}, {"error", fmt::format("unknown command '{}'", cmd)}};
  }
};

Emulator::Emulator(Topology topology, std::vector<std::vector<UniqueFd>> tuns, UniqueFd controlListen)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.topo = std::move(topology);
  m.original = m.topo;
  m.controlListen = std::move(controlListen);
  m.portOf.assign(m.topo.nodes.size(), std::vector<int>(m.topo.planes.size(), -1));
  for (std::size_t n = 0; n < tuns.size(); ++n) {
    for (std::size_t p = 0; p < tuns[n].size(); ++p) {
      m.portOf[n][p] = static_cast<int>(m.ports.size());
      m.ports.push_back({static_cast<int>(n), static_cast<int>(p), std::move(tuns[n][p])});
    }
  }
  std::uint64_t seed = 0x6d657269;
  for (int p = 0; p < static_cast<int>(m.topo.planes.size()); ++p) {
    for (int s = 0; s < static_cast<int>(m.topo.regions.size()); ++s) {
      for (int d = 0; d < static_cast<int>(m.topo.regions.size()); ++d) {
        m.links.emplace_back(scaled(m.topo.link(p, s, d), m.topo.timeScale), seed++);
      }
    }
  }
}

Emulator::~Emulator() = default;

void Emulator::requestStop() { impl_->stop = true; }

nlohmann::json Emulator::handle(const nlohmann::json& request) { return impl_->handleRequest(request); }

Status Emulator::prepare(bool handleSignals) {
  Impl& m = *impl_;
  if (m.epoll.valid()) return Status::ok();
  // Timer slack decides how late a timerfd may fire; the default 50 us is a quarter of the
  // delay error the lab allows.
  if (::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) != 0) {
    MLOG_WARN(kLab, "emulator: cannot set the timer slack to 1 ns ({}): delays may run up to 50 us late",
              errnoText(errno));
  }
  m.epoll.reset(::epoll_create1(EPOLL_CLOEXEC));
  m.timer.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!m.epoll.valid() || !m.timer.valid()) return internalError("emulator: epoll/timerfd: {}", std::strerror(errno));
  auto add = [&](int fd, std::uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    return ::epoll_ctl(m.epoll.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
  };
  for (std::size_t i = 0; i < m.ports.size(); ++i) {
    if (!add(m.ports[i].fd.get(), i)) return internalError("emulator: epoll_ctl: {}", std::strerror(errno));
  }
  add(m.timer.get(), kTagTimer);
  if (m.controlListen.valid()) add(m.controlListen.get(), kTagControl);
  if (handleSignals) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    ::sigprocmask(SIG_BLOCK, &set, nullptr);
    m.signals.reset(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
    if (m.signals.valid()) add(m.signals.get(), kTagSignal);
  }
  return Status::ok();
}

Status Emulator::run(bool handleSignals) {
  MERIDIAN_RETURN_IF_ERROR(prepare(handleSignals));
  Impl& m = *impl_;
  epoll_event events[64];
  while (!m.stop) {
    // The stop flag may be set from another thread (tests): wake up now and then.
    int n = ::epoll_wait(m.epoll.get(), events, 64, 200);
    if (n < 0) {
      if (errno == EINTR) continue;
      return internalError("emulator: epoll_wait: {}", std::strerror(errno));
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = events[i].data.u64;
      if (tag == kTagTimer) {
        std::uint64_t expirations;
        [[maybe_unused]] ssize_t r = ::read(m.timer.get(), &expirations, sizeof(expirations));
        m.armedNs = -1;
      } else if (tag == kTagControl) {
        m.serveControl();
      } else if (tag == kTagSignal) {
        m.stop = true;
      } else {
        m.readPort(static_cast<std::size_t>(tag));
      }
    }
    m.deliverDue();
    m.arm();
  }
  return Status::ok();
}

Result<nlohmann::json> controlRequest(const std::string& socketPath, const nlohmann::json& request, int timeoutMs) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof(addr.sun_path)) return invalidArgument("control socket path too long: {}", socketPath);
  std::memcpy(addr.sun_path, socketPath.c_str(), socketPath.size());
  timeval tv{timeoutMs / 1000, (timeoutMs % 1000) * 1000};
  if (!fd.valid() || ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return internalError("control socket for {}: {}", socketPath, errnoText(errno));
  }
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return peerError("the lab's emulator does not answer on {} ({}): is the lab up?", socketPath, std::strerror(errno));
  }
  std::string out = request.dump() + "\n";
  if (::write(fd.get(), out.data(), out.size()) != static_cast<ssize_t>(out.size())) {
    return peerError("cannot send to the emulator on {}: {}", socketPath, std::strerror(errno));
  }
  std::string reply;
  char buf[8192];
  while (reply.find('\n') == std::string::npos) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (reply.size() > (64u << 20)) return peerError("the emulator's reply is too long");
    reply.append(buf, static_cast<std::size_t>(n));
  }
  auto j = nlohmann::json::parse(reply, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return peerError("no valid reply from the emulator on {}", socketPath);
  if (!j.value("ok", false)) return invalidArgument("{}", j.value("error", std::string("the emulator refused")));
  return j;
}

}  // namespace meridian::lab
