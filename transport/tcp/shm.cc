// The TCP device's shared-memory paths: a channel to a peer on this host pairs one over its
// first TCP stream (shm/pairing.h), and from then on carries its data through the pair's
// segment while its TCP paths stand by (PathEndpoints::standby). See docs/transport.md,
// "Shared memory between ranks on one host".
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {
namespace {

// The largest segment a peer may offer: the largest rings, rounded up to whole pages.
constexpr std::size_t kMaxSegmentBytes = (shm::pathSegmentBytes(shm::kMaxPathRingBytes) + 4095) / 4096 * 4096;
// How long a closing channel keeps trying to hand its shared-memory goodbye over.
constexpr std::int64_t kGoodbyeWaitUs = 200'000;

bool isInitiator(const ChannelEntry& e) { return e.initiatorRank != e.peerRank; }

}  // namespace

void TcpDevice::Impl::sendShmPairing(Stream& via, const shm::PairingMessage& m) {
  if (via.dead) return;
  const std::string payload = shm::encodePairing(m);
  FrameHeader h;
  h.type = FrameType::kShmPairing;
  h.length = static_cast<std::uint32_t>(payload.size());
  h.totalBytes = h.length;
  const auto header = encodeFrameHeader(h);
  queueControl(via, header,
               std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()),
               /*urgent=*/true);
}

void TcpDevice::Impl::startShmPairing(ChannelEntry& e) {
  if (!shmEnabled() || e.shmSlot == SIZE_MAX || !isInitiator(e)) return;
  shm::PairingMessage hello;
  hello.kind = shm::PairingKind::kHello;
  hello.pid = static_cast<std::int32_t>(::getpid());
  hello.doorbell = waker->fd.get();
  hello.hostKey = shm::localHostKey();
  if (!e.streams.empty() && !e.streams[0].empty()) sendShmPairing(*e.streams[0][0], hello);
}

void TcpDevice::Impl::takeShmPairing(ChannelEntry& e, Stream& from, std::span<const std::uint8_t> bytes) {
  auto refuse = [&](const std::string& why) {
    e.shmPairingDone = true;
    shm::PairingMessage no;
    no.kind = shm::PairingKind::kRefused;
    no.reason = why;
    sendShmPairing(from, no);
  };
  auto m = shm::decodePairing(bytes, kMaxSegmentBytes);
  if (!m) {
    MLOG_WARN(kTransport, "rank {}: {}; no shared-memory path", e.peerRank, m.status().message());
    if (!e.shmPairingDone) refuse("a malformed pairing message");
    return;
  }
  if (e.shmPairingDone) {
    if (m->kind != shm::PairingKind::kRefused) {
      MLOG_WARN(kTransport, "rank {} sent a shared-memory pairing message after pairing ended; ignored", e.peerRank);
    }
    return;
  }
  const bool initiator = isInitiator(e);
  switch (m->kind) {
    case shm::PairingKind::kHello: {
      if (initiator || e.shmOffered) {
        return refuse("a hello to the side that says hello");
      }
      if (!shmEnabled() || e.shmSlot == SIZE_MAX) return refuse("MERIDIAN_SHM=off");
      if (m->hostKey != shm::localHostKey()) return refuse("another host");
      auto seg = shm::ShmSegment::create(shm::jobSegmentTag(options.secret, e.sessionId),
                                         shm::pathSegmentBytes(shm::pathRingBytes(e.shmHostPeers)));
      if (!seg) {
        MLOG_INFO(kTransport, "no shared-memory path to rank {}: {}", e.peerRank, seg.status().message());
        return refuse(seg.status().message());
      }
      e.shmPeerPid = m->pid;
      e.shmPeerDoorbell = m->doorbell;
      shm::PairingMessage offer;
      offer.kind = shm::PairingKind::kOffer;
      offer.doorbell = waker->fd.get();
      offer.segment = seg->offer();
      e.shmOffered = std::make_unique<shm::ShmSegment>(std::move(seg).value());
      sendShmPairing(from, offer);
      return;
    }
    case shm::PairingKind::kOffer: {
      if (!initiator) return refuse("an offer to the side that offers");
      auto seg = shm::ShmSegment::open(m->segment);
      if (!seg) {
        MLOG_WARN(kTransport, "rank {}'s shared-memory segment: {}; no shared-memory path", e.peerRank,
                  seg.status().message());
        return refuse(seg.status().message());
      }
      shm::PairingMessage attached;
      attached.kind = shm::PairingKind::kAttached;
      sendShmPairing(from, attached);
      e.shmPairingDone = true;
      startShmPath(e, std::move(seg).value(), /*creator=*/false, m->segment.ownerPid, m->doorbell);
      return;
    }
    case shm::PairingKind::kAttached: {
      if (initiator || !e.shmOffered) return refuse("'attached' to a segment never offered");
      e.shmPairingDone = true;
      shm::ShmSegment seg = std::move(*e.shmOffered);
      e.shmOffered.reset();
      seg.unlink();  // both sides hold it mapped: the name goes, nothing is left behind
      startShmPath(e, std::move(seg), /*creator=*/true, e.shmPeerPid, e.shmPeerDoorbell);
      return;
    }
    case shm::PairingKind::kRefused:
      e.shmPairingDone = true;
      e.shmOffered.reset();  // unlinks and unmaps
      MLOG_DEBUG(kTransport, "no shared-memory path to rank {}: it says {}", e.peerRank, m->reason);
      return;
  }
}

