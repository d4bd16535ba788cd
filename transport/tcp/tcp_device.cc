// The TCP engine: listeners, the non-blocking server handshake, and the stream state
// machines that move multipath chunks and acknowledgements, all on one epoll progress
// thread per device.
#include "transport/tcp/tcp_device.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // struct tcp_info with the delivery rate (glibc's copy predates it)
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "core/check.h"
#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/engine.h"
#include "transport/tcp/direct_read.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/splice.h"

namespace meridian::transport::tcp {

namespace {

// Headers, acks and small payloads are read through a small stream buffer; the rest of a
// larger payload goes straight from the socket into its destination (no extra copy).
constexpr std::size_t kReadBufferBytes = 8 * 1024;
constexpr std::size_t kDirectReadMinBytes = 8 * 1024;
constexpr std::size_t kReadBudgetBytes = 8u << 20;
// Acks of chunks this large go out at once (their sender waits for them); smaller ones
// wait up to kAckDelayUs for company, or until kAckBatchBytes of them are queued.
constexpr std::uint32_t kUrgentAckChunkBytes = 64 * 1024;
constexpr std::int64_t kAckDelayUs = 200;
constexpr std::size_t kAckBatchBytes = 32 * kFrameHeaderBytes;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// Relays this device carries for others: each holds two buffers of kSpliceBufferBytes.
constexpr std::size_t kMaxSplices = 64;
constexpr std::size_t kSpliceBufferBytes = 256 * 1024;

std::string errnoText(int e) { return std::strerror(e); }

// What the client of a data stream tells the server: which stream of which path it is.
ConnectInfo dataStreamInfo(std::uint64_t sessionId, int rank, std::size_t path, int stream, int streams,
                           std::size_t paths) {
  ConnectInfo info;
  info.pathCount = static_cast<std::uint8_t>(paths);
  info.kind = ConnectionKind::kDataStream;
  info.sessionId = sessionId;
  info.rank = rank;
  info.pathIndex = static_cast<std::uint16_t>(path);
  info.streamIndex = static_cast<std::uint16_t>(stream);
  info.streamCount = static_cast<std::uint16_t>(streams);
  return info;
}

}  // namespace

// An accepted connection still in the server side of the handshake.
struct PendingHandshake {
  UniqueFd fd;
  std::string peer;
  TimePoint deadline;
  enum class Step { kReadHello, kWriteChallenge, kReadAuth, kWriteResult } step = Step::kReadHello;
  std::vector<std::uint8_t> in;
  std::vector<std::uint8_t> out;
  std::size_t outDone = 0;
  Nonce clientNonce{};
  Nonce serverNonce{};
  Result<ConnectInfo> info = ConnectInfo{};
  bool closeAfterWrite = false;
};

// An authenticated stream that no channel has claimed yet.
struct UnclaimedStream {
  UniqueFd fd;
  ConnectInfo info;
  TimePoint deadline;
};

struct Stream {
  UniqueFd fd;
  std::size_t path = 0;
  struct ChannelEntry* entry = nullptr;
  bool dead = false;
  bool gotClose = false;
  bool wantOut = false;
  // Reading.
  bool inPayload = false;
  std::uint8_t header[kFrameHeaderBytes] = {};
  std::size_t headerGot = 0;
  RecvTarget target;
  std::uint64_t payloadGot = 0;
  std::unique_ptr<std::uint8_t[]> rbuf;
  std::size_t rpos = 0, rlen = 0;
  // Moves buffered bytes into dst until *got reaches need; true once it has.
  bool takeBuffered(std::uint8_t* dst, std::size_t* got, std::size_t need) {
    std::size_t take = std::min(need - *got, rlen - rpos);
    std::memcpy(dst + *got, rbuf.get() + rpos, take);
    *got += take;
    rpos += take;
    return *got == need;
  }
  std::uint8_t drain[16 * 1024];
  // A kDataRef frame whose address is still arriving.
  bool refPending = false;
  FrameHeader refHeader;
  std::uint8_t refIn[kRemoteRefBytes] = {};
  std::size_t refGot = 0;
  // Writing: control frames (acks, close) go out between data frames.
  std::vector<std::uint8_t> ctrl;
  std::size_t ctrlDone = 0;
  bool ctrlUrgent = false;      // an ack of a large chunk (its sender waits for it)
  std::int64_t ctrlSinceUs = 0; // when the oldest unsent control frame was queued
  bool writing = false;
  OutChunk chunk;
  FrameHeaderBytes chunkHeader{};
  std::uint64_t written = 0;  // of header + payload
  std::uint64_t frameBytes = 0;
  bool writingRef = false;                     // the frame is a kDataRef: refOut is its payload
  RemoteRefBytes refOut{};
  int notsentLowat = 0;  // TCP_NOTSENT_LOWAT in force (0: none)
};

struct ChannelEntry {
  std::uint64_t sessionId = 0;
  int peerRank = 0;
  ChannelPtr channel;                      // the user side, handed to the caller
  std::shared_ptr<ChannelEngine> engine;   // the same channel as this device drives it
  // The kernel's figures per path as gauges (registered at the first reading).
  struct TcpGauges {
    Gauge* rttSeconds = nullptr;
    Gauge* deliveryBytesPerSec = nullptr;
    Gauge* retransmits = nullptr;
  };
  std::vector<TcpGauges> tcpGauges;
  std::vector<std::vector<std::unique_ptr<Stream>>> streams;  // [path][stream]
  std::vector<int> expectedStreams;                           // per path; 0 = not known yet
  std::size_t directPaths = 0;                                // paths beyond these: the relay slot
  std::vector<std::string> peerAddresses;                     // the peer's listen addresses
  std::int64_t readPid = 0;                                   // direct reads from this pid (0: none)
  bool ready = false;
  bool usable() const { return ready && !engine->failed(); }
  bool liveStreams(std::size_t path) const {
    return std::any_of(streams[path].begin(), streams[path].end(), [](const auto& s) { return !s->dead; });
  }
};

// A relay this device carries between two other ranks.
struct RelayEntry {
  std::unique_ptr<Splice> splice;
  std::uint32_t eventsA = 0, eventsB = 0;  // registered with epoll
  std::uint64_t counted = 0;               // bytes already added to the metric
  std::string what;                        // "rank 1 -> rank 2 (session ...)"
};

// The progress thread's doorbell (an eventfd). Channels hold it by shared_ptr, so a
// thread posting to a channel while its device is being destroyed rings a live eventfd.
struct Waker {
  UniqueFd fd;
  std::atomic<bool> pending{false};
  void ring() {
    if (!pending.exchange(true, std::memory_order_acq_rel)) {
      std::uint64_t one = 1;
      ssize_t rc = ::write(fd.get(), &one, sizeof(one));
      (void)rc;
    }
  }
};

// Progress from waiting threads: whoever holds `mu` runs the engine (the progress thread
// or a thread in Request::wait). `impl` is cleared when the device goes away; requests
// that outlive it then simply wait.
struct Poller : Progressor {
  std::mutex mu;
  struct TcpDevice::Impl* impl = nullptr;
  bool pollOnce(bool* ran = nullptr) override;
  void beginPolling() override { pollers.fetch_add(1, std::memory_order_acq_rel); }
  void endPolling(bool handOver) override {
    if (pollers.fetch_sub(1, std::memory_order_acq_rel) == 1 && handOver) {
      lastPollUs.store(0, std::memory_order_relaxed);
      std::lock_guard lock(idleMu);
      idleCv.notify_all();
    }
  }
  // Whether a thread outside the engine drives it now: one in Request::wait, or one that
  // called pollOnce (Request::test, NCCL's proxy through the plugin) within kTesterUs.
  bool othersPolling() const {
    return pollers.load(std::memory_order_acquire) > 0 ||
           nowUs() - lastPollUs.load(std::memory_order_relaxed) < kTesterUs;
  }
  static constexpr std::int64_t kTesterUs = 1000;
  std::atomic<int> pollers{0};
  std::atomic<std::int64_t> lastPollUs{0};
  std::mutex idleMu;
  std::condition_variable idleCv;
};

struct TcpDevice::Impl {
  DeviceOptions options;
  std::shared_ptr<Poller> poller = std::make_shared<Poller>();
  std::uint64_t maxUnexpectedBytes = 0;
  std::chrono::milliseconds unclaimedTimeout{0};
  std::vector<UniqueFd> listeners;
  std::vector<std::string> listenAddrs;
  EndpointName endpointName;  // listenAddrs, encoded (endpoint.h)
  std::vector<std::string> localIps;
  // Same-host direct reads per (session, peer), from joinGroup or planDirectRead.
  std::mutex planMu;
  std::map<std::pair<std::uint64_t, int>, DirectReadPlan> directPlans;
  UniqueFd epfd;
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();
  std::atomic<bool> running{true};
  std::thread thread;

