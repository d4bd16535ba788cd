// The bootstrap store's server: one epoll loop over the listening socket and every
// connection, from the handshake (caps and deadlines before authentication) to requests in
// sealed records (size checks, the budget, parked GET/WAIT, idle connections).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "bootstrap/store.h"
#include "bootstrap/store_detail.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/log_limit.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace tcp = transport::tcp;

namespace {

using detail::printable;

// Timeouts longer than this (~35 years) mean "no deadline".
constexpr std::uint64_t kMaxFiniteTimeoutMs = std::uint64_t{1} << 40;
// How long a stopping server waits for replies already queued (~StoreServer).
constexpr std::chrono::milliseconds kDrainTimeout{2000};
// A SET's value is reserved up to this much when its bytes start; beyond, it grows as they come.
constexpr std::size_t kValueReserveBytes = 256 * 1024;
// Raw bytes read from one connection per turn, so one busy client cannot starve the others.
constexpr std::size_t kReadTurnBytes = 1 << 20;
// How long an idle connection's goodbye may take to leave before the socket is simply closed.
constexpr std::chrono::milliseconds kGoodbyeTimeout{5000};
// The loop wakes at least this often (timers are checked then).
constexpr int kMaxSleepMs = 1000;

TimePoint deadlineFromTimeoutMs(std::uint64_t timeoutMs) {
  if (timeoutMs >= kMaxFiniteTimeoutMs) return TimePoint::max();
  return Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(timeoutMs));
}

// Runs one request against the state (GET and WAIT: with their timeoutMs as the deadline); the answer carries any error for the client.
StoreResponse execute(StoreState& state, const StoreRequest& request) {
  StoreResponse response;
  response.op = request.op;
  switch (request.op) {
    case StoreOp::kSet:
      response.status = state.set(request.keys[0], request.value);
      break;
    case StoreOp::kGet: {
      auto value = state.get(request.keys[0], deadlineFromTimeoutMs(request.timeoutMs));
      if (value) {
        response.value = std::move(value).value();
      } else {
        response.status = value.status();
      }
      break;
    }
    case StoreOp::kWait:
      response.status = state.wait(request.keys, deadlineFromTimeoutMs(request.timeoutMs));
      break;
    case StoreOp::kGetMany: {
      auto values = state.getMany(request.keys, deadlineFromTimeoutMs(request.timeoutMs));
      std::size_t bytes = 0;
      if (values) {
        for (const auto& v : values.value()) bytes += 4 + v.size();
      }
      if (!values) {
        response.status = values.status();
      } else if (bytes > kStoreMaxValueBytes) {
        response.status = invalidArgument("store GET-MANY: {} values of {} bytes in all exceed one answer's limit of {}",
                                          values->size(), bytes, kStoreMaxValueBytes);
      } else {
        response.values = std::move(values).value();
      }
      break;
    }
    case StoreOp::kAdd: {
      auto sum = state.add(request.keys[0], request.delta);
      if (sum) {
        response.number = sum.value();
      } else {
        response.status = sum.status();
      }
      break;
    }
    case StoreOp::kIdleClose:  // never decoded from a request
      response.status = invalidArgument("store: {} is not a request", toString(request.op));
      break;
    case StoreOp::kCheck:
    case StoreOp::kDelete: {
      auto yes = request.op == StoreOp::kCheck ? state.check(request.keys) : state.del(request.keys[0]);
      if (yes) {
        response.number = yes.value() ? 1 : 0;
      } else {
        response.status = yes.status();
      }
      break;
    }
  }
  return response;
}


