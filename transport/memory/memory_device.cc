// The in-memory backend (memory_device.h): paths are frame queues between devices of one
// Network, and Network::step runs every channel's multipath engine over them.
#include "transport/memory/memory_device.h"

#include <algorithm>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "core/wire.h"
#include "transport/engine.h"
#include "transport/registration_cache.h"

namespace meridian::transport::memory {

namespace {

constexpr std::uint8_t kEndpointVersion = 1;
constexpr std::size_t kEndpointBytes = 6;  // version u8, device id u32, path count u8
constexpr std::size_t kMaxPaths = 64;
// closeChannel delivers eager sends still unacknowledged for at most this many steps.
constexpr int kCloseSteps = 1000;

struct Frame {
  FrameHeader header;
  std::vector<std::uint8_t> payload;
};

struct Link;

// One end of a channel.
struct Entry {
  std::uint64_t sessionId = 0;
  int selfRank = 0;
  int peerRank = 0;
  std::uint32_t device = 0;
  ChannelPtr channel;
  std::shared_ptr<ChannelEngine> engine;
  std::shared_ptr<Link> link;
  int side = 0;  // 0: the initiator's end
};

// The paths of one channel between two devices, each a queue per direction.
struct Link {
  std::uint64_t sessionId = 0;
  int rank[2] = {0, 0};
  std::uint32_t device[2] = {0, 0};
  Entry* end[2] = {nullptr, nullptr};  // null until that side opened (or after it closed)
  struct Path {
    std::deque<Frame> toSide[2];
    PathFaults faults;
    bool dead = false;
    std::uint64_t credit[2] = {0, 0};  // payload bytes each direction may still deliver (bytesPerStep)
  };
  std::vector<Path> paths;
};

struct Poller;

}  // namespace

struct Network::State {
  mutable std::mutex mu;
  std::condition_variable cv;  // a link appeared (openChannel waits for its initiator)
  std::int64_t nowUs = 1;
  std::int64_t stepUs = 0;
  std::uint32_t nextDevice = 1;
  std::uint64_t dropped = 0;
  struct Dev {
    std::vector<std::string> paths;
    std::unique_ptr<RegistrationCache> cache;
    std::uint64_t nextKey = 1;
  };
  std::map<std::uint32_t, Dev> devices;
  std::vector<std::shared_ptr<Entry>> entries;
  std::vector<std::shared_ptr<Link>> links;
  std::shared_ptr<Poller> poller;