  std::mutex cmdMu;
  std::condition_variable cmdCv;
  std::vector<std::function<void()>> commands;

  // Progress-thread state.
  std::map<int, std::unique_ptr<PendingHandshake>> handshakes;  // by fd
  std::vector<UnclaimedStream> unclaimed;
  std::vector<std::unique_ptr<ChannelEntry>> channels;
  std::map<int, Stream*> streamsByFd;
  std::vector<std::unique_ptr<RelayEntry>> relays;
  std::map<int, RelayEntry*> relaysByFd;
  Counter* relayedBytes = nullptr;
  Counter* directReadBytes = nullptr;  // chunk bytes read straight from same-host peers' memory
  std::int64_t lastStallCheckUs = 0;
  std::int64_t lastTcpInfoUs = 0;
  static constexpr std::int64_t kTcpInfoPeriodUs = 1'000'000;  // TCP_INFO of every stream, once a second
  // A stream's unsent bytes in the kernel are held to what it delivers in this long, and to
  // no less than MERIDIAN_TCP_NOTSENT_LOWAT_BYTES: on a slow path, a deep send buffer of
  // unsent chunks would hold the acknowledgements queued behind them for seconds (and look
  // like a stall to the peer), and keep chunks on it that a faster path could take; on a fast
  // one, a small limit would only cost wake-ups.
  static constexpr double kNotsentHorizonSec = 0.02;
  // Sets a stream's TCP_NOTSENT_LOWAT for its measured delivery rate (0: not known yet).
  void limitUnsent(Stream& s, double deliveryBytesPerSec);

  void wake() { waker->ring(); }

  // Runs `fn` on the progress thread and waits for it.
  void runOnProgress(std::function<void()> fn) {
    bool done = false;
    {
      std::lock_guard lock(cmdMu);
      commands.push_back([&, fn = std::move(fn)] {
        fn();
        std::lock_guard l(cmdMu);
        done = true;
        cmdCv.notify_all();
      });
    }
    wake();
    std::unique_lock lock(cmdMu);
    cmdCv.wait(lock, [&] { return done; });
  }

  void epollSet(int fd, std::uint32_t events, bool add) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    ::epoll_ctl(epfd.get(), add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
  }

  void loop();
  // One round of the engine over `n` ready events; the caller holds poller->mu.
  void processEvents(const epoll_event* events, int n);
  void acceptAll(std::size_t listenerIndex);
  void stepHandshake(PendingHandshake& hs, std::uint32_t events);
  void claimStreams();
  ChannelEntry* findChannel(std::uint64_t sessionId, int peerRank);
  // A new channel entry (not yet in `channels`) over `endpoints` (+ the relay slot).
  std::unique_ptr<ChannelEntry> makeEntry(std::uint64_t sessionId, int peerRank, std::vector<PathEndpoints> endpoints,
                                          std::vector<std::string> peerAddresses, bool peerReadsDirect = false);
  // acceptChannel's search (progress thread).
  Result<std::pair<int, ChannelPtr>> acceptAny(std::uint64_t sessionId);
  // Why a relay request may not be served (ok: it may).
  Status checkRelayRequest(const ConnectInfo& info);
  void startRelay(PendingHandshake& hs);
  void stepRelay(RelayEntry& r);
  // Queues a CLOSE frame on a stream between frames and sends it (bounded wait).
  void sayGoodbye(Stream& s);
  void attachStream(ChannelEntry& e, UniqueFd fd, std::size_t path);
  void readStream(Stream& s);
  // A chunk's header (kData, or a kDataRef's once its address arrived) is in: finds its
  // target and starts the payload. False when it failed the channel and the path.
  bool beginChunk(Stream& s, const FrameHeader& h);
  // The address of a kDataRef chunk has arrived: reads the chunk from the peer's memory into
  // its target. False when it failed the channel and the path.
  bool readDirectChunk(Stream& s);
  // The peer broke the protocol on this path: the channel fails, and the path with it.
  void failChannel(ChannelEntry& e, std::size_t path, const Status& why);
  void flushStream(Stream& s);
  void failPath(ChannelEntry& e, std::size_t path, const Status& why, bool graceful);
  // Closes one stream now (no goodbye) and forgets its fd and any frame in progress.
  void closeStream(Stream& s);
  void progressChannels();
  // Passes the kernel's figures of each path's streams to the channel (PathStats).
  void readTcpInfo(ChannelEntry& e);
  void shutdownAll();
  MultipathConfig channelConfig() const;
};

MultipathConfig TcpDevice::Impl::channelConfig() const {
  MultipathConfig c;
  c.chunkBytes = static_cast<std::uint32_t>(options.chunkBytes);
  c.pathStallUs = static_cast<std::int64_t>(options.pathStallMs) * 1000;
  c.maxUnexpectedBytes = maxUnexpectedBytes;
  c.pathWindowBytes = std::max<std::uint64_t>(16u << 20, 4ull * options.chunkBytes);
  c.coldWindowBytes = std::max<std::uint64_t>(1u << 20, 2ull * options.chunkBytes);
  c.deviceName = options.name;
  c.adaptive = options.adaptive;
  return c;
}

// ------------------------------------------------------------------ accept + handshake

void TcpDevice::Impl::acceptAll(std::size_t listenerIndex) {
  while (true) {
    int fd = ::accept4(listeners[listenerIndex].get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        MLOG_WARN(kTransport, "accept on {}: {}", listenAddrs[listenerIndex], errnoText(errno));
      }
      return;
    }
    auto hs = std::make_unique<PendingHandshake>();
    hs->fd.reset(fd);
    hs->peer = peerAddress(fd);
    hs->deadline = Clock::now() + kHandshakeTimeout;
    hs->serverNonce = freshNonce();
    epollSet(fd, EPOLLIN, true);
    handshakes[fd] = std::move(hs);
  }
}

void TcpDevice::Impl::stepHandshake(PendingHandshake& hs, std::uint32_t events) {
  auto drop = [&](const std::string& why) {
    MLOG_WARN(kTransport, "refused connection from {}: {}", hs.peer, why);
    ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, hs.fd.get(), nullptr);
    handshakes.erase(hs.fd.get());  // destroys hs
  };
  if (events & (EPOLLERR | EPOLLHUP)) {
    if (!(events & EPOLLIN)) return drop("connection closed during the handshake");
  }
  auto readUpTo = [&](std::size_t want) -> int {  // 1: have `want` bytes, 0: need more, -1: closed
    while (hs.in.size() < want) {
      std::uint8_t buf[128];
      ssize_t n = ::recv(hs.fd.get(), buf, std::min(sizeof(buf), want - hs.in.size()), 0);
      if (n > 0) {
        hs.in.insert(hs.in.end(), buf, buf + n);
      } else if (n == 0) {
        return -1;
      } else {
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
      }
    }
    return 1;
  };
  auto flushOut = [&]() -> int {
    while (hs.outDone < hs.out.size()) {
      ssize_t n = ::send(hs.fd.get(), hs.out.data() + hs.outDone, hs.out.size() - hs.outDone, MSG_NOSIGNAL);
      if (n > 0) {
        hs.outDone += static_cast<std::size_t>(n);
      } else {
        return (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) ? 0 : -1;
      }
    }
    return 1;
  };
  const std::string& secret = options.secret;
  while (true) {
    switch (hs.step) {
      case PendingHandshake::Step::kReadHello: {
        int r = readUpTo(kHelloBytes);
        if (r < 0) return drop("closed before saying hello");
        if (r == 0) return;
        std::uint16_t version = 0;
        auto nc = decodeHello(hs.in, &version);
        if (!nc) {
          if (version != 0 && version != kProtocolVersion) {
            auto ch = encodeChallenge(secret, Nonce{}, hs.serverNonce, HandshakeResult::kVersionMismatch);
            (void)::send(hs.fd.get(), ch.data(), ch.size(), MSG_NOSIGNAL);
          }
          return drop(nc.status().message());
        }
        hs.clientNonce = nc.value();
        auto ch = encodeChallenge(secret, hs.clientNonce, hs.serverNonce, HandshakeResult::kOk);
        hs.out.assign(ch.begin(), ch.end());
        hs.outDone = 0;
        hs.in.clear();
        hs.step = PendingHandshake::Step::kWriteChallenge;
        break;
      }
      case PendingHandshake::Step::kWriteChallenge: {
        int r = flushOut();
        if (r < 0) return drop("closed while receiving the challenge");
        if (r == 0) {
          epollSet(hs.fd.get(), EPOLLIN | EPOLLOUT, false);
          return;
        }
        epollSet(hs.fd.get(), EPOLLIN, false);
        hs.step = PendingHandshake::Step::kReadAuth;
        break;
      }
      case PendingHandshake::Step::kReadAuth: {
        int r = readUpTo(kAuthBytes);
        if (r < 0) return drop("closed before authenticating");
        if (r == 0) return;
        hs.info = verifyAuth(secret, hs.clientNonce, hs.serverNonce, hs.in);
        HandshakeResult result = hs.info ? HandshakeResult::kOk : HandshakeResult::kAuthFailed;
        if (hs.info && hs.info->kind == ConnectionKind::kRelay) {
          if (Status why = checkRelayRequest(hs.info.value()); !why.isOk()) {
            hs.info = why;
            result = HandshakeResult::kRejected;
          }
        } else if (hs.info && hs.info->kind != ConnectionKind::kDataStream) {
          hs.info = peerError("handshake: a {} connection reached a data listener", static_cast<int>(hs.info->kind));
          result = HandshakeResult::kRejected;
        }
        auto res = encodeResult(result);
        hs.out.assign(res.begin(), res.end());
        hs.outDone = 0;
        hs.step = PendingHandshake::Step::kWriteResult;
        break;
      }
      case PendingHandshake::Step::kWriteResult: {
        int r = flushOut();
        if (!hs.info) return drop(hs.info.status().message());
        if (r < 0) return drop("closed while receiving the result");
        if (r == 0) {
          epollSet(hs.fd.get(), EPOLLOUT, false);
          return;
        }
        if (hs.info->kind == ConnectionKind::kRelay) return startRelay(hs);
        ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, hs.fd.get(), nullptr);
        UnclaimedStream u{std::move(hs.fd), hs.info.value(), Clock::now() + unclaimedTimeout};
        int key = u.fd.get();
        unclaimed.push_back(std::move(u));
        handshakes.erase(key);
        claimStreams();
        return;
      }
    }
  }
}