// Why `fd` cannot be a store's listening socket on `expectedPort` (0: any), or "" when it can.
std::string whyNotAListeningTcpSocket(int fd, std::uint16_t expectedPort) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fmt::format("descriptor {} is not open: {}", fd, errnoText(errno));
  if (!S_ISSOCK(st.st_mode)) return fmt::format("descriptor {} is not a socket", fd);
  auto option = [fd](int name) {
    int value = -1;
    socklen_t len = sizeof value;
    return ::getsockopt(fd, SOL_SOCKET, name, &value, &len) == 0 ? value : -1;
  };
  if (option(SO_DOMAIN) != AF_INET || option(SO_TYPE) != SOCK_STREAM || option(SO_PROTOCOL) != IPPROTO_TCP) {
    return fmt::format("descriptor {} is not an IPv4 TCP socket", fd);
  }
  if (option(SO_ACCEPTCONN) != 1) return fmt::format("descriptor {} is a TCP socket that is not listening", fd);
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return fmt::format("descriptor {}: getsockname: {}", fd, errnoText(errno));
  }
  if (expectedPort != 0 && ntohs(addr.sin_port) != expectedPort) {
    return fmt::format("descriptor {} listens on port {}, not the store's {}", fd, ntohs(addr.sin_port), expectedPort);
  }
  return {};
}

}  // namespace

Result<StoreLimits> storeLimitsFromKnobs() {
  StoreLimits limits;
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t maxValue, readKnobInt(knobs::kStoreMaxValueBytes));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t maxBytes, readKnobInt(knobs::kStoreMaxBytes));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t idleMs, readKnobInt(knobs::kStoreIdleTimeoutMs));
  limits.maxValueBytes = static_cast<std::uint64_t>(maxValue);
  limits.maxBytes = static_cast<std::uint64_t>(maxBytes);
  limits.idleTimeout = std::chrono::milliseconds(idleMs);
  return limits;
}

// ---- One connection ----------------------------------------------------------------

struct StoreServer::Conn {
  UniqueFd fd;
  std::string peer;
  bool dead = false;
  std::uint32_t events = 0;  // registered with epoll
  // Before authentication.
  std::unique_ptr<tcp::ServerHandshake> handshake;
  std::vector<std::uint8_t> handshakeIn;
  // After it.
  std::unique_ptr<tcp::RecordWriter> tx;
  std::unique_ptr<tcp::RecordReader> rx;
  StoreRequestParser parser{kValueReserveBytes};
  Status refusal;              // the request being read was refused at its header
  std::uint64_t reserved = 0;  // budget promised to the SET being read
  std::optional<StoreRequest> parked;
  TimePoint parkedDeadline = TimePoint::max();
  bool resume = false;         // its answer left: requests may be buffered already, read on
  TimePoint idleDeadline = TimePoint::max();
  bool closing = false;        // said goodbye: close once `out` has left
  // Bytes queued for the peer (handshake answers, sealed replies) and how many went out.
  std::vector<std::uint8_t> out;
  std::size_t outDone = 0;
  bool sendBlocked = false;  // the socket was full: reading waits until `out` has left
  bool authenticated() const { return tx != nullptr; }
};

// ---- The loop ----------------------------------------------------------------------

class StoreServer::Loop {
 public:
  Loop(StoreServer& server, UniqueFd epfd, UniqueFd wakeFd, WireSecurity mode)
      : s_(server), epfd_(std::move(epfd)), wakeFd_(std::move(wakeFd)), mode_(mode), pending_(server.limits_.pending) {}
  Status start();
  void stop();
  std::uint64_t linesPrinted() const { return refusedLog_.printed() + timedOutLog_.printed() + evictedLog_.printed(); }
  std::uint64_t linesSuppressed() const {
    return refusedLog_.suppressed() + timedOutLog_.suppressed() + evictedLog_.suppressed();
  }

 private:
  void run();
  void rounds();
  void acceptAll();
  void onEvent(Conn& c, std::uint32_t events);
  void stepHandshake(Conn& c);
  void readRequests(Conn& c);
  void headerArrived(Conn& c);
  void valueArriving(Conn& c, std::size_t bytes);
  void refuseValue(Conn& c, const Status& why);
  void handle(Conn& c, StoreRequest request);
  void answer(Conn& c, const StoreResponse& response);
  void wakeParked();
  void unpark(Conn& c, StoreRequest request);
  void timers(TimePoint now);
  int sleepMs(TimePoint now) const;
  // Sends what is queued; false when the connection cannot go on now (blocked or dropped).
  bool flush(Conn& c);
  void watch(Conn& c);  // sets the epoll events the connection's state needs
  void drop(Conn& c);
  void sweep();
  void publish();
  void drain();
  void touch(Conn& c) {
    if (!c.closing) c.idleDeadline = Clock::now() + s_.limits_.idleTimeout;
  }