void TcpDevice::Impl::startShmPath(ChannelEntry& e, shm::ShmSegment segment, bool creator, std::int32_t peerPid,
                                   int peerDoorbell) {
  shm::ShmPathConfig config;
  config.index = e.shmSlot;
  config.ringCapacity = shm::ringCapacityOf(segment.bytes());
  if (config.ringCapacity == 0) {
    MLOG_WARN(kTransport, "rank {}'s shared-memory segment of {} bytes holds no rings; no shared-memory path",
              e.peerRank, segment.bytes());
    return;
  }
  config.peerPid = peerPid == static_cast<std::int32_t>(::getpid()) ? 0 : peerPid;
  if (e.readPid > 0) {
    const std::int64_t pid = e.readPid;
    config.readPeer = [pid](std::uint8_t* dst, std::uint64_t address, std::size_t n) {
      return readDirect(pid, dst, address, n);
    };
  }
  config.directReadBytes = directReadBytes;
  if (auto bell = shm::takePeerFd(peerPid, peerDoorbell)) {
    config.peerDoorbell = std::move(bell).value();
  } else {
    MLOG_INFO(kTransport, "shared-memory path to rank {}: no doorbell ({}); the peer polls", e.peerRank,
              bell.status().message());
  }
  // The peer's exit wakes this loop (a killed rank's path fails within a round), where the
  // kernel has pidfds; otherwise the path looks at the process every kAliveCheckUs.
  ProcessExitFd exit;
  if (config.peerPid > 0) {
    Result<ProcessExitFd> opened = ProcessExitFd::open(config.peerPid);
    Status st = opened.status();
    if (st.isOk()) st = epollSet(opened->fd(), EPOLLIN, /*add=*/true);
    if (st.isOk()) {
      exit = std::move(opened).value();
      config.exitWatched = true;
    } else {
      MLOG_DEBUG(kTransport, "shared-memory path to rank {}: {}; its exit is seen by polling", e.peerRank,
                 st.message());
    }
  }
  e.shm = std::make_unique<shm::ShmPath>(std::move(segment), creator, *e.engine, std::move(config));
  e.engine->onPathUp(e.shmSlot, -1);
  if (exit.valid()) {
    shmPeerExits[exit.fd()] = &e;
    e.shmPeerExit = std::move(exit);
  }
}

bool TcpDevice::Impl::takeShmPeerExit(int fd) {
  const auto it = shmPeerExits.find(fd);
  if (it == shmPeerExits.end()) return false;
  ChannelEntry& e = *it->second;
  stopWatchingShmPeer(e);
  if (e.shm && !e.shm->failed()) e.shm->peerExited();
  return true;
}

void TcpDevice::Impl::stopWatchingShmPeer(ChannelEntry& e) {
  if (!e.shmPeerExit.valid()) return;
  shmPeerExits.erase(e.shmPeerExit.fd());
  epollDel(e.shmPeerExit.fd());
  e.shmPeerExit = ProcessExitFd();
}

std::size_t TcpDevice::Impl::receiveShmPath(ChannelEntry& e, std::int64_t now) {
  if (!e.shm || e.shm->failed()) return 0;
  const std::size_t moved = e.shm->receive(now);
  shmWork += moved;
  return moved;
}

std::size_t TcpDevice::Impl::sendShmPath(ChannelEntry& e, std::int64_t now) {
  if (!e.shm || e.shm->failed()) return 0;
  const std::size_t moved = e.shm->send(now);
  shmWork += moved;
  return moved;
}

int TcpDevice::Impl::shmSleepMs(int wanted) {
  if (wanted == 0) return 0;
  for (auto& e : channels) {
    if (!e->shm || e->shm->failed()) continue;
    if (!e->shm->readyToSleep()) return 0;
    // A peer that could not take our doorbell cannot wake us: we look again soon.
    if (!e->shm->peerRings() || e->shm->busy()) wanted = std::min(wanted, 1);
  }
  return wanted;
}

void TcpDevice::Impl::shmAwake() {
  for (auto& e : channels) {
    if (e->shm) e->shm->awake();
  }
}

void TcpDevice::Impl::closeShmPath(ChannelEntry& e) {
  stopWatchingShmPeer(e);
  e.shmOffered.reset();
  if (!e.shm) return;
  if (!e.shm->failed()) {
    e.shm->sayGoodbye();
    const std::int64_t deadline = nowUs() + kGoodbyeWaitUs;
    while (e.shm->hasUnsentFrames() && nowUs() < deadline) {
      if (e.shm->pump(nowUs()) == 0) ::usleep(50);
    }
  }
  e.shm.reset();
}

}  // namespace meridian::transport::tcp