ChannelEntry* TcpDevice::Impl::findChannel(std::uint64_t sessionId, int peerRank) {
  ChannelEntry* match = nullptr;
  for (auto& e : channels) {
    if (e->sessionId == sessionId && e->peerRank == peerRank && !e->engine->failed()) match = e.get();
  }
  return match;
}

void TcpDevice::Impl::claimStreams() {
  for (auto it = unclaimed.begin(); it != unclaimed.end();) {
    ChannelEntry* match = findChannel(it->info.sessionId, it->info.rank);
    if (match == nullptr || it->info.pathIndex >= match->streams.size()) {
      ++it;
      continue;
    }
    const std::size_t path = it->info.pathIndex;
    const bool relayStream = path >= match->directPaths;
    const int via = it->info.relayTarget;
    if (relayStream) {
      // A new relay replaces what is left of the old one: dead streams, or a complete set
      // the peer has given up on (it opens a relay only while its slot is down).
      auto& v = match->streams[path];
      const auto live = std::count_if(v.begin(), v.end(), [](const auto& s) { return !s->dead; });
      if (live > 0 && live >= match->expectedStreams[path]) {
        failPath(*match, path, pathError("relay replaced by a new one"), true);
      }
      if (std::none_of(v.begin(), v.end(), [](const auto& s) { return !s->dead; })) {
        v.clear();
        match->expectedStreams[path] = 0;
      }
    }
    if (match->expectedStreams[path] == 0) match->expectedStreams[path] = it->info.streamCount;
    attachStream(*match, std::move(it->fd), path);
    it = unclaimed.erase(it);
    if (relayStream) {
      if (match->ready) match->engine->onPathUp(path, via);
      continue;
    }
    bool all = true;
    for (std::size_t p = 0; p < match->directPaths; ++p) {
      if (match->expectedStreams[p] == 0 || static_cast<int>(match->streams[p].size()) < match->expectedStreams[p]) {
        all = false;
      }
    }
    if (all) {
      std::lock_guard lock(cmdMu);
      if (!match->ready) {
        match->ready = true;
        cmdCv.notify_all();
      }
    }
  }
}

// ------------------------------------------------------------------ relays

Status TcpDevice::Impl::checkRelayRequest(const ConnectInfo& info) {
  if (!options.relaySlot) return peerError("relay from rank {} refused: this device does not relay", info.rank);
  if (relays.size() >= kMaxSplices) return peerError("relay from rank {} refused: {} relays already", info.rank, relays.size());
  ChannelEntry* from = findChannel(info.sessionId, info.rank);
  ChannelEntry* to = findChannel(info.sessionId, info.relayTarget);
  // Only for members of a session this device is in, to addresses that session published:
  // never an open proxy.
  if (from == nullptr || !from->ready || to == nullptr || !to->ready) {
    return peerError("relay from rank {} to rank {} refused: no open channels to both in session {:x}", info.rank,
                     info.relayTarget, info.sessionId);
  }
  if (info.pathIndex >= to->directPaths) {
    return peerError("relay to rank {} refused: it has no path {}", info.relayTarget, info.pathIndex);
  }
  return Status::ok();
}

void TcpDevice::Impl::startRelay(PendingHandshake& hs) {
  const ConnectInfo info = hs.info.value();
  ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, hs.fd.get(), nullptr);
  UniqueFd client = std::move(hs.fd);
  const std::string peer = hs.peer;
  handshakes.erase(client.get());  // destroys hs
  ChannelEntry* to = findChannel(info.sessionId, info.relayTarget);
  if (to == nullptr || !to->usable()) {
    MLOG_WARN(kTransport, "relay from rank {} ({}): rank {} went away", info.rank, peer, info.relayTarget);
    return;
  }
  const std::string& target = to->peerAddresses[info.pathIndex];
  auto remote = parseHostPort(target);
  Result<UniqueFd> fd = remote ? startConnect(remote.value(), info.pathIndex < localIps.size() ? localIps[info.pathIndex] : "")
                               : Result<UniqueFd>(remote.status());
  if (!fd) {
    MLOG_WARN(kTransport, "relay from rank {} to rank {} at {}: {}", info.rank, info.relayTarget, target,
              fd.status().message());
    return;
  }
  tuneDataSocket(client.get(), options.tcp.socketBufferBytes);
  tuneDataSocket(fd->get(), options.tcp.socketBufferBytes);
  auto r = std::make_unique<RelayEntry>();
  r->splice = std::make_unique<Splice>(std::move(client), std::move(fd.value()), kSpliceBufferBytes);
  r->what = fmt::format("rank {} -> rank {} (session {:x}, plane {})", info.rank, info.relayTarget, info.sessionId,
                        info.pathIndex);
  r->eventsA = r->splice->interestA();
  r->eventsB = r->splice->interestB();
  epollSet(r->splice->fdA(), r->eventsA, true);
  epollSet(r->splice->fdB(), r->eventsB, true);
  relaysByFd[r->splice->fdA()] = r.get();
  relaysByFd[r->splice->fdB()] = r.get();
  MLOG_INFO(kTransport, "relaying {}", r->what);
  relays.push_back(std::move(r));
}

void TcpDevice::Impl::stepRelay(RelayEntry& r) {
  Splice::State state = r.splice->pump();
  const std::uint64_t moved = r.splice->bytesForwarded();
  relayedBytes->add(moved - r.counted);
  r.counted = moved;
  if (state == Splice::State::kRunning) {
    if (r.splice->interestA() != r.eventsA) epollSet(r.splice->fdA(), r.eventsA = r.splice->interestA(), false);
    if (r.splice->interestB() != r.eventsB) epollSet(r.splice->fdB(), r.eventsB = r.splice->interestB(), false);
    return;
  }
  if (state == Splice::State::kFailed) {
    MLOG_WARN(kTransport, "relay {} ended: {} ({} bytes forwarded)", r.what, r.splice->error(), moved);
  } else {
    MLOG_INFO(kTransport, "relay {} closed ({} bytes forwarded)", r.what, moved);
  }
  for (int fd : {r.splice->fdA(), r.splice->fdB()}) {
    ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, fd, nullptr);
    relaysByFd.erase(fd);
  }
  std::erase_if(relays, [&](const auto& x) { return x.get() == &r; });  // destroys r
}