  bool stepLocked();
  void deliver(Link& link, std::size_t path, int side, Frame frame);
  void failPath(Link& link, std::size_t path, const Status& why, bool graceful);
  void detach(Entry& e, const Status& why);
  Result<ChannelPtr> attach(std::uint32_t device, std::uint64_t sessionId, int selfRank, int peerRank,
                            const std::shared_ptr<Link>& link, int side, const DeviceOptions& options);
  Link* findLink(std::uint64_t sessionId, int rankA, int rankB);
};

namespace {

// Waiting threads run steps themselves (Request::wait); a step already running elsewhere
// is left alone.
struct Poller : Progressor {
  std::weak_ptr<Network::State> state;
  bool pollOnce(bool* ran) override {
    auto s = state.lock();
    if (!s) {
      if (ran != nullptr) *ran = false;
      return false;
    }
    std::unique_lock lock(s->mu, std::try_to_lock);
    if (ran != nullptr) *ran = lock.owns_lock();
    return lock.owns_lock() && s->stepLocked();
  }
};

EndpointName encodeEndpoint(std::uint32_t id, std::size_t paths) {
  EndpointName out(kEndpointBytes);
  out[0] = kEndpointVersion;
  wire::store<std::uint32_t>(&out[1], id);
  out[5] = static_cast<std::uint8_t>(paths);
  return out;
}

Result<std::pair<std::uint32_t, std::size_t>> decodeEndpoint(std::span<const std::uint8_t> name) {
  if (name.size() != kEndpointBytes || name[0] != kEndpointVersion) {
    return invalidArgument("not a memory endpoint ({} bytes)", name.size());
  }
  const std::size_t paths = name[5];
  if (paths == 0 || paths > kMaxPaths) return invalidArgument("memory endpoint with {} paths", paths);
  return std::make_pair(wire::load<std::uint32_t>(&name[1]), paths);
}

}  // namespace

// ---------------------------------------------------------------- the network

Network::Network() : state_(std::make_shared<State>()) {
  state_->poller = std::make_shared<Poller>();
  state_->poller->state = state_;
}

Network::~Network() = default;

Network& Network::shared() {
  static Network net;
  return net;
}

std::int64_t Network::nowUs() const {
  std::lock_guard lock(state_->mu);
  return state_->nowUs;
}

void Network::advanceUs(std::int64_t us) {
  std::lock_guard lock(state_->mu);
  state_->nowUs += std::max<std::int64_t>(us, 0);
}

void Network::setStepUs(std::int64_t stepUs) {
  std::lock_guard lock(state_->mu);
  state_->stepUs = std::max<std::int64_t>(stepUs, 0);
}

bool Network::step() {
  std::lock_guard lock(state_->mu);
  return state_->stepLocked();
}

bool Network::runUntil(const std::function<bool()>& done, int maxSteps) {
  for (int i = 0; i < maxSteps; ++i) {
    if (done()) return true;
    step();
  }
  return done();
}

std::uint64_t Network::droppedFrames() const {
  std::lock_guard lock(state_->mu);
  return state_->dropped;
}

Status Network::setFaults(std::uint64_t sessionId, int rankA, int rankB, std::size_t path, PathFaults faults) {
  std::lock_guard lock(state_->mu);
  Link* link = state_->findLink(sessionId, rankA, rankB);
  if (link == nullptr || path >= link->paths.size()) {
    return invalidArgument("no path {} between ranks {} and {} in session {:x}", path, rankA, rankB, sessionId);
  }
  link->paths[path].faults = faults;
  return Status::ok();
}

Result<std::unique_ptr<MemoryDevice>> Network::createDevice(DeviceOptions options) {
  options.kind = DeviceKind::kMemory;
  MERIDIAN_RETURN_IF_ERROR(resolveKnobs(options));
  if (options.localAddresses.empty() || options.localAddresses.size() > kMaxPaths) {
    return invalidArgument("a memory device has 1 to {} paths, not {}", kMaxPaths, options.localAddresses.size());
  }
  if (options.chunkBytes > kMaxChunkBytes) {
    return invalidArgument("chunk size {} over {}", options.chunkBytes, kMaxChunkBytes);
  }
  std::lock_guard lock(state_->mu);
  const std::uint32_t id = state_->nextDevice++;
  State::Dev& dev = state_->devices[id];
  dev.paths = options.localAddresses;
  dev.cache = std::make_unique<RegistrationCache>(
      [&dev](std::uintptr_t, std::size_t) -> Result<std::uint64_t> { return dev.nextKey++; }, [](std::uint64_t) {});
  return std::unique_ptr<MemoryDevice>(new MemoryDevice(state_, id, std::move(options)));
}

Link* Network::State::findLink(std::uint64_t sessionId, int rankA, int rankB) {
  for (auto& l : links) {
    if (l->sessionId == sessionId &&
        ((l->rank[0] == rankA && l->rank[1] == rankB) || (l->rank[0] == rankB && l->rank[1] == rankA))) {
      return l.get();
    }
  }
  return nullptr;
}

bool Network::State::stepLocked() {
  bool moved = false;
  nowUs += stepUs;
  // Writing: every channel's chunks onto its paths.
  for (auto& e : entries) {
    ChannelEngine& eng = *e->engine;
    if (eng.failed()) continue;
    eng.drainPosted();
    eng.schedule(nowUs);
    Link& link = *e->link;
    for (std::size_t p = 0; p < link.paths.size(); ++p) {
      Link::Path& path = link.paths[p];
      OutChunk c;
      while (!path.dead && eng.nextChunk(p, &c)) {
        Frame f{eng.chunkHeader(c), {}};
        f.payload.reserve(f.header.length);
        for (std::uint64_t got = 0; got < f.header.length;) {
          std::size_t n = 0;
          const std::uint8_t* bytes = eng.chunkPayload(c, got, &n);
          f.payload.insert(f.payload.end(), bytes, bytes + n);
          got += n;
        }
        eng.onChunkWritten(p, c, nowUs);
        moved = true;
        if (path.faults.dropData > 0) {
          --path.faults.dropData;
          ++dropped;
          continue;
        }
        path.toSide[1 - e->side].push_back(std::move(f));
      }
    }
  }
  // Delivering: what each path holds, in order (or reversed), unless it is stalled, and no
  // more payload than its rate allows (a frame waits until the credit covers it).
  for (auto& l : links) {
    for (std::size_t p = 0; p < l->paths.size(); ++p) {
      for (int side = 0; side < 2; ++side) {
        Link::Path& path = l->paths[p];
        if (path.dead || path.faults.stalled || l->end[side] == nullptr) continue;
        std::deque<Frame>& queue = path.toSide[side];
        if (path.faults.reorder) std::reverse(queue.begin(), queue.end());
        const std::uint64_t limit = path.faults.bytesPerStep;
        if (limit > 0 && !queue.empty()) path.credit[side] += limit;
        std::deque<Frame> batch;
        while (!queue.empty() && (limit == 0 || queue.front().payload.size() <= path.credit[side])) {
          if (limit > 0) path.credit[side] -= queue.front().payload.size();
          batch.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        if (queue.empty()) path.credit[side] = 0;  // an idle link banks nothing
        for (auto& f : batch) {
          moved = true;
          deliver(*l, p, side, std::move(f));
          if (l->paths[p].dead || l->end[side] == nullptr) break;
        }
      }
    }
  }
  for (auto& e : entries) {
    if (!e->engine->failed()) e->engine->checkStalls(nowUs);
  }
  return moved;
}

void Network::State::deliver(Link& link, std::size_t path, int side, Frame f) {
  ChannelEngine& eng = *link.end[side]->engine;
  if (eng.failed()) return;
  if (f.header.type == FrameType::kAck) {
    Status st = eng.onAck(f.header, path, nowUs);
    if (!st.isOk()) failPath(link, path, st, false);
    return;
  }
  if (f.header.type != FrameType::kData) {
    eng.fail(peerError("the memory backend carries no {} frames", static_cast<int>(f.header.type)));
    return;
  }
  auto t = eng.onDataHeader(f.header, path);
  if (!t) {
    eng.fail(t.status());
    return;
  }
  if (std::uint8_t* dst = eng.targetPointer(t.value(), 0); dst != nullptr && !f.payload.empty()) {
    std::copy(f.payload.begin(), f.payload.end(), dst);
  }
  auto ack = eng.onDataComplete(t.value(), path);
  if (!ack) {
    eng.fail(ack.status());
    return;
  }
  link.paths[path].toSide[1 - side].push_back(Frame{ack.value(), {}});
}

void Network::State::failPath(Link& link, std::size_t path, const Status& why, bool graceful) {
  Link::Path& p = link.paths[path];
  if (p.dead) return;
  p.dead = true;
  p.toSide[0].clear();
  p.toSide[1].clear();
  for (Entry* e : link.end) {
    if (e != nullptr) e->engine->onPathFailed(path, why, graceful);
  }
}

// Takes `e` off its link: the other end sees every path closed by its peer.
void Network::State::detach(Entry& e, const Status& why) {
  Link& link = *e.link;
  link.end[e.side] = nullptr;
  for (std::size_t p = 0; p < link.paths.size(); ++p) {
    failPath(link, p, commError("rank {} closed the channel", e.selfRank), true);
  }
  e.engine->fail(why);
  std::erase_if(entries, [&](const auto& x) { return x.get() == &e; });
  std::erase_if(links, [&](const auto& l) { return l->end[0] == nullptr && l->end[1] == nullptr; });
}

Result<ChannelPtr> Network::State::attach(std::uint32_t device, std::uint64_t sessionId, int selfRank, int peerRank,
                                          const std::shared_ptr<Link>& link, int side, const DeviceOptions& options) {
  std::vector<PathEndpoints> endpoints;
  const auto& mine = devices.at(device).paths;
  const auto& theirs = devices.at(link->device[1 - side]).paths;
  for (std::size_t p = 0; p < link->paths.size(); ++p) endpoints.push_back({mine[p], theirs[p], false});
  MultipathConfig config;
  if (options.chunkBytes > 0) config.chunkBytes = static_cast<std::uint32_t>(options.chunkBytes);
  if (options.pathStallMs > 0) config.pathStallUs = std::int64_t{options.pathStallMs} * 1000;
  config.adaptive = options.adaptive;
  config.deviceName = options.name;
  auto entry = std::make_shared<Entry>();
  entry->sessionId = sessionId;
  entry->selfRank = selfRank;
  entry->peerRank = peerRank;
  entry->device = device;
  entry->link = link;
  entry->side = side;
  EngineChannel ec = makeMultipathChannel(peerRank, std::move(endpoints), std::move(config), [] {}, poller);
  entry->channel = std::move(ec.channel);
  entry->engine = std::move(ec.engine);
  link->end[side] = entry.get();
  entries.push_back(entry);
  cv.notify_all();
  return entry->channel;
}

// ---------------------------------------------------------------- the device

MemoryDevice::MemoryDevice(std::shared_ptr<Network::State> net, std::uint32_t id, DeviceOptions options)
    : net_(std::move(net)), id_(id), options_(std::move(options)) {
  endpoint_ = encodeEndpoint(id_, options_.localAddresses.size());
}

MemoryDevice::~MemoryDevice() {
  std::lock_guard lock(net_->mu);
  std::vector<Entry*> mine;
  for (auto& e : net_->entries) {
    if (e->device == id_) mine.push_back(e.get());
  }
  for (Entry* e : mine) net_->detach(*e, commError("the transport device was closed"));
  net_->devices.erase(id_);
}

DeviceCaps MemoryDevice::caps() const {
  DeviceCaps c;
  c.needsRegistration = true;
  return c;
}

std::string MemoryDevice::describe(std::span<const std::uint8_t> endpoint) const {
  auto d = decodeEndpoint(endpoint);
  return d ? fmt::format("memory device {} ({} paths)", d->first, d->second) : d.status().message();
}

std::vector<std::string> MemoryDevice::pathNames() const { return options_.localAddresses; }

Result<GroupInfo> MemoryDevice::joinGroup(GroupExchange& exchange, std::uint64_t sessionId, TimePoint deadline) {
  (void)exchange;
  (void)sessionId;
  (void)deadline;
  return GroupInfo{};  // nothing to settle: no remote reads
}

Result<ChannelPtr> MemoryDevice::openChannel(const ChannelSpec& spec, TimePoint deadline) {
  if (spec.peerRank == spec.selfRank) return invalidArgument("openChannel: a channel to oneself (rank {})", spec.selfRank);
  MERIDIAN_ASSIGN_OR_RETURN(const auto peer, decodeEndpoint(spec.peer));
  std::unique_lock lock(net_->mu);
  if (net_->devices.count(peer.first) == 0) return peerError("no memory device {} on this network", peer.first);
  if (spec.initiate) {
    if (net_->findLink(spec.sessionId, spec.selfRank, spec.peerRank) != nullptr) {
      return invalidArgument("a channel between ranks {} and {} in session {:x} exists", spec.selfRank, spec.peerRank,
                             spec.sessionId);
    }
    auto link = std::make_shared<Link>();
    link->sessionId = spec.sessionId;
    link->rank[0] = spec.selfRank;
    link->rank[1] = spec.peerRank;
    link->device[0] = id_;
    link->device[1] = peer.first;
    link->paths.resize(std::min(options_.localAddresses.size(), peer.second));
    net_->links.push_back(link);
    return net_->attach(id_, spec.sessionId, spec.selfRank, spec.peerRank, link, 0, options_);
  }
  std::shared_ptr<Link> found;
  const bool ok = net_->cv.wait_until(lock, deadline, [&] {
    for (auto& l : net_->links) {
      if (l->sessionId == spec.sessionId && l->rank[0] == spec.peerRank && l->rank[1] == spec.selfRank &&
          l->device[1] == id_ && l->end[1] == nullptr) {
        found = l;
        return true;
      }
    }
    return false;
  });
  if (!ok) return timeoutError("rank {} did not open its channel before the deadline (session {:x})", spec.peerRank,
                               spec.sessionId);
  return net_->attach(id_, spec.sessionId, spec.selfRank, spec.peerRank, found, 1, options_);
}

Result<std::pair<int, ChannelPtr>> MemoryDevice::acceptChannel(std::uint64_t sessionId) {
  std::lock_guard lock(net_->mu);
  for (auto& l : net_->links) {
    if (l->sessionId == sessionId && l->device[1] == id_ && l->end[1] == nullptr && l->end[0] != nullptr) {
      MERIDIAN_ASSIGN_OR_RETURN(ChannelPtr ch, net_->attach(id_, sessionId, l->rank[1], l->rank[0], l, 1, options_));
      return std::make_pair(l->rank[0], std::move(ch));
    }
  }
  return againStatus("no peer has opened a channel yet");
}

Status MemoryDevice::closeChannel(std::uint64_t sessionId, int peerRank) {
  std::lock_guard lock(net_->mu);
  auto find = [&]() -> Entry* {
    for (auto& e : net_->entries) {
      if (e->device == id_ && e->sessionId == sessionId && e->peerRank == peerRank) return e.get();
    }
    return nullptr;
  };
  Entry* e = find();
  if (e == nullptr) return invalidArgument("no channel to rank {} in session {:x}", peerRank, sessionId);
  // Eager sends complete for their callers go out first (bounded).
  e->engine->refuseNewPosts(commError("the channel to rank {} is closing", peerRank));
  for (int i = 0; i < kCloseSteps && !e->engine->failed() && e->engine->hasUnackedEagerSends(); ++i) {
    net_->stepLocked();
  }
  net_->detach(*e, commError("the channel to rank {} was closed", peerRank));
  return Status::ok();
}

Status MemoryDevice::openRelay(const RelaySpec& spec, TimePoint deadline) {
  (void)deadline;
  return invalidArgument("the memory backend has no relay paths (rank {} via rank {})", spec.peerRank, spec.viaRank);
}

Status MemoryDevice::closeRelay(std::uint64_t sessionId, int peerRank) {
  return invalidArgument("no relay is up to rank {} in session {:x} (the memory backend has none)", peerRank,
                         sessionId);
}

Result<MemoryRegion> MemoryDevice::registerMemory(const void* base, std::size_t bytes) {
  std::lock_guard lock(net_->mu);
  MERIDIAN_ASSIGN_OR_RETURN(const RegistrationCache::Entry e, net_->devices.at(id_).cache->acquire(base, bytes));
  return MemoryRegion{base, bytes, e.key};
}

Status MemoryDevice::deregisterMemory(const MemoryRegion& region) {
  std::lock_guard lock(net_->mu);
  return net_->devices.at(id_).cache->release(region.key);
}

std::uint64_t MemoryDevice::registrations() const {
  std::lock_guard lock(net_->mu);
  return net_->devices.at(id_).cache->registrations();
}

Status MemoryDevice::abandonChannel(std::uint64_t sessionId, int peerRank, const Status& why) {
  std::lock_guard lock(net_->mu);
  for (auto& e : net_->entries) {
    if (e->device == id_ && e->sessionId == sessionId && e->peerRank == peerRank) {
      for (std::size_t p = 0; p < e->link->paths.size(); ++p) net_->failPath(*e->link, p, why, false);
      return Status::ok();
    }
  }
  return invalidArgument("no channel to rank {} in session {:x}", peerRank, sessionId);
}

Status MemoryDevice::cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) {
  std::lock_guard lock(net_->mu);
  for (auto& e : net_->entries) {
    if (e->device == id_ && e->sessionId == sessionId && e->peerRank == peerRank && pathIndex >= 0 &&
        static_cast<std::size_t>(pathIndex) < e->link->paths.size()) {
      net_->failPath(*e->link, static_cast<std::size_t>(pathIndex), pathError("path {} cut on purpose", pathIndex),
                     false);
      return Status::ok();
    }
  }
  return invalidArgument("no channel to rank {} in session {:x} with path {}", peerRank, sessionId, pathIndex);
}

}  // namespace meridian::transport::memory