  StoreServer& s_;
  UniqueFd epfd_;
  UniqueFd wakeFd_;
  WireSecurity mode_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  tcp::PendingConnections pending_;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  bool acceptPaused_ = false;
  TimePoint acceptResume_{};
  LogRateLimiter refusedLog_, timedOutLog_, evictedLog_;
};

Status StoreServer::Loop::start() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  for (int fd : {s_.listenFd_.get(), wakeFd_.get()}) {
    ev.data.fd = fd;
    if (::epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return internalError("store server: epoll_ctl(add, fd {}): {}", fd, errnoText(errno));
    }
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return internalError("store server: cannot start its thread: {}", e.what());
  }
  return Status::ok();
}

void StoreServer::Loop::stop() {
  stopping_.store(true);
  const std::uint64_t one = 1;
  if (::write(wakeFd_.get(), &one, sizeof(one)) < 0) {
    MLOG_ERROR(kCollectives, "store: cannot wake the server thread: {}", errnoText(errno));
  }
  if (thread_.joinable()) thread_.join();
}

void StoreServer::Loop::run() {
  pthread_setname_np(pthread_self(), "mer-store");
  try {
    rounds();
    drain();
  } catch (const std::exception& e) {
    // Nothing here throws by design; if something does (an allocation), the store stops
    // serving and every client sees its connection close.
    MLOG_ERROR(kCollectives, "store: the server thread stopped: {}", e.what());
  }
  conns_.clear();
  publish();
}

void StoreServer::Loop::rounds() {
  epoll_event events[64];
  while (!stopping_.load()) {
    const int n = ::epoll_wait(epfd_.get(), events, 64, sleepMs(Clock::now()));
    if (n < 0 && errno != EINTR) {
      MLOG_ERROR(kCollectives, "store: epoll_wait: {}; the store stops serving", errnoText(errno));
      return;
    }
    for (int i = 0; i < std::max(n, 0); ++i) {
      const int fd = events[i].data.fd;
      if (fd == wakeFd_.get()) {
        std::uint64_t v = 0;
        (void)::read(wakeFd_.get(), &v, sizeof(v));  // EAGAIN: drained already
        continue;
      }
      if (fd == s_.listenFd_.get()) {
        acceptAll();
        continue;
      }
      auto it = conns_.find(fd);
      if (it != conns_.end() && !it->second->dead) onEvent(*it->second, events[i].events);
    }
    for (auto& [fd, c] : conns_) {
      if (c->resume && !c->dead) {
        c->resume = false;
        readRequests(*c);
      }
    }
    timers(Clock::now());
    sweep();
    publish();
  }
}

// ---- Before authentication ----------------------------------------------------------

void StoreServer::Loop::acceptAll() {
  while (!acceptPaused_) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(s_.listenFd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: accept: {}", errnoText(err));
      if (err == EMFILE || err == ENFILE) {
        // Out of descriptors: the oldest pending handshake makes room, else wait a little.
        const std::vector<int> oldest = pending_.expire(pending_.nextDeadline());
        for (int victim : oldest) {
          if (auto it = conns_.find(victim); it != conns_.end()) drop(*it->second);
        }
        sweep();
        if (!oldest.empty()) continue;
      }
      // Let descriptors or memory free up: stop watching the listener for a moment.
      epoll_event ev{};
      ev.data.fd = s_.listenFd_.get();
      (void)::epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, s_.listenFd_.get(), &ev);
      acceptPaused_ = true;
      acceptResume_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd.reset(fd);
    c->peer = tcp::peerAddress(fd);
    const auto admitted = pending_.admit(fd, ntohl(addr.sin_addr.s_addr), Clock::now());
    if (auto victim = conns_.find(admitted.evictedFd); victim != conns_.end()) {
      MLOG_LIMITED(evictedLog_, kCollectives, warn,
                   "store: closed a pending connection from {}: {} (at most {} per address, {} in all)",
                   victim->second->peer, tcp::toString(admitted.why), pending_.limits().perSource,
                   pending_.limits().perListener);
      drop(*victim->second);
    }
    c->handshake = std::make_unique<tcp::ServerHandshake>(s_.secret_, mode_, [](const tcp::ConnectInfo& info) {
      if (info.kind == tcp::ConnectionKind::kStore) return Status::ok();
      return peerError("not a store connection (kind {})", static_cast<int>(info.kind));
    });
    Conn& ref = *c;
    conns_[fd] = std::move(c);
    watch(ref);
    if (!ref.dead) stepHandshake(ref);  // the hello may be there already
  }
}

