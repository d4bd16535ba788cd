// The TCP device's event loop: epoll, the progress lock, and each round of progress.
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

void TcpDevice::Impl::progressChannels() {
  std::int64_t now = nowUs();
  bool stallCheck = now - lastStallCheckUs > 20'000;
  if (stallCheck) lastStallCheckUs = now;
  const bool tcpInfo = now - lastTcpInfoUs > kTcpInfoPeriodUs;
  if (tcpInfo) lastTcpInfoUs = now;
  std::size_t liveShm = 0;
  for (auto& e : channels) {
    if (!e->ready) continue;
    ChannelEngine& ch = *e->engine;
    if (ch.failed()) {
      for (std::size_t p = 0; p < e->streams.size(); ++p) {
        if (std::any_of(e->streams[p].begin(), e->streams[p].end(), [](auto& s) { return !s->dead; })) {
          failPath(*e, p, e->channel->health(), true);
        }
      }
      for (auto& fp : e->fabric) {
        if (fp && !fp->failed()) fp->fail(e->channel->health());
      }
      if (e->shm && !e->shm->failed()) e->shm->fail(e->channel->health());
      continue;
    }
    if (stallCheck) ch.checkStalls(now);
    if (tcpInfo) readTcpInfo(*e);
    receiveShmPath(*e, now);
    ch.schedule(now);
    for (auto& path : e->streams) {
      for (auto& s : path) {
        if (!s->dead) flushStream(*s);
      }
    }
    pumpFabricPaths(*e, now);
    sendShmPath(*e, now);
    if (e->shm && !e->shm->failed()) ++liveShm;
  }
  liveShmPaths = liveShm;
}

bool TcpDevice::Impl::processEvents(const epoll_event* events, int n) {
  // Posts since the last round go in first (once per round), so data lands in place.
  for (auto& e : channels) {
    if (e->ready && !e->engine->failed()) e->engine->drainPosted();
  }
  bool worked = progressRails() > 0;
  shmWork = 0;
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    std::uint32_t ev = events[i].events;
    if (std::any_of(rails.begin(), rails.end(), [fd](const auto& r) { return r->waitFd() == fd; })) continue;
    worked = true;
    if (fd == waker->fd.get()) {
      std::uint64_t v;
      // EAGAIN: another thread drained it first.
      if (::read(waker->fd.get(), &v, sizeof(v)) < 0 && errno != EAGAIN) {
        MLOG_ERROR(kTransport, "reading the progress thread's doorbell: {}", errnoText(errno));
      }
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
    if (takeShmPeerExit(fd)) continue;
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
  return worked || !cmds.empty() || shmWork > 0;
}

bool Poller::pollOnce(bool* ran) {
  lastPollUs.store(nowUs(), std::memory_order_relaxed);
  std::unique_lock lock(mu, std::try_to_lock);
  if (ran != nullptr) *ran = lock.owns_lock() && impl != nullptr;
  if (!lock.owns_lock() || impl == nullptr) return false;
  epoll_event events[64];
  // With shared-memory paths a waiting thread's polls mostly find their work in the rings:
  // the kernel is asked about the sockets on every kShmPollsPerEpoll-th poll only (a system
  // call each, a third of a small message's round trip here).
  int n = 0;
  if (impl->liveShmPaths == 0 || ++polls % kShmPollsPerEpoll == 0) n = ::epoll_wait(impl->epfd.get(), events, 64, 0);
  return impl->processEvents(events, std::max(n, 0));
}

void TcpDevice::Impl::loop() {
  std::string threadName = "mer-tcp-" + options.name;
  threadName.resize(std::min<std::size_t>(threadName.size(), 15));
  pthread_setname_np(pthread_self(), threadName.c_str());
  epoll_event events[64];
  try {
    runRounds(events);
  } catch (const std::exception& ex) {
    // Nothing on this thread throws by design; if something does (an allocation), the device
    // stops moving data: every channel fails with the reason, and the process lives on.
    MLOG_ERROR(kTransport, "TCP device {}: the progress thread stopped: {}", options.name, ex.what());
    std::lock_guard lock(poller->mu);
    for (auto& e : channels) e->engine->fail(commError("the transport's progress thread stopped: {}", ex.what()));
  }
  std::lock_guard lock(poller->mu);
  shutdownAll();
  poller->impl = nullptr;
}

void TcpDevice::Impl::runRounds(epoll_event* events) {
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
    int sleepMs = others ? 0 : 10;
    if (sleepMs > 0 && (!rails.empty() || shmEnabled())) {
      std::lock_guard lock(poller->mu);
      sleepMs = shmSleepMs(railSleepMs(sleepMs));
    }
    int n = ::epoll_wait(epfd.get(), events, 64, sleepMs);
    if (n < 0 && errno != EINTR) MLOG_ERROR(kTransport, "epoll_wait: {}", errnoText(errno));
    std::lock_guard lock(poller->mu);
    if (sleepMs > 0 && shmEnabled()) shmAwake();
    processEvents(events, std::max(n, 0));
    // Expire handshakes and streams nobody claimed.
    TimePoint now = Clock::now();
    expireHandshakes(now);
    std::erase_if(unclaimed, [&](const UnclaimedStream& u) {
      if (u.deadline >= now) return false;
      MLOG_WARN(kTransport, "closing a stream from rank {} (session {:x}) that no channel claimed", u.info.rank,
                u.info.sessionId);
      return true;
    });
  }
}

void TcpDevice::Impl::shutdownAll() {
  // Say goodbye on every stream so peers know the close is on purpose, then close.
  for (auto& e : channels) {
    for (auto& path : e->streams) {
      for (auto& s : path) {
        if (s->dead) continue;
        sayGoodbye(*s);
        shutdownStream(s->fd.get(), SHUT_WR);
      }
    }
    closeFabricPaths(*e);
    closeShmPath(*e);
    e->engine->fail(commError("the transport device was closed"));
  }
  relaysByFd.clear();
  relays.clear();
}

}  // namespace meridian::transport::tcp