void TcpDevice::Impl::attachStream(ChannelEntry& e, UniqueFd fd, std::size_t path) {
  auto s = std::make_unique<Stream>();
  tuneDataSocket(fd.get(), options.tcp.socketBufferBytes);
  (void)setNonBlocking(fd.get(), true);
  s->fd = std::move(fd);
  s->path = path;
  limitUnsent(*s, 0);  // the floor until the first TCP_INFO reading gives a rate
  s->entry = &e;
  s->rbuf = std::make_unique<std::uint8_t[]>(kReadBufferBytes);
  epollSet(s->fd.get(), EPOLLIN, true);
  streamsByFd[s->fd.get()] = s.get();
  e.streams[path].push_back(std::move(s));
}

// ------------------------------------------------------------------ data streams

void TcpDevice::Impl::closeStream(Stream& s) {
  s.dead = true;
  ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, s.fd.get(), nullptr);
  streamsByFd.erase(s.fd.get());
  ::shutdown(s.fd.get(), SHUT_RDWR);
  s.fd.reset();
  s.target = RecvTarget{};
  s.chunk = OutChunk{};
}

void TcpDevice::Impl::failPath(ChannelEntry& e, std::size_t path, const Status& why, bool graceful) {
  for (auto& s : e.streams[path]) {
    if (!s->dead) closeStream(*s);
  }
  e.engine->onPathFailed(path, why, graceful);
}

void TcpDevice::Impl::readStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  std::size_t budget = kReadBudgetBytes;
  // A read shorter than asked for emptied the socket: once its bytes are consumed, stop
  // (epoll is level-triggered and reports what arrives later) instead of paying a
  // recv that only says EAGAIN.
  bool drained = false;
  while (!s.dead && budget > 0) {
    if (s.rpos == s.rlen) {
      if (drained) return;
      s.rpos = s.rlen = 0;
      std::uint8_t* dst = s.rbuf.get();
      std::size_t want = kReadBufferBytes;
      bool direct = false;
      if (s.inPayload) {
        std::uint64_t remaining = s.target.header.length - s.payloadGot;
        if (remaining >= kDirectReadMinBytes) {
          std::uint8_t* p = ch.targetPointer(s.target, s.payloadGot);
          dst = p != nullptr ? p : s.drain;
          want = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, p != nullptr ? remaining : sizeof(s.drain)));
          direct = true;
        }
      }
      ssize_t n = ::recv(s.fd.get(), dst, want, 0);
      if (n == 0) {
        bool midFrame = s.inPayload || s.refPending || s.headerGot > 0 || s.rpos < s.rlen;
        bool graceful = s.gotClose && !midFrame;
        failPath(e, s.path,
                 midFrame ? peerError("connection closed by rank {} in the middle of a frame (truncated)", e.peerRank)
                          : peerError("connection closed by rank {}", e.peerRank),
                 graceful);
        return;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        failPath(e, s.path, pathError("receive from rank {}: {}", e.peerRank, errnoText(errno)), false);
        return;
      }
      budget -= std::min<std::size_t>(budget, static_cast<std::size_t>(n));
      drained = static_cast<std::size_t>(n) < want;
      if (direct) {
        s.payloadGot += static_cast<std::uint64_t>(n);
      } else {
        s.rlen = static_cast<std::size_t>(n);
      }
    }
    // Consume buffered bytes (and finish a chunk completed by a direct read).
    while (!s.dead) {
      if (s.refPending) {
        if (!s.takeBuffered(s.refIn, &s.refGot, kRemoteRefBytes)) break;
        s.refPending = false;
        if (!readDirectChunk(s)) return;
      } else if (!s.inPayload) {
        if (!s.takeBuffered(s.header, &s.headerGot, kFrameHeaderBytes)) break;
        s.headerGot = 0;
        auto h = decodeFrameHeader(std::span<const std::uint8_t>(s.header, kFrameHeaderBytes));
        if (!h) {
          MLOG_ERROR(kTransport, "bad frame from rank {} on path {}: {}; closing the connection", e.peerRank, s.path,
                     h.status().message());
          failPath(e, s.path, h.status(), false);
          return;
        }
        if (h->type == FrameType::kAck) {
          Status st = ch.onAck(h.value(), s.path, nowUs());
          if (!st.isOk()) {
            MLOG_ERROR(kTransport, "rank {}: {}; closing the connection", e.peerRank, st.message());
            failPath(e, s.path, st, false);
            return;
          }
          continue;
        }
        if (h->type == FrameType::kClose) {
          s.gotClose = true;
          continue;
        }
        if (h->type == FrameType::kDataRef) {
          if (e.readPid <= 0) {
            Status st = peerError("rank {} sent a chunk to read from its memory, but this channel does not read it",
                                  e.peerRank);
            MLOG_ERROR(kTransport, "{}; closing the connection", st.message());
            failPath(e, s.path, st, false);
            return;
          }
          s.refHeader = h.value();
          s.refHeader.type = FrameType::kData;
          s.refGot = 0;
          s.refPending = true;
          continue;
        }
        if (!beginChunk(s, h.value())) return;
      }
      if (s.payloadGot < s.target.header.length) {
        if (s.rpos == s.rlen) break;
        std::size_t take = static_cast<std::size_t>(
            std::min<std::uint64_t>(s.target.header.length - s.payloadGot, s.rlen - s.rpos));
        if (std::uint8_t* p = ch.targetPointer(s.target, s.payloadGot)) std::memcpy(p, s.rbuf.get() + s.rpos, take);
        s.rpos += take;
        s.payloadGot += take;
        if (s.payloadGot < s.target.header.length) break;
      }
      auto ack = ch.onDataComplete(s.target, s.path);
      s.inPayload = false;
      s.target = RecvTarget{};
      if (!ack) {
        failChannel(e, s.path, ack.status());
        return;
      }
      auto bytes = encodeFrameHeader(ack.value());
      if (s.ctrlDone == s.ctrl.size()) s.ctrlSinceUs = nowUs();
      s.ctrl.insert(s.ctrl.end(), bytes.begin(), bytes.end());
      if (ack->length >= kUrgentAckChunkBytes) s.ctrlUrgent = true;
    }
  }
}

void TcpDevice::Impl::failChannel(ChannelEntry& e, std::size_t path, const Status& why) {
  MLOG_ERROR(kTransport, "rank {}: {}", e.peerRank, why.message());
  e.engine->fail(why);
  failPath(e, path, why, false);
}

bool TcpDevice::Impl::beginChunk(Stream& s, const FrameHeader& h) {
  auto t = s.entry->engine->onDataHeader(h, s.path);
  if (!t) {
    failChannel(*s.entry, s.path, t.status());
    return false;
  }
  s.target = std::move(t.value());
  s.payloadGot = 0;
  s.inPayload = true;
  return true;
}

bool TcpDevice::Impl::readDirectChunk(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  if (!beginChunk(s, s.refHeader)) return false;
  // A duplicate of a finished message has no target: its sender may own the buffer again.
  if (std::uint8_t* p = ch.targetPointer(s.target, 0); p != nullptr && s.target.header.length > 0) {
    const RemoteRef ref = decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes>(s.refIn));
    Status st = ref.key == 0 ? readDirect(e.readPid, p, ref.address, s.target.header.length)
                             : peerError("rank {} sent a remote-read key {:#x}; same-host reads take none", e.peerRank,
                                         ref.key);
    if (!st.isOk()) {
      failChannel(e, s.path, st.withContext(fmt::format("chunk of message {}", s.target.header.seq)));
      return false;
    }
    directReadBytes->add(s.target.header.length);
  }
  s.payloadGot = s.target.header.length;  // the payload is in: the frame completes as a kData one would
  return true;
}