void StoreServer::Loop::stepHandshake(Conn& c) {
  while (!c.dead) {
    if (!flush(c)) return;
    if (c.handshake->finished()) {
      const Result<tcp::ConnectInfo>& result = c.handshake->result();
      if (!result) {
        MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: refused connection from {} (no valid job-secret handshake): {}",
                     c.peer, result.status().toString());
        return drop(c);
      }
      const tcp::SessionKeys& keys = c.handshake->keys();
      c.tx = std::make_unique<tcp::RecordWriter>(keys.mode, keys.send);
      c.rx = std::make_unique<tcp::RecordReader>(keys.mode, keys.recv);
      c.handshake.reset();
      c.handshakeIn = {};
      pending_.remove(c.fd.get());
      touch(c);
      MLOG_DEBUG(kCollectives, "store: client {} connected", c.peer);
      watch(c);
      return readRequests(c);  // a request may have come with the proof
    }
    const std::size_t want = c.handshake->wantBytes();
    std::uint8_t buf[128];
    const ssize_t n = ::recv(c.fd.get(), buf, std::min(sizeof(buf), want - c.handshakeIn.size()), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: refused connection from {}: closed during the handshake",
                   c.peer);
      return drop(c);
    }
    if (n < 0) return;
    c.handshakeIn.insert(c.handshakeIn.end(), buf, buf + n);
    if (c.handshakeIn.size() < want) continue;
    std::vector<std::uint8_t> reply = c.handshake->feed(c.handshakeIn);
    c.handshakeIn.clear();
    c.out.insert(c.out.end(), reply.begin(), reply.end());
  }
}

// ---- Requests ----------------------------------------------------------------------

