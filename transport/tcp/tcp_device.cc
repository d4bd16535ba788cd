// The TCP device's public API (tcp_device.h).
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

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
  MERIDIAN_RETURN_IF_ERROR(resolveKnobs(options));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t maxUnexpected, readKnobInt(knobs::kMaxUnexpectedBytes));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t timeoutMs, readKnobInt(knobs::kTimeoutMs));
  impl->maxUnexpectedBytes = static_cast<std::uint64_t>(maxUnexpected);
  impl->unclaimedTimeout = std::chrono::milliseconds(timeoutMs);
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
    impl->pending.push_back(std::make_unique<PendingConnections>(
        PendingLimits{kMaxPendingPerListener, kMaxPendingPerSource, kHandshakeTimeout}));
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
  impl->integrityFailures = &MetricsRegistry::global().counter(
      "meridian_transport_integrity_failures_total",
      "Records from peers that failed their integrity tag (changed, forged, replayed or reordered on the way); each "
      "failed its path",
      {{"device", impl->options.name}});
  impl->epfd.reset(::epoll_create1(EPOLL_CLOEXEC));
  impl->waker->fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->epfd.valid() || !impl->waker->fd.valid()) return internalError("epoll/eventfd: {}", errnoText(errno));
  MERIDIAN_RETURN_IF_ERROR(impl->epollSet(impl->waker->fd.get(), EPOLLIN, true));
  for (auto& l : impl->listeners) MERIDIAN_RETURN_IF_ERROR(impl->epollSet(l.get(), EPOLLIN, true));
  MERIDIAN_RETURN_IF_ERROR(impl->openRails());
  Impl* raw = impl.get();
  impl->poller->impl = raw;
  impl->thread = std::thread([raw] { raw->loop(); });
  MLOG_INFO(kTransport, "TCP device {} listening on {} ({} streams per path{})", raw->options.name,
            fmt::join(raw->listenAddrs, ", "), raw->options.tcp.streamsPerPath,
            raw->rails.empty() ? std::string() : fmt::format("; fabric on {}", joinCommaList(raw->railLabels)));
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
  // The offer also says where this rank lives (its host key and pid), which shared-memory
  // paths need even when direct reads are off.
  const std::string offer = enabled || impl_->shmEnabled() ? encodeDirectReadOffer(localDirectReadOffer()) : "";
  // A job killed between a pair segment's offer and its attach left it behind: gone now.
  if (impl_->shmEnabled()) shm::removeStaleSegmentsOnce();
  auto asBytes = [](const std::string& v) {
    return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(v.data()), v.size());
  };
  MERIDIAN_ASSIGN_OR_RETURN(auto offers, exchange.allGather("direct-offer", asBytes(offer), deadline));
  if (offers.size() != n) return internalError("the exchange returned {} offers for {} ranks", offers.size(), n);
  std::vector<std::int64_t> readPid(n, 0);
  std::vector<bool> sameHost(n, false);
  std::string readable(n, '0');
  const std::string hostKey = shm::localHostKey();
  for (std::size_t peer = 0; peer < n; ++peer) {
    if (peer == static_cast<std::size_t>(rank) || offers[peer].empty()) continue;
    auto o = decodeDirectReadOffer(offers[peer]);
    if (!o) return o.status().withContext(fmt::format("rank {}'s direct-read offer", peer));
    sameHost[peer] = o->hostKey == hostKey && o->pid != ::getpid();
    if (enabled && canReadDirect(o.value())) {
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
    const int hostPeers = static_cast<int>(std::count(sameHost.begin(), sameHost.end(), true));
    DirectReadPlan plan{readPid[peer], enabled && reads[peer][static_cast<std::size_t>(rank)] == '1', sameHost[peer],
                        hostPeers};
    if (plan.readPeerPid > 0) ++info.directPeers;
    planDirectRead(sessionId, static_cast<int>(peer), plan);
  }
  if (info.directPeers > 0) MLOG_INFO(kTransport, "rank {} reads {} same-host peer(s) directly", rank, info.directPeers);
  return info;
}

Result<MemoryRegion> TcpDevice::registerMemory(const void* base, std::size_t bytes) {
  if (base == nullptr && bytes > 0) return invalidArgument("registering a null range of {} bytes", bytes);
  Impl& d = *impl_;
  // TCP streams need no registration; fabric rails do, so their paths send from it in place
  // (fabric/path.h). The rails' caches make repeated and sub-range registrations free.
  std::lock_guard lock(d.poller->mu);  // the rails' progress runs under it
  if (d.rails.empty() || bytes == 0) return MemoryRegion{base, bytes, 0};
  std::vector<std::uint64_t> handles;
  for (auto& rail : d.rails) {
    auto m = rail->registerMemory(base, bytes);
    if (!m) {
      for (std::size_t i = 0; i < handles.size(); ++i) (void)d.rails[i]->releaseMemory(handles[i]);
      return m.status().withContext("registering memory on the fabric");
    }
    handles.push_back(m->handle);
  }
  const std::uint64_t key = ++d.lastRegionKey;
  d.regions[key] = std::move(handles);
  return MemoryRegion{base, bytes, key};
}