void TcpDevice::Impl::flushStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  // A failed channel's messages were aborted, not acknowledged: finishing a half-written
  // frame (with zeros) would hand the peer bytes it has not seen. Its streams are closed
  // by progressChannels instead.
  if (ch.failed()) return;
  while (!s.dead) {
    iovec iov[3];
    int iovcnt = 0;
    if (!s.writing) {
      bool ctrlPending = s.ctrlDone < s.ctrl.size();
      if (!ctrlPending) {
        s.ctrl.clear();
        s.ctrlDone = 0;
        s.ctrlUrgent = false;
      }
      if (ch.nextChunk(s.path, &s.chunk)) {
        const FrameHeader h = ch.chunkHeader(s.chunk);
        s.chunkHeader = encodeFrameHeader(h);
        s.writing = true;
        s.written = 0;
        s.writingRef = h.type == FrameType::kDataRef;
        if (s.writingRef) s.refOut = encodeRemoteRef(ch.chunkRef(s.chunk));
        s.frameBytes = kFrameHeaderBytes + (s.writingRef ? kRemoteRefBytes : h.length);
      } else if (ctrlPending && !s.ctrlUrgent && s.ctrl.size() - s.ctrlDone < kAckBatchBytes &&
                 nowUs() - s.ctrlSinceUs < kAckDelayUs) {
        // Acks of small messages wait briefly for company (data or more acks): their
        // senders completed already (eager), and the receiver returns sooner.
        break;
      }
    }
    // Control frames go first and never inside a data frame; a data frame that has not
    // started rides in the same sendmsg (one syscall, one segment for the peer to read).
    std::size_t ctrlBytes = 0;
    if (s.ctrlDone < s.ctrl.size() && (!s.writing || s.written == 0)) {
      ctrlBytes = s.ctrl.size() - s.ctrlDone;
      iov[iovcnt++] = {s.ctrl.data() + s.ctrlDone, ctrlBytes};
    }
    if (s.writing) {
      if (s.written < kFrameHeaderBytes) {
        iov[iovcnt++] = {s.chunkHeader.data() + s.written, kFrameHeaderBytes - s.written};
      }
      std::uint64_t payloadDone = s.written > kFrameHeaderBytes ? s.written - kFrameHeaderBytes : 0;
      if (payloadDone < s.frameBytes - kFrameHeaderBytes) {
        if (s.writingRef) {
          iov[iovcnt++] = {s.refOut.data() + payloadDone, kRemoteRefBytes - payloadDone};
        } else {
          std::size_t n = 0;
          const std::uint8_t* p = ch.chunkPayload(s.chunk, payloadDone, &n);
          iov[iovcnt++] = {const_cast<std::uint8_t*>(p), n};
        }
      }
    }
    if (iovcnt == 0) break;
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<std::size_t>(iovcnt);
    ssize_t n = ::sendmsg(s.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!s.wantOut) {
          s.wantOut = true;
          epollSet(s.fd.get(), EPOLLIN | EPOLLOUT, false);
        }
        return;
      }
      failPath(e, s.path, pathError("send to rank {}: {}", e.peerRank, errnoText(errno)), false);
      return;
    }
    std::size_t sent = static_cast<std::size_t>(n);
    const std::size_t toCtrl = std::min(sent, ctrlBytes);
    s.ctrlDone += toCtrl;
    sent -= toCtrl;
    if (sent > 0) {
      s.written += static_cast<std::uint64_t>(sent);
      if (s.written == s.frameBytes) {
        ch.onChunkWritten(s.path, s.chunk, nowUs());
        s.writing = false;
        s.chunk = OutChunk{};
      }
    }
  }
  if (s.wantOut && !s.dead) {
    s.wantOut = false;
    epollSet(s.fd.get(), EPOLLIN, false);
  }
}

void TcpDevice::Impl::readTcpInfo(ChannelEntry& e) {
  auto& reg = MetricsRegistry::global();
  e.tcpGauges.resize(e.streams.size());
  for (std::size_t p = 0; p < e.streams.size(); ++p) {
    PathTelemetry f;
    for (const auto& s : e.streams[p]) {
      if (s->dead) continue;
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (::getsockopt(s->fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
      f.rttUs = std::max(f.rttUs, static_cast<double>(info.tcpi_rtt));
      f.deliveryBytesPerSec += static_cast<double>(info.tcpi_delivery_rate);
      f.unitsResent += info.tcpi_total_retrans;
      f.unitsSent += info.tcpi_segs_out;
      limitUnsent(*s, static_cast<double>(info.tcpi_delivery_rate));
    }
    if (f.rttUs < 0) continue;
    e.engine->setPathTelemetry(p, f);
    ChannelEntry::TcpGauges& g = e.tcpGauges[p];
    if (g.rttSeconds == nullptr) {
      const MetricLabels labels = e.engine->pathLabels(p);
      g.rttSeconds = &reg.gauge("meridian_transport_path_tcp_rtt_seconds",
                                "Smoothed RTT the kernel measures on a path's data streams (TCP_INFO; largest stream)",
                                labels);
      g.deliveryBytesPerSec =
          &reg.gauge("meridian_transport_path_tcp_delivery_rate_bytes_per_second",
                     "Delivery rate the kernel measures on a path's data streams (TCP_INFO; summed)", labels);
      g.retransmits = &reg.gauge("meridian_transport_path_tcp_retransmits",
                                 "Segments the kernel retransmitted on a path's data streams so far (TCP_INFO)", labels);
    }
    g.rttSeconds->set(f.rttUs * 1e-6);
    g.deliveryBytesPerSec->set(f.deliveryBytesPerSec);
    g.retransmits->set(static_cast<double>(f.unitsResent));
  }
}

void TcpDevice::Impl::limitUnsent(Stream& s, double deliveryBytesPerSec) {
  if (options.tcp.notsentLowatBytes <= 0) return;
  const double want = std::max(static_cast<double>(options.tcp.notsentLowatBytes), deliveryBytesPerSec * kNotsentHorizonSec);
  const int lowat = static_cast<int>(std::min(want, static_cast<double>(1 << 30)));
  // Only changes of 2x or more: the delivery rate moves all the time.
  if (lowat >= 2 * s.notsentLowat || 2 * lowat <= s.notsentLowat) {
    if (setNotsentLowat(s.fd.get(), lowat)) s.notsentLowat = lowat;
  }
}

void TcpDevice::Impl::progressChannels() {
  std::int64_t now = nowUs();
  bool stallCheck = now - lastStallCheckUs > 20'000;
  if (stallCheck) lastStallCheckUs = now;
  const bool tcpInfo = now - lastTcpInfoUs > kTcpInfoPeriodUs;
  if (tcpInfo) lastTcpInfoUs = now;
  for (auto& e : channels) {
    if (!e->ready) continue;
    ChannelEngine& ch = *e->engine;
    if (ch.failed()) {
      for (std::size_t p = 0; p < e->streams.size(); ++p) {
        if (std::any_of(e->streams[p].begin(), e->streams[p].end(), [](auto& s) { return !s->dead; })) {
          failPath(*e, p, e->channel->health(), true);
        }
      }
      continue;
    }
    if (stallCheck) ch.checkStalls(now);
    if (tcpInfo) readTcpInfo(*e);
    ch.schedule(now);
    for (auto& path : e->streams) {
      for (auto& s : path) {
        if (!s->dead) flushStream(*s);
      }
    }
  }
}

void TcpDevice::Impl::processEvents(const epoll_event* events, int n) {
  // Posts since the last round go in first (once per round), so data lands in place.
  for (auto& e : channels) {
    if (e->ready && !e->engine->failed()) e->engine->drainPosted();
  }
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    std::uint32_t ev = events[i].events;
    if (fd == waker->fd.get()) {
      std::uint64_t v;
      ssize_t rc = ::read(waker->fd.get(), &v, sizeof(v));
      (void)rc;
      waker->pending.store(false, std::memory_order_release);
      continue;
    }
    bool isListener = false;
    for (std::size_t l = 0; l < listeners.size(); ++l) {
      if (listeners[l].get() == fd) {
        acceptAll(l);
        isListener = true;
      }
    }
    if (isListener) continue;
    if (auto hs = handshakes.find(fd); hs != handshakes.end()) {
      stepHandshake(*hs->second, ev);
      continue;
    }
    if (auto r = relaysByFd.find(fd); r != relaysByFd.end()) {
      stepRelay(*r->second);
      continue;
    }
    // Another thread may have handled this event already (and even closed the fd):
    // handlers find nothing to read or write then.
    auto st = streamsByFd.find(fd);
    if (st == streamsByFd.end()) continue;
    Stream& s = *st->second;
    if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) readStream(s);
    if (!s.dead && (ev & EPOLLOUT)) flushStream(s);
  }
  std::vector<std::function<void()>> cmds;
  {
    std::lock_guard lock(cmdMu);
    cmds.swap(commands);
  }
  for (auto& c : cmds) c();
  progressChannels();
}

bool Poller::pollOnce(bool* ran) {
  lastPollUs.store(nowUs(), std::memory_order_relaxed);
  std::unique_lock lock(mu, std::try_to_lock);
  if (ran != nullptr) *ran = lock.owns_lock() && impl != nullptr;
  if (!lock.owns_lock() || impl == nullptr) return false;
  epoll_event events[64];
  int n = ::epoll_wait(impl->epfd.get(), events, 64, 0);
  impl->processEvents(events, std::max(n, 0));
  return n > 0;
}

