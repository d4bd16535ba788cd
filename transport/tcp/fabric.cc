// The TCP device's fabric paths: libfabric rails opened at creation (MERIDIAN_FABRIC), the
// rail names each side of a channel sends the other on the channel's first TCP stream
// (authenticated by the handshake), and the fabric paths that pair them, driven by the
// device's progress like its streams. See docs/transport.md, "Fabric paths".
#include <atomic>
#include <chrono>
#include <thread>

#include "transport/fabric/choose.h"
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {
namespace {

// Provider choices are said once per process (the NCCL plugin opens several devices).
std::atomic<bool> saidFabricChoice{false};
// Frames a fabric path keeps in flight each way: with 512 KiB chunks, 4 MiB registered per
// path and peer.
constexpr int kFabricSendSlots = 4;
constexpr int kFabricRecvSlots = 4;
// How long a closing channel keeps trying to hand its fabric goodbyes to the provider.
constexpr std::int64_t kGoodbyeWaitUs = 200'000;

// True the first time: the provider choice is logged once per process.
bool firstSay() { return !saidFabricChoice.exchange(true); }

}  // namespace

Status TcpDevice::Impl::openRails() {
  const auto& f = options.fabric;
  if (f.mode == "off") return Status::ok();
  MERIDIAN_ASSIGN_OR_RETURN(const fabric::FabricChoice choice,
                            fabric::chooseFabricProvider(f.mode, f.provider, fabric::Rail::providers()));
  if (choice.provider.empty()) {
    if (firstSay()) MLOG_INFO(kTransport, "fabric paths: {}", choice.why);
    return Status::ok();
  }
  const std::string& provider = choice.provider;
  fabric::RailOptions ro;
  ro.provider = provider;
  ro.domain = f.domain;
  // An IP provider listens on the first path's address (a plane's) unless a domain (an
  // interface, for IP providers) names another; the others address by NIC.
  if (provider == "tcp;ofi_rxm" && f.domain.empty() && !localIps.empty()) ro.sourceAddress = localIps.front();
  auto rail = fabric::Rail::open(ro);
  if (!rail) {
    if (f.mode == "on") return rail.status().withContext("MERIDIAN_FABRIC=on");
    if (firstSay()) MLOG_WARN(kTransport, "fabric paths off: {}; TCP paths only", rail.status().message());
    return Status::ok();
  }
  if (const int fd = (*rail)->waitFd(); fd >= 0) {
    MERIDIAN_RETURN_IF_ERROR(epollSet(fd, EPOLLIN, true));
  } else {
    pollRails = true;
  }
  MLOG_INFO(kTransport, "TCP device {}: fabric rail {}", options.name, (*rail)->describe());
  railLabels.push_back((*rail)->describeName((*rail)->name()));
  rails.push_back(std::move(rail.value()));
  return Status::ok();
}

void TcpDevice::Impl::sendRailNames(ChannelEntry& e) {
  if (rails.empty() || e.railNamesSent || e.streams.empty() || e.streams[0].empty() || e.streams[0][0]->dead) return;
  std::vector<fabric::RailName> names;
  for (const auto& r : rails) names.push_back(r->name());
  auto payload = fabric::encodeRailNames(names);
  if (!payload) {
    MLOG_WARN(kTransport, "fabric paths to rank {} stay down: {}", e.peerRank, payload.status().message());
    return;
  }
  static_assert(fabric::kMaxPathNamesBytes <= kMaxPathNamesPayloadBytes);
  FrameHeader h;
  h.type = FrameType::kPathNames;
  h.length = static_cast<std::uint32_t>(payload->size());
  h.totalBytes = h.length;
  const auto header = encodeFrameHeader(h);
  queueControl(*e.streams[0][0], header, payload.value(), /*urgent=*/true);
  e.fabricSeedOut = e.streams[0][0]->fabricSeedOut;
  e.railNamesSent = true;
}

void TcpDevice::Impl::takeRailNames(ChannelEntry& e, const Stream& from, std::span<const std::uint8_t> bytes) {
  if (e.railNamesTaken) {
    MLOG_WARN(kTransport, "rank {} named its fabric rails twice; the second list is ignored", e.peerRank);
    return;
  }
  e.railNamesTaken = true;
  if (rails.empty()) return;
  // Our own names (and the seed of our sending keys) go first; a peer that named its rails
  // before we could has them now.
  sendRailNames(e);
  if (!e.railNamesSent) {
    MLOG_WARN(kTransport, "fabric paths to rank {} stay down: our rail names could not go out", e.peerRank);
    return;
  }
  auto names = fabric::decodeRailNames(bytes);
  if (!names) {
    MLOG_WARN(kTransport, "rank {}'s fabric rail names: {}; its fabric paths stay down", e.peerRank,
              names.status().message());
    return;
  }
  const std::size_t n = std::min(rails.size(), names->size());
  for (std::size_t k = 0; k < n; ++k) {
    fabric::Rail& rail = *rails[k];
    const std::size_t slot = e.fabricBase() + k;
    if (!rail.failure().isOk()) continue;
    auto peer = rail.addPeer((*names)[k]);
    if (!peer) {
      MLOG_WARN(kTransport, "fabric path {} to rank {} stays down: {}", slot, e.peerRank, peer.status().message());
      continue;
    }
    const std::uint64_t sendTag = fabric::fabricPathTag(options.secret, e.sessionId, e.initiatorRank, k, rail.name(),
                                                        (*names)[k]);
    const std::uint64_t recvTag = fabric::fabricPathTag(options.secret, e.sessionId, e.initiatorRank, k, (*names)[k],
                                                        rail.name());
    fabric::FabricPathConfig config;
    config.chunkBytes = options.chunkBytes;
    config.sendSlots = kFabricSendSlots;
    config.recvSlots = kFabricRecvSlots;
    config.security = *options.wireSecurity;
    config.sendKey = fabric::fabricPathKey(e.fabricSeedOut, k, rail.name(), (*names)[k]);
    config.recvKey = fabric::fabricPathKey(from.fabricSeedIn, k, (*names)[k], rail.name());
    config.integrityFailures = integrityFailures;
    auto path = fabric::FabricPath::create(rail, *peer, sendTag, recvTag, *e.engine, slot, config);
    if (!path) {
      MLOG_WARN(kTransport, "fabric path {} to rank {} stays down: {}", slot, e.peerRank, path.status().message());
      (void)rail.removePeer(*peer);
      continue;
    }
    e.fabric[k] = std::move(path.value());
    e.engine->onPathUp(slot, -1);
  }
}

std::size_t TcpDevice::Impl::progressRails() {
  std::size_t done = 0;
  for (std::size_t k = 0; k < rails.size(); ++k) {
    fabric::Rail& rail = *rails[k];
    const bool wasOk = rail.failure().isOk();
    done += rail.progress();
    if (!wasOk || rail.failure().isOk()) continue;
    // The rail itself broke (logged by the rail): every path on it fails over.
    for (auto& e : channels) {
      if (k < e->fabric.size() && e->fabric[k] && !e->fabric[k]->failed()) e->fabric[k]->fail(rail.failure());
    }
  }
  return done;
}

void TcpDevice::Impl::pumpFabricPaths(ChannelEntry& e, std::int64_t now) {
  for (auto& p : e.fabric) {
    if (p && !p->failed()) p->pump(now);
  }
}

int TcpDevice::Impl::railSleepMs(int wanted) {
  if (rails.empty() || wanted == 0) return wanted;
  if (pollRails) return std::min(wanted, 1);
  for (auto& r : rails) {
    if (!r->readyToSleep()) return 0;
  }
  return wanted;
}

void TcpDevice::Impl::closeFabricPaths(ChannelEntry& e) {
  for (auto& p : e.fabric) {
    if (p && !p->failed()) p->sayGoodbye();
  }
  // A fabric path has no end of stream: the goodbye is how the peer learns of the close, so
  // it goes out even when the provider is full for a moment (bounded: a gone peer never
  // takes it).
  const std::int64_t deadline = nowUs() + kGoodbyeWaitUs;
  auto unsent = [&] {
    return std::any_of(e.fabric.begin(), e.fabric.end(),
                       [](const auto& p) { return p && !p->failed() && p->hasUnsentFrames(); });
  };
  while (unsent() && nowUs() < deadline) {
    // Nothing completed: the provider waits on the peer; give the core back for a moment
    // rather than spin through the whole wait.
    if (progressRails() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    for (auto& p : e.fabric) {
      if (p && !p->failed()) p->pump(nowUs());
    }
  }
  // What the provider still holds outlives the paths (FabricPath retires it to the rail).
  for (auto& p : e.fabric) p.reset();
}

}  // namespace meridian::transport::tcp