Status TcpDevice::deregisterMemory(const MemoryRegion& region) {
  Impl& d = *impl_;
  if (region.key == 0) return Status::ok();  // nothing was registered
  std::lock_guard lock(d.poller->mu);
  auto it = d.regions.find(region.key);
  if (it == d.regions.end()) return invalidArgument("deregistering memory this device did not register (key {})", region.key);
  Status first;
  for (std::size_t i = 0; i < it->second.size(); ++i) {
    Status st = d.rails[i]->releaseMemory(it->second[i]);
    if (first.isOk() && !st.isOk()) first = st;
  }
  d.regions.erase(it);
  return first;
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
  // Beside a shared-memory path large chunks stream through its rings rather than go as
  // references the peer reads (measured: twice the rate; docs/transport.md).
  const bool sharedMemory = direct.sameHost && d.shmEnabled();
  auto entry = d.makeEntry(spec.sessionId, spec.peerRank, std::move(endpoints), *peerAddresses,
                           direct.peerReadsDirect && !sharedMemory, sharedMemory);
  entry->readPid = direct.readPeerPid;
  entry->shmHostPeers = std::max(direct.sameHostPeers, 1);
  entry->initiatorRank = spec.initiate ? spec.selfRank : spec.peerRank;
  ChannelEntry* e = entry.get();

  if (spec.initiate) {
    struct Opened {
      std::size_t path;
      UniqueFd fd;
      SessionKeys keys;
    };
    // Every stream of every path connects and shakes hands at once: one after another they
    // would cost a few round trips each, seconds to a peer across an ocean. The server side
    // runs its handshakes side by side in its event loop.
    const int perPath = d.options.tcp.streamsPerPath;
    std::vector<HostPort> remotes;
    for (std::size_t p = 0; p < nPaths; ++p) {
      auto remote = parseHostPort((*peerAddresses)[p]);
      if (!remote) return remote.status();
      remotes.push_back(remote.value());
    }
    std::vector<Result<Opened>> dialed;
    dialed.reserve(nPaths * static_cast<std::size_t>(perPath));
    for (std::size_t i = 0; i < nPaths * static_cast<std::size_t>(perPath); ++i) dialed.emplace_back(internalError("not dialled"));
    {
      std::vector<std::jthread> dialers;
      for (std::size_t p = 0; p < nPaths; ++p) {
        for (int s = 0; s < perPath; ++s) {
          dialers.emplace_back([&, p, s] {
            Result<Opened>& out = dialed[p * static_cast<std::size_t>(perPath) + static_cast<std::size_t>(s)];
            auto fd = connectTo(remotes[p], d.localIps[p], deadline);
            if (!fd) {
              out = fd.status();
              return;
            }
            const ConnectInfo info = dataStreamInfo(spec.sessionId, spec.selfRank, p, s, perPath, nPaths);
            auto keys = clientHandshake(fd->get(), d.options.secret, *d.options.wireSecurity, info, deadline);
            if (!keys) {
              out = keys.status();
              return;
            }
            out = Opened{p, std::move(fd.value()), keys.value()};
          });
        }
      }
    }  // joined: every dial ended, by its deadline at the latest
    std::vector<Opened> fds;
    for (std::size_t i = 0; i < dialed.size(); ++i) {
      if (!dialed[i].isOk()) {
        return dialed[i].status().withContext(fmt::format("path {} to rank {}", i / static_cast<std::size_t>(perPath),
                                                          spec.peerRank));
      }
      fds.push_back(std::move(dialed[i]).value());
    }
    d.runOnProgress([&] {
      for (auto& f : fds) d.attachStream(*e, std::move(f.fd), f.path, f.keys);
      for (std::size_t p = 0; p < nPaths; ++p) e->expectedStreams[p] = d.options.tcp.streamsPerPath;
      e->ready = true;
      d.sendRailNames(*e);
      d.startShmPairing(*e);
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
                                                        std::vector<std::string> peerAddresses, bool peerReadsDirect,
                                                        bool sharedMemory) {
  auto entry = std::make_unique<ChannelEntry>();
  entry->sessionId = sessionId;
  entry->peerRank = peerRank;
  entry->directPaths = endpoints.size();
  entry->peerAddresses = std::move(peerAddresses);
  if (options.relaySlot) endpoints.push_back({"", "relay", true});
  // Beside a shared-memory path (up once paired, and only with a peer on this host) TCP
  // stands by: it carries data again the moment that path fails.
  if ((!rails.empty() && options.fabric.tcp == "standby") || sharedMemory) {
    for (auto& ep : endpoints) ep.standby = true;
  }
  entry->streams.resize(endpoints.size());
  entry->expectedStreams.assign(endpoints.size(), 0);
  for (std::size_t k = 0; k < rails.size(); ++k) {
    PathEndpoints fabricEnd;
    fabricEnd.localAddress = railLabels[k];
    fabricEnd.remoteAddress = fmt::format("rank {}'s rail {} ({})", peerRank, k, rails[k]->info().provider);
    fabricEnd.kind = PathKind::kFabric;
    endpoints.push_back(std::move(fabricEnd));
  }
  entry->fabric.resize(rails.size());
  if (sharedMemory) {
    PathEndpoints shmEnd;
    shmEnd.localAddress = "shm";
    shmEnd.remoteAddress = fmt::format("rank {} (shared memory)", peerRank);
    shmEnd.kind = PathKind::kSharedMemory;  // down until paired
    entry->shmSlot = endpoints.size();
    endpoints.push_back(std::move(shmEnd));
  }
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

Result<std::pair<int, ChannelPtr>> TcpDevice::acceptChannel(std::uint64_t sessionId) {
  // Callers poll this until a peer arrives (NCCL's accept loop): the search runs here under
  // the engine's lock, as a waiting thread's progress does, not as a round trip through the
  // progress thread (two context switches per empty poll).
  Result<std::pair<int, ChannelPtr>> result = againStatus("not run");
  {
    std::lock_guard lock(impl_->poller->mu);
    result = impl_->acceptAny(sessionId);
  }
  if (result) impl_->wake();  // the new channel's streams: the progress thread drives them from here
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
      d.closeFabricPaths(**it);
      d.closeShmPath(**it);
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
  std::vector<std::pair<UniqueFd, SessionKeys>> fds;
  for (int s = 0; s < d.options.tcp.streamsPerPath; ++s) {
    auto fd = connectTo(via.value(), localIp, deadline);
    if (!fd) return fd.status().withContext(what);
    ConnectInfo hop;  // to via: splice me through to the peer
    hop.kind = ConnectionKind::kRelay;
    hop.sessionId = spec.sessionId;
    hop.rank = spec.selfRank;
    hop.pathIndex = static_cast<std::uint16_t>(spec.plane);
    hop.relayTarget = spec.peerRank;
    // The hop's own keys protect nothing further: after it the relay only splices bytes.
    auto hopKeys = clientHandshake(fd->get(), d.options.secret, *d.options.wireSecurity, hop, deadline);
    if (!hopKeys) return hopKeys.status().withContext(what);
    // To the peer, end to end through via: sealed with keys the relay does not have.
    ConnectInfo info = dataStreamInfo(spec.sessionId, spec.selfRank, slot, s, d.options.tcp.streamsPerPath, 0);
    info.relayTarget = spec.viaRank;
    auto keys = clientHandshake(fd->get(), d.options.secret, *d.options.wireSecurity, info, deadline);
    if (!keys) return keys.status().withContext(what);
    fds.emplace_back(std::move(fd.value()), keys.value());
  }
  Status attached = Status::ok();
  d.runOnProgress([&] {
    ChannelEntry* e = d.findChannel(spec.sessionId, spec.peerRank);
    if (e == nullptr || e->liveStreams(slot)) {
      attached = againStatus("{}: the channel failed or its slot was taken meanwhile", what);
      return;
    }
    e->streams[slot].clear();
    for (auto& [fd, keys] : fds) d.attachStream(*e, std::move(fd), slot, keys);
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

Status TcpDevice::abandonChannel(std::uint64_t sessionId, int peerRank, const Status& why) {
  Status result = invalidArgument("no channel to rank {} in session {:x}", peerRank, sessionId);
  impl_->runOnProgress([&] {
    for (auto& e : impl_->channels) {
      if (e->sessionId != sessionId || e->peerRank != peerRank) continue;
      if (!e->engine->failed()) e->engine->fail(why);
      result = Status::ok();
    }
  });
  return result;
}

Status TcpDevice::cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) {
  Status result = invalidArgument("no channel to rank {} in session {:x} with path {}", peerRank, sessionId, pathIndex);
  impl_->runOnProgress([&] {
    for (auto& e : impl_->channels) {
      if (e->sessionId != sessionId || e->peerRank != peerRank || pathIndex < 0) continue;
      const auto path = static_cast<std::size_t>(pathIndex);
      const Status why = pathError("path {} cut on purpose", pathIndex);
      if (path < e->streams.size()) {
        impl_->failPath(*e, path, why, false);
        result = Status::ok();
      } else if (path - e->fabricBase() < e->fabric.size()) {
        // A fabric path not yet paired is down already; a paired one fails now.
        if (auto& fp = e->fabric[path - e->fabricBase()]; fp && !fp->failed()) fp->fail(why);
        result = Status::ok();
      } else if (path == e->shmSlot) {
        if (e->shm && !e->shm->failed()) e->shm->fail(why);
        result = Status::ok();
      }
    }
  });
  return result;
}

}  // namespace meridian::transport::tcp