void TcpDevice::Impl::loop() {
  std::string threadName = "mer-tcp-" + options.name;
  threadName.resize(std::min<std::size_t>(threadName.size(), 15));
  pthread_setname_np(pthread_self(), threadName.c_str());
  epoll_event events[64];
  while (running.load(std::memory_order_acquire)) {
    const bool others = poller->othersPolling();
    if (others) {
      // Threads in Request::wait or test are making progress: stay out of their way (two
      // threads taking turns at one engine only wake each other), but look in now and then
      // (timers, and in case they stop without new work).
      std::unique_lock idle(poller->idleMu);
      poller->idleCv.wait_for(idle, std::chrono::milliseconds(2), [&] {
        return !poller->othersPolling() || !running.load(std::memory_order_acquire);
      });
    }
    int n = ::epoll_wait(epfd.get(), events, 64, others ? 0 : 10);
    std::lock_guard lock(poller->mu);
    processEvents(events, std::max(n, 0));
    // Expire handshakes and streams nobody claimed.
    TimePoint now = Clock::now();
    for (auto it = handshakes.begin(); it != handshakes.end();) {
      auto next = std::next(it);
      if (it->second->deadline < now) {
        MLOG_WARN(kTransport, "refused connection from {}: handshake timed out", it->second->peer);
        ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, it->first, nullptr);
        handshakes.erase(it);
      }
      it = next;
    }
    std::erase_if(unclaimed, [&](const UnclaimedStream& u) {
      if (u.deadline >= now) return false;
      MLOG_WARN(kTransport, "closing a stream from rank {} (session {:x}) that no channel claimed", u.info.rank,
                u.info.sessionId);
      return true;
    });
  }
  std::lock_guard lock(poller->mu);
  shutdownAll();
  poller->impl = nullptr;
}

void TcpDevice::Impl::sayGoodbye(Stream& s) {
  // Only between frames: finish pending control frames first; a data frame cut midway gets
  // no CLOSE (the peer then sees an abrupt end, which is the truth).
  if (s.writing && s.written > 0) return;
  FrameHeader close;
  close.type = FrameType::kClose;
  auto bytes = encodeFrameHeader(close);
  s.ctrl.insert(s.ctrl.end(), bytes.begin(), bytes.end());
  (void)sendAll(s.fd.get(), s.ctrl.data() + s.ctrlDone, s.ctrl.size() - s.ctrlDone,
                Clock::now() + std::chrono::milliseconds(200));
}

void TcpDevice::Impl::shutdownAll() {
  // Say goodbye on every stream so peers know the close is on purpose, then close.
  for (auto& e : channels) {
    for (auto& path : e->streams) {
      for (auto& s : path) {
        if (s->dead) continue;
        sayGoodbye(*s);
        ::shutdown(s->fd.get(), SHUT_WR);
      }
    }
    e->engine->fail(commError("the transport device was closed"));
  }
  relaysByFd.clear();
  relays.clear();
}

// ------------------------------------------------------------------ public API

TcpDevice::TcpDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpDevice::~TcpDevice() {
  if (impl_ && impl_->thread.joinable()) {
    // Eager sends completed for their callers before the peer had them: deliver what is
    // still unacknowledged before closing (bounded, in case a peer is gone).
    impl_->runOnProgress([&] {
      for (auto& e : impl_->channels) e->engine->refuseNewPosts(commError("the transport device is closing"));
    });
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      bool busy = false;
      impl_->runOnProgress([&] {
        for (auto& e : impl_->channels) {
          if (e->ready && !e->engine->failed() && e->engine->hasUnackedEagerSends()) busy = true;
        }
      });
      if (!busy) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    impl_->running.store(false, std::memory_order_release);
    {
      std::lock_guard lock(impl_->poller->idleMu);
      impl_->poller->idleCv.notify_all();
    }
    impl_->wake();
    impl_->thread.join();
  }
}

Result<std::unique_ptr<TcpDevice>> TcpDevice::create(DeviceOptions options) {
  auto impl = std::make_unique<Impl>();
  try {
    if (options.tcp.streamsPerPath <= 0) options.tcp.streamsPerPath = static_cast<int>(knobInt(knobs::kTcpStreams, 1, 16));
    if (options.tcp.socketBufferBytes <= 0) {
      options.tcp.socketBufferBytes = static_cast<int>(knobInt(knobs::kTcpSockBufBytes, 0, 1 << 30));
    }
    if (options.tcp.notsentLowatBytes < 0) {
      options.tcp.notsentLowatBytes = static_cast<int>(knobInt(knobs::kTcpNotsentLowatBytes, 0, 1 << 30));
    }
    if (options.chunkBytes == 0) {
      options.chunkBytes = static_cast<std::size_t>(knobInt(knobs::kChunkBytes, 4096, kMaxChunkBytes));
    }
    if (options.pathStallMs <= 0) options.pathStallMs = static_cast<int>(knobInt(knobs::kPathStallMs, 1, 3'600'000));
    impl->maxUnexpectedBytes = static_cast<std::uint64_t>(knobInt(knobs::kMaxUnexpectedBytes, 0, INT64_MAX));
    impl->unclaimedTimeout = std::chrono::milliseconds(knobInt(knobs::kTimeoutMs, 1, INT64_MAX));
    if (options.secret.empty()) options.secret = loadJobSecret();
  } catch (const ConfigError& e) {
    return invalidArgument("{}", e.what());
  }
  if (options.tcp.streamsPerPath > 16) return invalidArgument("at most 16 streams per path, not {}", options.tcp.streamsPerPath);
  if (options.chunkBytes > kMaxChunkBytes) return invalidArgument("chunk size {} over {}", options.chunkBytes, kMaxChunkBytes);
  if (options.localAddresses.empty()) return invalidArgument("a TCP device needs at least one local address");
  if (options.localAddresses.size() > 64) return invalidArgument("at most 64 paths");
  for (const auto& addr : options.localAddresses) {
    std::string ip = addr;
    std::uint16_t port = 0;
    if (addr.find(':') != std::string::npos) {
      auto hp = parseHostPort(addr);
      if (!hp) return hp.status();
      ip = hp->host;
      port = hp->port;
    }
    auto fd = listenOn(ip, port, true);
    if (!fd) return fd.status().withContext("TCP device");
    impl->listenAddrs.push_back(localAddress(fd->get()));
    impl->localIps.push_back(ip);
    impl->listeners.push_back(std::move(fd.value()));
  }
  MERIDIAN_ASSIGN_OR_RETURN(impl->endpointName, encodeEndpoint(impl->listenAddrs));
  impl->options = std::move(options);
  impl->relayedBytes = &MetricsRegistry::global().counter(
      "meridian_transport_relayed_bytes_total", "Bytes this rank forwarded on relay paths between two other ranks",
      {{"device", impl->options.name}});
  impl->directReadBytes = &MetricsRegistry::global().counter(
      "meridian_transport_direct_read_bytes_total",
      "Message bytes this rank read straight from the memory of peers on its host (MERIDIAN_DIRECT_READ)",
      {{"device", impl->options.name}});
  impl->epfd.reset(::epoll_create1(EPOLL_CLOEXEC));
  impl->waker->fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->epfd.valid() || !impl->waker->fd.valid()) return internalError("epoll/eventfd: {}", errnoText(errno));
  impl->epollSet(impl->waker->fd.get(), EPOLLIN, true);
  for (auto& l : impl->listeners) impl->epollSet(l.get(), EPOLLIN, true);
  Impl* raw = impl.get();
  impl->poller->impl = raw;
  impl->thread = std::thread([raw] { raw->loop(); });
  MLOG_INFO(kTransport, "TCP device {} listening on {} ({} streams per path)", raw->options.name,
            fmt::join(raw->listenAddrs, ", "), raw->options.tcp.streamsPerPath);
  return std::unique_ptr<TcpDevice>(new TcpDevice(std::move(impl)));
}

const std::vector<std::string>& TcpDevice::listenAddresses() const { return impl_->listenAddrs; }

const EndpointName& TcpDevice::endpoint() const { return impl_->endpointName; }

DeviceCaps TcpDevice::caps() const {
  DeviceCaps c;
  c.relay = impl_->options.relaySlot;
  c.remoteRead = impl_->options.directRead;
  c.needsRegistration = false;
  return c;
}