void StoreServer::Loop::readRequests(Conn& c) {
  std::size_t turn = 0;
  // One request at a time: the next is read once this one's answer has left (flush resumes).
  while (!c.dead && !c.closing && !c.parked && c.outDone == c.out.size()) {
    const std::span<const std::uint8_t> plain = c.rx->plaintext();
    if (!plain.empty()) {
      const std::size_t n = std::min(plain.size(), c.parser.wantBytes());
      const bool hadHeader = c.parser.headerDone();
      if (c.parser.readingValue()) valueArriving(c, n);
      const Status fed = c.parser.feed(plain.first(n));
      c.rx->consume(n);
      if (!fed.isOk()) {
        MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: dropping client {}: {}", c.peer, fed.toString());
        return drop(c);
      }
      if (!hadHeader && c.parser.headerDone()) headerArrived(c);
      if (c.parser.done()) handle(c, c.parser.take());
      continue;
    }
    if (turn >= kReadTurnBytes) return;  // the socket stays readable: the next round goes on
    const std::span<std::uint8_t> space = c.rx->space();
    const ssize_t n = ::recv(c.fd.get(), space.data(), space.size(), 0);
    if (n > 0) {
      turn += static_cast<std::size_t>(n);
      touch(c);
      if (Status st = c.rx->commit(static_cast<std::size_t>(n)); !st.isOk()) {
        MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: dropping client {}: {}", c.peer, st.toString());
        return drop(c);
      }
    } else if (n == 0) {
      MLOG_DEBUG(kCollectives, "store: client {} disconnected", c.peer);
      return drop(c);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else if (errno != EINTR) {
      MLOG_DEBUG(kCollectives, "store: client {}: {}", c.peer, errnoText(errno));
      return drop(c);
    }
  }
}

// A request's header is in: a SET's announced size is checked against the limits now.
void StoreServer::Loop::headerArrived(Conn& c) {
  if (c.parser.op() != StoreOp::kSet) return;
  const std::uint64_t bytes = c.parser.announcedValueBytes();
  if (bytes > s_.limits_.maxValueBytes) {
    refuseValue(c, invalidArgument("it exceeds the store's limit of {} bytes (MERIDIAN_STORE_MAX_VALUE_BYTES)",
                                   s_.limits_.maxValueBytes));
  } else if (!s_.state_.fits(bytes)) {
    refuseValue(c, s_.state_.reserve(bytes));
  }
}

// A SET's value bytes take their part of the budget as they arrive.
void StoreServer::Loop::valueArriving(Conn& c, std::size_t bytes) {
  if (!c.refusal.isOk() || c.parser.op() != StoreOp::kSet) return;
  if (Status room = s_.state_.reserve(bytes); !room.isOk()) return refuseValue(c, room);
  c.reserved += bytes;
}

void StoreServer::Loop::refuseValue(Conn& c, const Status& why) {
  c.refusal = why.withContext(fmt::format("store SET: a value of {} bytes", c.parser.announcedValueBytes()));
  c.parser.discardValue();
  s_.state_.release(std::exchange(c.reserved, 0));
}

void StoreServer::Loop::handle(Conn& c, StoreRequest request) {
  if (!c.refusal.isOk()) {
    StoreResponse refused;
    refused.op = request.op;
    refused.status = std::exchange(c.refusal, Status::ok());
    MLOG_INFO(kCollectives, "store: refused a request from {}: {}", c.peer, refused.status.message());
    return answer(c, refused);
  }
  s_.state_.release(std::exchange(c.reserved, 0));  // set() counts the value itself now
  if (request.op == StoreOp::kGet || request.op == StoreOp::kWait || request.op == StoreOp::kGetMany) {
    const bool ready = s_.state_.check(request.keys).value();
    const TimePoint deadline = deadlineFromTimeoutMs(request.timeoutMs);
    if (!ready && deadline > Clock::now()) {
      c.parkedDeadline = deadline;
      c.parked = std::move(request);
      s_.parkedCount_.fetch_add(1);
      return watch(c);
    }
    request.timeoutMs = 0;  // ready, or out of time: answers at once
  }
  answer(c, execute(s_.state_, request));
  if (request.op == StoreOp::kSet || request.op == StoreOp::kAdd) wakeParked();
}

void StoreServer::Loop::answer(Conn& c, const StoreResponse& response) {
  c.tx->append(encodeStoreResponse(response), c.out);
  flush(c);
}

void StoreServer::Loop::unpark(Conn& c, StoreRequest request) {
  c.parked.reset();
  c.parkedDeadline = TimePoint::max();
  s_.parkedCount_.fetch_sub(1);
  request.timeoutMs = 0;
  answer(c, execute(s_.state_, request));
  touch(c);
  c.resume = true;
  if (!c.dead) watch(c);
}

void StoreServer::Loop::wakeParked() {
  for (auto& [fd, c] : conns_) {
    if (c->dead || !c->parked || !s_.state_.check(c->parked->keys).value()) continue;
    unpark(*c, std::move(*c->parked));
  }
}

// ---- Timers, sending, closing ------------------------------------------------------

void StoreServer::Loop::timers(TimePoint now) {
  if (acceptPaused_ && now >= acceptResume_) {
    acceptPaused_ = false;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = s_.listenFd_.get();
    (void)::epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, s_.listenFd_.get(), &ev);
  }
  for (int fd : pending_.expire(now)) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) continue;
    MLOG_LIMITED(timedOutLog_, kCollectives, warn, "store: refused connection from {}: timed out waiting for the handshake ({} ms)",
                 it->second->peer, pending_.limits().handshakeTimeout.count());
    drop(*it->second);
  }
  for (auto& [fd, cp] : conns_) {
    Conn& c = *cp;
    if (c.dead || !c.authenticated()) continue;
    if (c.parked && now >= c.parkedDeadline) {
      unpark(c, std::move(*c.parked));  // answers kTimeout, as StoreState does
      continue;
    }
    if (c.parked || now < c.idleDeadline) continue;
    if (c.closing) {  // its goodbye did not leave in time either
      drop(c);
      continue;
    }
    MLOG_DEBUG(kCollectives, "store: closing client {}: idle for {} ms", c.peer, s_.limits_.idleTimeout.count());
    StoreResponse goodbye;
    goodbye.op = StoreOp::kIdleClose;
    goodbye.status = timeoutError("store: connection closed after {} ms without a request (MERIDIAN_STORE_IDLE_TIMEOUT_MS)",
                                  s_.limits_.idleTimeout.count());
    c.closing = true;
    c.idleDeadline = now + kGoodbyeTimeout;
    s_.state_.release(std::exchange(c.reserved, 0));
    answer(c, goodbye);
  }
}

