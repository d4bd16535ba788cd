// The TCP device's relays: splicing a path between two other ranks through this one.
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

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
  const ConnectInfo info = hs.machine.result().value();
  epollDel(hs.fd.get());
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
  for (int end : {client.get(), fd->get()}) {
    if (Status st = tuneDataSocket(end, options.tcp.socketBufferBytes); !st.isOk()) {
      MLOG_WARN(kTransport, "relay from rank {} to rank {}: {}", info.rank, info.relayTarget, st.message());
      return;
    }
  }
  auto r = std::make_unique<RelayEntry>();
  r->splice = std::make_unique<Splice>(std::move(client), std::move(fd.value()), kSpliceBufferBytes);
  r->what = fmt::format("rank {} -> rank {} (session {:x}, plane {})", info.rank, info.relayTarget, info.sessionId,
                        info.pathIndex);
  r->eventsA = r->splice->interestA();
  r->eventsB = r->splice->interestB();
  if (Status st = epollSet(r->splice->fdA(), r->eventsA, true); !st.isOk()) {
    MLOG_WARN(kTransport, "relay {}: {}", r->what, st.message());
    return;  // r closes both ends
  }
  if (Status st = epollSet(r->splice->fdB(), r->eventsB, true); !st.isOk()) {
    MLOG_WARN(kTransport, "relay {}: {}", r->what, st.message());
    epollDel(r->splice->fdA());
    return;
  }
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
    Status st = Status::ok();
    if (r.splice->interestA() != r.eventsA) st = epollSet(r.splice->fdA(), r.eventsA = r.splice->interestA(), false);
    if (st.isOk() && r.splice->interestB() != r.eventsB) {
      st = epollSet(r.splice->fdB(), r.eventsB = r.splice->interestB(), false);
    }
    if (st.isOk()) return;
    MLOG_WARN(kTransport, "relay {} ended: {} ({} bytes forwarded)", r.what, st.message(), moved);
    endRelay(r);
    return;
  }
  if (state == Splice::State::kFailed) {
    MLOG_WARN(kTransport, "relay {} ended: {} ({} bytes forwarded)", r.what, r.splice->error(), moved);
  } else {
    MLOG_INFO(kTransport, "relay {} closed ({} bytes forwarded)", r.what, moved);
  }
  endRelay(r);
}

void TcpDevice::Impl::endRelay(RelayEntry& r) {
  for (int fd : {r.splice->fdA(), r.splice->fdB()}) {
    epollDel(fd);
    relaysByFd.erase(fd);
  }
  std::erase_if(relays, [&](const auto& x) { return x.get() == &r; });  // destroys r
}

}  // namespace meridian::transport::tcp