std::string TcpDevice::describe(std::span<const std::uint8_t> endpoint) const {
  auto addresses = decodeEndpoint(endpoint);
  return addresses ? fmt::format("{}", fmt::join(addresses.value(), ", ")) : addresses.status().message();
}

void TcpDevice::planDirectRead(std::uint64_t sessionId, int peerRank, DirectReadPlan plan) {
  std::lock_guard lock(impl_->planMu);
  impl_->directPlans[{sessionId, peerRank}] = plan;
}

Result<GroupInfo> TcpDevice::joinGroup(GroupExchange& exchange, std::uint64_t sessionId, TimePoint deadline) {
  const int rank = exchange.rank();
  const auto n = static_cast<std::size_t>(exchange.size());
  const bool enabled = impl_->options.directRead;
  const std::string offer = enabled ? encodeDirectReadOffer(localDirectReadOffer()) : "";
  auto asBytes = [](const std::string& v) {
    return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(v.data()), v.size());
  };
  MERIDIAN_ASSIGN_OR_RETURN(auto offers, exchange.allGather("direct-offer", asBytes(offer), deadline));
  if (offers.size() != n) return internalError("the exchange returned {} offers for {} ranks", offers.size(), n);
  std::vector<std::int64_t> readPid(n, 0);
  std::string readable(n, '0');
  for (std::size_t peer = 0; peer < n; ++peer) {
    if (!enabled || peer == static_cast<std::size_t>(rank) || offers[peer].empty()) continue;
    auto o = decodeDirectReadOffer(offers[peer]);
    if (!o) return o.status().withContext(fmt::format("rank {}'s direct-read offer", peer));
    if (canReadDirect(o.value())) {
      readPid[peer] = o->pid;
      readable[peer] = '1';
    }
  }
  MERIDIAN_ASSIGN_OR_RETURN(auto reads, exchange.allGather("direct-reads", asBytes(readable), deadline));
  GroupInfo info;
  info.everyPairReadsDirect = enabled && n > 1;
  for (std::size_t peer = 0; peer < n; ++peer) {
    if (peer >= reads.size() || reads[peer].size() != n) {
      return peerError("rank {} published a direct-read mask of {} entries for {} ranks", peer,
                       peer < reads.size() ? reads[peer].size() : 0, n);
    }
    for (std::size_t q = 0; q < n; ++q) info.everyPairReadsDirect = info.everyPairReadsDirect && (q == peer || reads[peer][q] == '1');
  }
  for (std::size_t peer = 0; peer < n; ++peer) {
    if (peer == static_cast<std::size_t>(rank)) continue;
    DirectReadPlan plan{readPid[peer], enabled && reads[peer][static_cast<std::size_t>(rank)] == '1'};
    if (plan.readPeerPid > 0) ++info.directPeers;
    planDirectRead(sessionId, static_cast<int>(peer), plan);
  }
  if (info.directPeers > 0) MLOG_INFO(kTransport, "rank {} reads {} same-host peer(s) directly", rank, info.directPeers);
  return info;
}

Result<MemoryRegion> TcpDevice::registerMemory(const void* base, std::size_t bytes) {
  if (base == nullptr && bytes > 0) return invalidArgument("registering a null range of {} bytes", bytes);
  return MemoryRegion{base, bytes, 0};
}

Status TcpDevice::deregisterMemory(const MemoryRegion& region) {
  (void)region;  // nothing was registered
  return Status::ok();
}

Result<ChannelPtr> TcpDevice::openChannel(const ChannelSpec& spec, TimePoint deadline) {
  Impl& d = *impl_;
  if (spec.peerRank == spec.selfRank) return invalidArgument("openChannel: a channel to oneself (rank {})", spec.selfRank);
  auto peerAddresses = decodeEndpoint(spec.peer);
  if (!peerAddresses) return peerAddresses.status().withContext(fmt::format("openChannel: rank {}'s endpoint", spec.peerRank));
  std::size_t nPaths = std::min(d.localIps.size(), peerAddresses->size());
  std::vector<PathEndpoints> endpoints;
  for (std::size_t p = 0; p < nPaths; ++p) endpoints.push_back({d.listenAddrs[p], (*peerAddresses)[p]});
  DirectReadPlan direct;
  {
    std::lock_guard lock(d.planMu);
    if (auto it = d.directPlans.find({spec.sessionId, spec.peerRank}); it != d.directPlans.end()) direct = it->second;
  }
  auto entry = d.makeEntry(spec.sessionId, spec.peerRank, std::move(endpoints), *peerAddresses, direct.peerReadsDirect);
  entry->readPid = direct.readPeerPid;
  ChannelEntry* e = entry.get();

  if (spec.initiate) {
    std::vector<std::pair<std::size_t, UniqueFd>> fds;
    for (std::size_t p = 0; p < nPaths; ++p) {
      auto remote = parseHostPort((*peerAddresses)[p]);
      if (!remote) return remote.status();
      for (int s = 0; s < d.options.tcp.streamsPerPath; ++s) {
        auto fd = connectTo(remote.value(), d.localIps[p], deadline);
        if (!fd) return fd.status().withContext(fmt::format("path {} to rank {}", p, spec.peerRank));
        const ConnectInfo info = dataStreamInfo(spec.sessionId, spec.selfRank, p, s, d.options.tcp.streamsPerPath, nPaths);
        Status st = clientHandshake(fd->get(), d.options.secret, info, deadline);
        if (!st.isOk()) return st.withContext(fmt::format("path {} to rank {}", p, spec.peerRank));
        fds.emplace_back(p, std::move(fd.value()));
      }
    }
    d.runOnProgress([&] {
      for (auto& [p, fd] : fds) d.attachStream(*e, std::move(fd), p);
      for (std::size_t p = 0; p < nPaths; ++p) e->expectedStreams[p] = d.options.tcp.streamsPerPath;
      e->ready = true;
      d.channels.push_back(std::move(entry));
    });
  } else {
    d.runOnProgress([&] {
      d.channels.push_back(std::move(entry));
      d.claimStreams();
    });
    std::unique_lock lock(d.cmdMu);
    if (!d.cmdCv.wait_until(lock, deadline, [&] { return e->ready; })) {
      lock.unlock();
      d.runOnProgress([&] { e->engine->fail(timeoutError("channel to rank {} never connected", spec.peerRank)); });
      return timeoutError("rank {} did not connect all its streams before the deadline (session {:x})", spec.peerRank,
                          spec.sessionId);
    }
  }
  MLOG_DEBUG(kTransport, "channel to rank {} open over {} path(s)", spec.peerRank, nPaths);
  return ChannelPtr(e->channel);
}

std::unique_ptr<ChannelEntry> TcpDevice::Impl::makeEntry(std::uint64_t sessionId, int peerRank,
                                                        std::vector<PathEndpoints> endpoints,
                                                        std::vector<std::string> peerAddresses, bool peerReadsDirect) {
  auto entry = std::make_unique<ChannelEntry>();
  entry->sessionId = sessionId;
  entry->peerRank = peerRank;
  entry->directPaths = endpoints.size();
  entry->peerAddresses = std::move(peerAddresses);
  if (options.relaySlot) endpoints.push_back({"", "relay", true});
  entry->streams.resize(endpoints.size());
  entry->expectedStreams.assign(endpoints.size(), 0);
  MultipathConfig config = channelConfig();
  config.peerReadsDirect = peerReadsDirect;
  if (options.labelPeersByHost && !endpoints.empty()) {
    auto hp = parseHostPort(endpoints.front().remoteAddress);
    config.peerLabel = hp ? hp->host : endpoints.front().remoteAddress;
  }
  EngineChannel ec = makeMultipathChannel(peerRank, std::move(endpoints), std::move(config),
                                          [w = waker] { w->ring(); }, poller);
  entry->channel = std::move(ec.channel);
  entry->engine = std::move(ec.engine);
  return entry;
}