int StoreServer::Loop::sleepMs(TimePoint now) const {
  TimePoint next = pending_.nextDeadline();
  if (acceptPaused_) next = std::min(next, acceptResume_);
  for (const auto& [fd, c] : conns_) {
    if (c->resume) return 0;
    if (!c->authenticated()) continue;
    next = std::min(next, c->parked ? c->parkedDeadline : c->idleDeadline);
  }
  if (next <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::min<std::int64_t>(ms, kMaxSleepMs));
}

bool StoreServer::Loop::flush(Conn& c) {
  while (c.outDone < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.outDone, c.out.size() - c.outDone, MSG_NOSIGNAL);
    if (n > 0) {
      c.outDone += static_cast<std::size_t>(n);
      if (c.authenticated()) touch(c);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c.sendBlocked = true;
      watch(c);
      return false;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      MLOG_DEBUG(kCollectives, "store: client {}: send: {}", c.peer, errnoText(errno));
      drop(c);
      return false;
    }
  }
  c.out.clear();
  c.outDone = 0;
  if (std::exchange(c.sendBlocked, false) && c.authenticated()) c.resume = true;  // requests may wait in its buffers
  if (c.closing) {
    drop(c);
    return false;
  }
  watch(c);
  return true;
}

void StoreServer::Loop::watch(Conn& c) {
  if (c.dead) return;
  // Input is read only while it could be acted on: not while a request is parked, a reply
  // is still leaving (clients wait for it) or a goodbye was said; meanwhile only a hang-up.
  const bool sending = c.outDone < c.out.size();
  std::uint32_t want = EPOLLRDHUP;
  if (!c.parked && !c.closing && !sending) want |= EPOLLIN;
  if (sending) want |= EPOLLOUT;
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.fd = c.fd.get();
  if (::epoll_ctl(epfd_.get(), c.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    MLOG_LIMITED(refusedLog_, kCollectives, warn, "store: dropping {}: epoll_ctl: {}", c.peer, errnoText(errno));
    return drop(c);
  }
  c.events = want;
}

void StoreServer::Loop::onEvent(Conn& c, std::uint32_t events) {
  const bool hangUp = (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
  if ((events & EPOLLOUT) != 0 && !(c.authenticated() ? flush(c) : true)) return;
  // A hang-up while nothing more will be read from the peer: it left.
  if (hangUp && (c.parked || c.closing || c.outDone < c.out.size())) {
    MLOG_DEBUG(kCollectives, "store: client {} left before its answer", c.peer);
    return drop(c);
  }
  if (!c.authenticated()) return stepHandshake(c);
  if ((events & EPOLLIN) != 0 || hangUp) readRequests(c);
}

void StoreServer::Loop::drop(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  if (c.parked) s_.parkedCount_.fetch_sub(1);
  c.parked.reset();
  s_.state_.release(std::exchange(c.reserved, 0));
  pending_.remove(c.fd.get());
  if (c.events != 0) (void)::epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  (void)::shutdown(c.fd.get(), SHUT_RDWR);  // ENOTCONN when the peer is gone already
}

void StoreServer::Loop::sweep() {
  std::erase_if(conns_, [](const auto& entry) { return entry.second->dead; });
}

void StoreServer::Loop::publish() {
  std::size_t clients = 0;
  for (const auto& [fd, c] : conns_) clients += c->authenticated() ? 1 : 0;
  s_.pendingCount_.store(pending_.size());
  s_.clientCount_.store(clients);
}

// Stopping: blocked requests answer with the shutdown's error, what is queued still leaves
// (kDrainTimeout at most: the usual end of a job is rank 0 leaving the moment the last
// rank's "done" SET lands, and that SET's reply may still be on its way).
void StoreServer::Loop::drain() {
  s_.state_.shutdown();
  for (auto& [fd, c] : conns_) {
    if (!c->dead && c->parked) unpark(*c, std::move(*c->parked));
  }
  const TimePoint deadline = Clock::now() + kDrainTimeout;
  epoll_event events[64];
  while (Clock::now() < deadline) {
    bool queued = false;
    for (auto& [fd, c] : conns_) {
      if (c->dead || c->out.empty()) continue;
      if (!flush(*c) && !c->dead) queued = true;
    }
    if (!queued) break;
    (void)::epoll_wait(epfd_.get(), events, 64, 10);
  }
  for (auto& [fd, c] : conns_) drop(*c);
}

// ---- StoreServer -------------------------------------------------------------------

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& bindIp, std::uint16_t port,
                                                        std::string secret, std::optional<StoreLimits> limits) {
  auto listenFd = tcp::listenOn(bindIp, port, /*nonBlocking=*/true);
  if (!listenFd) return listenFd.status().withContext("store server");
  return serve(std::move(listenFd).value(), std::move(secret), limits);
}

Result<std::unique_ptr<StoreServer>> StoreServer::adopt(int listeningFd, std::uint16_t expectedPort, std::string secret) {
  if (std::string why = whyNotAListeningTcpSocket(listeningFd, expectedPort); !why.empty()) {
    return invalidArgument("store server: cannot adopt an inherited socket: {}", why);
  }
  UniqueFd fd(listeningFd);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0 || ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
    return internalError("store server: cannot set up the inherited socket: {}", errnoText(errno));
  }
  return serve(std::move(fd), std::move(secret), std::nullopt);
}

