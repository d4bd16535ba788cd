// The TCP device's acceptor: listeners, the server side of the handshake, claiming streams.
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

void TcpDevice::Impl::acceptAll(std::size_t listenerIndex) {
  PendingConnections& tracker = *pending[listenerIndex];
  while (true) {
    int fd = ::accept4(listeners[listenerIndex].get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        MLOG_LIMITED(refusedLog, kTransport, warn, "accept on {}: {}", listenAddrs[listenerIndex], errnoText(err));
      }
      if (err == EMFILE || err == ENFILE) {  // out of descriptors: the oldest pending handshake makes room
        bool freed = false;
        for (int victim : tracker.expire(tracker.nextDeadline())) {
          epollDel(victim);
          freed = handshakes.erase(victim) > 0 || freed;
        }
        if (freed) continue;
      }
      return;
    }
    auto hs = std::make_unique<PendingHandshake>(options.secret, *options.wireSecurity,
                                                 [this](const ConnectInfo& info) { return admit(info); });
    hs->fd.reset(fd);
    hs->peer = peerAddress(fd);
    const PendingConnections::Admitted admitted = tracker.admit(fd, peerIpv4(fd), Clock::now());
    hs->tracker = &tracker;
    hs->trackedFd = fd;
    hs->deadline = admitted.deadline;
    if (auto evicted = handshakes.find(admitted.evictedFd); evicted != handshakes.end()) {
      MLOG_LIMITED(evictedLog, kTransport, warn, "closed a pending connection from {} on {}: {} (at most {} per address, {} in all)",
                   evicted->second->peer, listenAddrs[listenerIndex], toString(admitted.why),
                   tracker.limits().perSource, tracker.limits().perListener);
      epollDel(admitted.evictedFd);
      handshakes.erase(evicted);
    }
    if (Status st = epollSet(fd, EPOLLIN, true); !st.isOk()) {
      MLOG_LIMITED(refusedLog, kTransport, warn, "dropping a connection from {}: {}", hs->peer, st.message());
      continue;  // hs closes the fd and leaves the tracker
    }
    handshakes[fd] = std::move(hs);
  }
}

void TcpDevice::Impl::expireHandshakes(TimePoint now) {
  for (auto& tracker : pending) {
    for (int fd : tracker->expire(now)) {
      auto it = handshakes.find(fd);
      if (it == handshakes.end()) continue;
      MLOG_LIMITED(timedOutLog, kTransport, warn, "refused connection from {}: timed out waiting for the handshake ({} s)",
                   it->second->peer, std::chrono::duration_cast<std::chrono::seconds>(kHandshakeTimeout).count());
      epollDel(fd);
      handshakes.erase(it);
    }
  }
}

Status TcpDevice::Impl::admit(const ConnectInfo& info) {
  switch (info.kind) {
    case ConnectionKind::kDataStream: return Status::ok();
    case ConnectionKind::kRelay: return checkRelayRequest(info);
    default: return peerError("handshake: a {} connection reached a data listener", static_cast<int>(info.kind));
  }
}

void TcpDevice::Impl::stepHandshake(PendingHandshake& hs, std::uint32_t events) {
  auto drop = [&](const std::string& why) {
    MLOG_LIMITED(refusedLog, kTransport, warn, "refused connection from {}: {}", hs.peer, why);
    epollDel(hs.fd.get());
    handshakes.erase(hs.fd.get());  // destroys hs
  };
  if ((events & (EPOLLERR | EPOLLHUP)) && !(events & EPOLLIN)) return drop("connection closed during the handshake");
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
  auto flushOut = [&]() -> int {  // 1: all sent, 0: the socket is full, -1: closed
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
  while (true) {
    if (hs.outDone < hs.out.size()) {
      const int r = flushOut();
      if (r < 0) {
        return drop(hs.machine.finished() && !hs.machine.result() ? hs.machine.result().status().message()
                                                                   : "closed while being answered");
      }
      if (Status st = epollSet(hs.fd.get(), r == 0 ? EPOLLIN | EPOLLOUT : EPOLLIN, false); !st.isOk()) {
        return drop(st.message());
      }
      if (r == 0) return;
    }
    if (hs.machine.finished()) {
      if (!hs.machine.result()) return drop(hs.machine.result().status().message());
      const ConnectInfo info = hs.machine.result().value();
      if (info.kind == ConnectionKind::kRelay) return startRelay(hs);
      epollDel(hs.fd.get());
      UnclaimedStream u{std::move(hs.fd), info, hs.machine.keys(), Clock::now() + unclaimedTimeout};
      const int key = u.fd.get();
      unclaimed.push_back(std::move(u));
      handshakes.erase(key);  // destroys hs
      claimStreams();
      return;
    }
    const int r = readUpTo(hs.machine.wantBytes());
    if (r < 0) return drop("closed during the handshake");
    if (r == 0) return;
    hs.out = hs.machine.feed(hs.in);
    hs.outDone = 0;
    hs.in.clear();
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
      const std::size_t live = match->liveStreamCount(path);
      if (live > 0 && live >= static_cast<std::size_t>(match->expectedStreams[path])) {
        failPath(*match, path, pathError("relay replaced by a new one"), true);
      }
      if (std::none_of(v.begin(), v.end(), [](const auto& s) { return !s->dead; })) {
        v.clear();
        match->expectedStreams[path] = 0;
      }
    }
    if (match->expectedStreams[path] == 0) match->expectedStreams[path] = it->info.streamCount;
    if (!relayStream && match->liveStreamCount(path) >= static_cast<std::size_t>(match->expectedStreams[path])) {
      // Every stream the peer said it would open is here: another connection claiming to be
      // that rank is not one of them (a second client with the secret, or a replayed
      // connect). Refused, so that nothing it sends can touch the channel.
      MLOG_WARN(kTransport,
                "refused an extra connection claiming rank {} path {} (session {:x}) from {}: the path has all its {} "
                "stream(s)",
                it->info.rank, path, it->info.sessionId, peerAddress(it->fd.get()), match->expectedStreams[path]);
      it = unclaimed.erase(it);
      continue;
    }
    attachStream(*match, std::move(it->fd), path, it->keys);
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
        sendRailNames(*match);
        cmdCv.notify_all();
      }
    }
  }
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
    entry->initiatorRank = rank;
    entry->ready = true;
    for (auto it = unclaimed.begin(); it != unclaimed.end();) {
      if (it->info.sessionId == sessionId && it->info.rank == rank) {
        attachStream(*entry, std::move(it->fd), it->info.pathIndex, it->keys);
        it = unclaimed.erase(it);
      } else {
        ++it;
      }
    }
    sendRailNames(*entry);
    ChannelPtr channel = entry->channel;
    const int peer = rank;
    channels.push_back(std::move(entry));
    MLOG_DEBUG(kTransport, "accepted a channel from rank {} (session {:x}) over {} path(s)", peer, sessionId, paths);
    return std::make_pair(peer, std::move(channel));
  }
  return againStatus("no peer has connected every stream yet");
}

}  // namespace meridian::transport::tcp