Result<std::pair<int, ChannelPtr>> TcpDevice::Impl::acceptAny(std::uint64_t sessionId) {
  // Streams of this session from peers without a channel yet, by peer.
  std::map<int, std::vector<const UnclaimedStream*>> byRank;
  for (const auto& u : unclaimed) {
    if (u.info.sessionId == sessionId && findChannel(sessionId, u.info.rank) == nullptr) byRank[u.info.rank].push_back(&u);
  }
  for (const auto& [rank, streams] : byRank) {
    const std::size_t paths = streams.front()->info.pathCount;
    std::vector<int> have(paths, 0), want(paths, 0);
    bool bad = paths == 0 || paths > localIps.size();
    for (const UnclaimedStream* u : streams) {
      if (bad || u->info.pathCount != paths || u->info.pathIndex >= paths) {
        bad = true;
        break;
      }
      ++have[u->info.pathIndex];
      want[u->info.pathIndex] = u->info.streamCount;
    }
    if (bad) {
      MLOG_WARN(kTransport, "closing the streams of rank {} (session {:x}): their path counts disagree or exceed ours",
                rank, sessionId);
      std::erase_if(unclaimed, [&, r = rank](const UnclaimedStream& u) { return u.info.sessionId == sessionId && u.info.rank == r; });
      return againStatus("no peer has connected yet");
    }
    bool complete = true;
    for (std::size_t p = 0; p < paths; ++p) complete = complete && want[p] > 0 && have[p] >= want[p];
    if (!complete) continue;
    std::vector<PathEndpoints> endpoints(paths);
    for (std::size_t p = 0; p < paths; ++p) endpoints[p].localAddress = listenAddrs[p];
    for (const UnclaimedStream* u : streams) endpoints[u->info.pathIndex].remoteAddress = peerAddress(u->fd.get());
    auto entry = makeEntry(sessionId, rank, std::move(endpoints), {});
    for (std::size_t p = 0; p < paths; ++p) entry->expectedStreams[p] = want[p];
    entry->ready = true;
    for (auto it = unclaimed.begin(); it != unclaimed.end();) {
      if (it->info.sessionId == sessionId && it->info.rank == rank) {
        attachStream(*entry, std::move(it->fd), it->info.pathIndex);
        it = unclaimed.erase(it);
      } else {
        ++it;
      }
    }
    ChannelPtr channel = entry->channel;
    const int peer = rank;
    channels.push_back(std::move(entry));
    MLOG_DEBUG(kTransport, "accepted a channel from rank {} (session {:x}) over {} path(s)", peer, sessionId, paths);
    return std::make_pair(peer, std::move(channel));
  }
  return againStatus("no peer has connected every stream yet");
}

Result<std::pair<int, ChannelPtr>> TcpDevice::acceptChannel(std::uint64_t sessionId) {
  Result<std::pair<int, ChannelPtr>> result = againStatus("not run");
  impl_->runOnProgress([&] { result = impl_->acceptAny(sessionId); });
  return result;
}

Status TcpDevice::closeChannel(std::uint64_t sessionId, int peerRank) {
  Impl& d = *impl_;
  auto matches = [&](const std::unique_ptr<ChannelEntry>& e) { return e->sessionId == sessionId && e->peerRank == peerRank; };
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (true) {
    bool busy = false;
    d.runOnProgress([&] {
      for (auto& e : d.channels) {
        if (matches(e) && e->usable() && e->engine->hasUnackedEagerSends()) busy = true;
      }
    });
    if (!busy || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Status result = invalidArgument("no channel to rank {} in session {:x}", peerRank, sessionId);
  d.runOnProgress([&] {
    for (auto it = d.channels.begin(); it != d.channels.end();) {
      if (!matches(*it)) {
        ++it;
        continue;
      }
      for (auto& path : (*it)->streams) {
        for (auto& s : path) {
          if (s->dead) continue;
          d.sayGoodbye(*s);
          d.closeStream(*s);
        }
      }
      (*it)->engine->fail(commError("the channel to rank {} was closed", peerRank));
      it = d.channels.erase(it);  // closes the streams
      result = Status::ok();
    }
  });
  return result;
}

Status TcpDevice::openRelay(const RelaySpec& spec, TimePoint deadline) {
  Impl& d = *impl_;
  if (spec.viaRank == spec.peerRank || spec.viaRank == spec.selfRank || spec.peerRank == spec.selfRank) {
    return invalidArgument("a relay needs three different ranks, not {} -> {} via {}", spec.selfRank, spec.peerRank,
                           spec.viaRank);
  }
  std::size_t slot = 0;
  std::string localIp;
  Status usable = Status::ok();
  d.runOnProgress([&] {
    ChannelEntry* e = d.findChannel(spec.sessionId, spec.peerRank);
    if (e == nullptr || !e->ready) {
      usable = invalidArgument("no open channel to rank {} in session {:x}", spec.peerRank, spec.sessionId);
    } else if (e->streams.size() == e->directPaths) {
      usable = invalidArgument("the channel to rank {} has no relay slot (MERIDIAN_RELAY=off)", spec.peerRank);
    } else if (spec.plane < 0 || static_cast<std::size_t>(spec.plane) >= e->directPaths) {
      usable = invalidArgument("no plane {} to relay on", spec.plane);
    } else if (e->liveStreams(e->directPaths)) {
      usable = againStatus("the relay slot to rank {} is in use", spec.peerRank);
    } else {
      slot = e->directPaths;
      localIp = d.localIps[static_cast<std::size_t>(spec.plane)];
    }
  });
  MERIDIAN_RETURN_IF_ERROR(usable);
  auto viaAddresses = decodeEndpoint(spec.via);
  if (!viaAddresses) return viaAddresses.status().withContext(fmt::format("rank {}'s endpoint", spec.viaRank));
  if (static_cast<std::size_t>(spec.plane) >= viaAddresses->size()) {
    return invalidArgument("rank {} has no plane {}", spec.viaRank, spec.plane);
  }
  const std::string& viaAddress = (*viaAddresses)[static_cast<std::size_t>(spec.plane)];
  auto via = parseHostPort(viaAddress);
  if (!via) return via.status();
  const std::string what = fmt::format("relay to rank {} via rank {} ({})", spec.peerRank, spec.viaRank, viaAddress);
  std::vector<UniqueFd> fds;
  for (int s = 0; s < d.options.tcp.streamsPerPath; ++s) {
    auto fd = connectTo(via.value(), localIp, deadline);
    if (!fd) return fd.status().withContext(what);
    ConnectInfo hop;  // to via: splice me through to the peer
    hop.kind = ConnectionKind::kRelay;
    hop.sessionId = spec.sessionId;
    hop.rank = spec.selfRank;
    hop.pathIndex = static_cast<std::uint16_t>(spec.plane);
    hop.relayTarget = spec.peerRank;
    MERIDIAN_RETURN_IF_ERROR(clientHandshake(fd->get(), d.options.secret, hop, deadline).withContext(what));
    // To the peer, end to end through via.
    ConnectInfo info = dataStreamInfo(spec.sessionId, spec.selfRank, slot, s, d.options.tcp.streamsPerPath, 0);
    info.relayTarget = spec.viaRank;
    MERIDIAN_RETURN_IF_ERROR(clientHandshake(fd->get(), d.options.secret, info, deadline).withContext(what));
    fds.push_back(std::move(fd.value()));
  }
  Status attached = Status::ok();
  d.runOnProgress([&] {
    ChannelEntry* e = d.findChannel(spec.sessionId, spec.peerRank);
    if (e == nullptr || e->liveStreams(slot)) {
      attached = againStatus("{}: the channel failed or its slot was taken meanwhile", what);
      return;
    }
    e->streams[slot].clear();
    for (auto& fd : fds) d.attachStream(*e, std::move(fd), slot);
    e->expectedStreams[slot] = d.options.tcp.streamsPerPath;
    e->engine->onPathUp(slot, spec.viaRank);
  });
  return attached;
}

Status TcpDevice::closeRelay(std::uint64_t sessionId, int peerRank) {
  Status result = Status::ok();
  impl_->runOnProgress([&] {
    ChannelEntry* e = impl_->findChannel(sessionId, peerRank);
    if (e == nullptr || e->streams.size() == e->directPaths || !e->liveStreams(e->directPaths)) {
      result = invalidArgument("no relay is up to rank {} in session {:x}", peerRank, sessionId);
      return;
    }
    for (auto& s : e->streams[e->directPaths]) {
      if (!s->dead) impl_->sayGoodbye(*s);
    }
    impl_->failPath(*e, e->directPaths, pathError("relay closed"), true);
  });
  return result;
}

Status TcpDevice::cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) {
  Status result = invalidArgument("no channel to rank {} in session {:x} with path {}", peerRank, sessionId, pathIndex);
  impl_->runOnProgress([&] {
    for (auto& e : impl_->channels) {
      if (e->sessionId == sessionId && e->peerRank == peerRank && pathIndex >= 0 &&
          static_cast<std::size_t>(pathIndex) < e->streams.size()) {
        impl_->failPath(*e, static_cast<std::size_t>(pathIndex), pathError("path {} cut on purpose", pathIndex), false);
        result = Status::ok();
      }
    }
  });
  return result;
}

}  // namespace meridian::transport::tcp