Result<std::unique_ptr<StoreServer>> StoreServer::serve(UniqueFd listenFd, std::string secret,
                                                        std::optional<StoreLimits> given) {
  StoreLimits limits;
  if (given) {
    limits = *given;
  } else {
    MERIDIAN_ASSIGN_OR_RETURN(limits, storeLimitsFromKnobs());
  }
  MERIDIAN_ASSIGN_OR_RETURN(const WireSecurity mode, wireSecurityFromKnob());
  UniqueFd wakeFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wakeFd.valid()) return internalError("store server: eventfd: {}", errnoText(errno));
  UniqueFd epfd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epfd.valid()) return internalError("store server: epoll_create1: {}", errnoText(errno));
  auto server = std::make_unique<StoreServer>(PrivateTag{}, std::move(listenFd), std::move(secret), limits);
  server->loop_ = std::make_unique<Loop>(*server, std::move(epfd), std::move(wakeFd), mode);
  MERIDIAN_RETURN_IF_ERROR(server->loop_->start());
  MLOG_INFO(kCollectives, "store: listening on {}", tcp::localAddress(server->listenFd_.get()));
  return server;
}

StoreServer::StoreServer(PrivateTag, UniqueFd listenFd, std::string secret, StoreLimits limits)
    : listenFd_(std::move(listenFd)), secret_(std::move(secret)), limits_(limits), state_(limits.maxBytes) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listenFd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) port_ = ntohs(addr.sin_port);
}

StoreServer::~StoreServer() {
  if (loop_) loop_->stop();
  loop_.reset();
  MLOG_INFO(kCollectives, "store: stopped (port {})", port_);
}

std::uint64_t StoreServer::refusalLinesPrinted() const { return loop_ ? loop_->linesPrinted() : 0; }
std::uint64_t StoreServer::refusalLinesSuppressed() const { return loop_ ? loop_->linesSuppressed() : 0; }

}  // namespace meridian::bootstrap
