// The multipath channel protocol: chunking, scheduling, placement, acks and failover.
#include "transport/multipath/multipath_channel.h"

#include <algorithm>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"

namespace meridian::transport {

enum class ChunkState : std::uint8_t { kPending, kAssigned, kAcked };

struct OutMessage {
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::uint64_t prevSameTag = kNoPrevSeq;
  bool prevExact = false;
  const std::uint8_t* data = nullptr;
  std::uint64_t totalBytes = 0;
  std::uint32_t chunkBytes = 0;
  std::vector<ChunkState> state;
  std::vector<std::uint8_t> assignedPath;
  std::vector<RateStamp> stamp;  // per chunk: noted when written on its assigned path
  std::uint32_t firstPending = 0;  // no pending chunk below this index
  std::uint32_t acked = 0;
  bool finished = false;
  bool eager = false;                 // data points into `copy`; req completed at post
  bool direct = false;                // sent as kDataRef chunks: the peer reads `data` itself
  std::vector<std::uint8_t> copy;
  RequestPtr req;

  std::uint32_t chunkCount() const { return static_cast<std::uint32_t>(state.size()); }
  std::uint64_t chunkOffset(std::uint32_t i) const { return static_cast<std::uint64_t>(i) * chunkBytes; }
  std::uint32_t chunkLength(std::uint32_t i) const {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(chunkBytes, totalBytes - chunkOffset(i)));
  }
  // What a chunk costs a path: its payload and its header (so zero-byte messages count).
  std::uint64_t chunkWireBytes(std::uint32_t i) const { return chunkLength(i) + kFrameHeaderBytes; }
};

enum class InState : std::uint8_t { kUnmatched, kUnexpected, kBound, kDiscard };

struct InMessage {
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::uint64_t prevSameTag = kNoPrevSeq;
  bool prevExact = false;
  std::uint64_t totalBytes = 0;
  InState state = InState::kUnmatched;
  std::uint8_t* dest = nullptr;          // where payload bytes go now
  BufferPool::Buffer buffer;             // holds data until a receive is posted
  RequestPtr req;
  std::uint64_t doneBytes = 0;
  std::uint32_t doneChunks = 0;
  std::unordered_set<std::uint64_t> doneOffsets;
  bool complete = false;
  bool finished = false;  // handed to its request (or dropped); no longer in incoming_
};

struct MultipathChannel::PathState {
  PathEndpoints endpoints;
  std::atomic<bool> alive{true};
  std::atomic<bool> stalled{false};
  std::atomic<int> relayVia{-1};
  std::uint64_t unackedBytes = 0;  // assigned and not yet acknowledged
  std::uint64_t inFlightBytes = 0;  // of those, written to the path
  std::deque<OutChunk> queue;
  RateEstimator rate;
  std::int64_t lastProgressUs = 0;  // last ack, or when the path became busy
  std::atomic<double> rateBytesPerSec{0};
  std::atomic<double> weight{1.0};
  std::atomic<bool> rerate{false};  // routing raised the weight: restart the rate estimate
  mutable std::mutex telemetryMu;  // written about once a second, read by pathStats
  PathTelemetry telemetry;
  Counter* bytesSent;
  Counter* chunksSent;
  Counter* chunksResent;
  Counter* bytesReceived;
  Counter* failures;
  Gauge* up;
  MetricLabels labels;
};

namespace {
const std::uint8_t kZeros[64 * 1024] = {};
constexpr std::size_t kMaxTagMemo = 4096;  // tags remembered per direction (see isend)
constexpr double kStaticRateBytesPerSec = 1e9;
constexpr double kMinPathWeight = 1e-3;  // any equal value: static striping ignores rates
constexpr double kRaisedRateShareOfBest = 8;  // see schedule()
constexpr std::int64_t kTailStallShare = 3;     // see stallLimitUs()
}  // namespace

MultipathChannel::MultipathChannel(int peerRank, std::vector<PathEndpoints> paths, MultipathConfig config,
                                   std::function<void()> wakeProgress, std::shared_ptr<Progressor> progressor)
    : peerRank_(peerRank),
      config_(std::move(config)),
      wake_(std::move(wakeProgress)),
      progressor_(std::move(progressor)) {
  auto& reg = MetricsRegistry::global();
  const std::string peer = config_.peerLabel.empty() ? std::to_string(peerRank) : config_.peerLabel;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    auto p = std::make_unique<PathState>();
    p->endpoints = paths[i];
    anyStandby_ = anyStandby_ || paths[i].standby;
    p->alive.store(!paths[i].relay && probesReach(paths[i].kind), std::memory_order_relaxed);
    MetricLabels labels{{"device", config_.deviceName},
                        {"peer", peer},
                        {"path", paths[i].relay ? std::string("relay") : std::to_string(i)}};
    p->bytesSent = &reg.counter("meridian_transport_path_sent_bytes_total", "Payload bytes written to a path", labels);
    p->chunksSent = &reg.counter("meridian_transport_path_sent_chunks_total", "Chunks written to a path", labels);
    p->chunksResent = &reg.counter("meridian_transport_path_resent_chunks_total",
                                   "Chunks sent again because their path failed or stalled", labels);
    p->bytesReceived =
        &reg.counter("meridian_transport_path_received_bytes_total", "Payload bytes received on a path", labels);
    p->failures = &reg.counter("meridian_transport_path_failures_total", "Times a path failed", labels);
    p->up = &reg.gauge("meridian_transport_path_up", "1 while a path is alive and not stalled", labels);
    p->up->set(paths[i].relay || !probesReach(paths[i].kind) ? 0 : 1);
    p->labels = std::move(labels);
    paths_.push_back(std::move(p));
  }
  unexpectedBytes_ = &reg.counter("meridian_transport_unexpected_bytes_total",
                                  "Payload bytes that arrived before their receive was posted (buffered, copied once)",
                                  {{"device", config_.deviceName}, {"peer", peer}});
}

MultipathChannel::~MultipathChannel() = default;

BufferPool::Buffer BufferPool::take(std::uint64_t bytes) {
  // Reuse a cached buffer of at least `bytes` (and at most twice that) when there is one:
  // fresh memory costs a page fault per 4 KiB.
  auto it = free_.lower_bound(bytes);
  if (it != free_.end() && it->first <= 2 * bytes) {
    Buffer b{std::move(it->second), it->first};
    cachedBytes_ -= it->first;
    free_.erase(it);
    return b;
  }
  return Buffer{std::make_unique_for_overwrite<std::uint8_t[]>(bytes), bytes};
}

void BufferPool::give(Buffer b) {
  if (!b.data) return;
  while (cachedBytes_ + b.capacity > maxCachedBytes_ && !free_.empty()) {
    cachedBytes_ -= free_.begin()->first;
    free_.erase(free_.begin());
  }
  if (b.capacity > maxCachedBytes_) return;
  cachedBytes_ += b.capacity;
  free_.emplace(b.capacity, std::move(b.data));
}

void MultipathChannel::refuseNewPosts(const Status& why) {
  std::lock_guard lock(postMu_);
  closing_ = why;
}

bool MultipathChannel::hasUnackedEagerSends() const {
  // Zero-byte eager sends count nothing here; the loop below looks at them too.
  if (eagerBytes_.load(std::memory_order_relaxed) > 0) return true;
  {
    std::lock_guard lock(postMu_);
    for (const auto& m : postedSends_) {
      if (m->eager) return true;
    }
  }
  return std::any_of(sending_.begin(), sending_.end(), [](const auto& m) { return m->eager && !m->finished; });
}

// ---------------------------------------------------------------- posting (any thread)

Result<RequestPtr> MultipathChannel::isend(const void* data, std::size_t bytes, std::uint64_t tag) {
  if (data == nullptr && bytes > 0) return invalidArgument("isend: null buffer with {} bytes", bytes);
  if (bytes > kMaxMessageBytes) return invalidArgument("isend: {} bytes exceeds the {}-byte limit", bytes, kMaxMessageBytes);
  auto msg = std::make_shared<OutMessage>();
  msg->tag = tag;
  msg->data = static_cast<const std::uint8_t*>(data);
  msg->totalBytes = bytes;
  msg->chunkBytes = config_.chunkBytes;
  std::uint64_t chunks = bytes == 0 ? 1 : (bytes + config_.chunkBytes - 1) / config_.chunkBytes;
  msg->state.assign(chunks, ChunkState::kPending);
  msg->assignedPath.assign(chunks, 0);
  msg->stamp.resize(chunks);
  msg->req = std::make_shared<Request>(progressor_);
  // Small sends are copied and complete now (like MPI's eager protocol): the copy serves
  // any resend, and the caller saves the wait for the acknowledgement.
  if (bytes <= config_.eagerMaxBytes &&
      eagerBytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes <= config_.eagerBudgetBytes) {
    msg->eager = true;
    msg->copy.assign(msg->data, msg->data + bytes);
    msg->data = msg->copy.data();
  } else if (bytes <= config_.eagerMaxBytes) {
    eagerBytes_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  // The caller's buffer stays untouched until every chunk is acknowledged, that is read.
  msg->direct = config_.peerReadsDirect && !msg->eager && bytes > 0;
  {
    std::lock_guard lock(postMu_);
    if (failed_.load(std::memory_order_relaxed) || !closing_.isOk()) {
      if (msg->eager) eagerBytes_.fetch_sub(bytes, std::memory_order_relaxed);
      return failed_.load(std::memory_order_relaxed) ? error_ : closing_;
    }
    msg->seq = nextSendSeq_++;
    auto [it, inserted] = lastSentSeqByTag_.try_emplace(tag, msg->seq);
    if (!inserted) {
      msg->prevSameTag = it->second;  // exactly the previous message with this tag
      msg->prevExact = true;
      it->second = msg->seq;
    } else if (forgotTags_) {
      msg->prevSameTag = forgottenUpToSeq_;  // any earlier one with this tag is at or before this
    }  // else: certainly the first message with this tag (kNoPrevSeq)
    if (lastSentSeqByTag_.size() > kMaxTagMemo) {
      // Forget tags not used in the last kMaxTagMemo/2 messages, remembering how far back.
      std::uint64_t keepFrom = msg->seq - kMaxTagMemo / 2;
      std::erase_if(lastSentSeqByTag_, [&](const auto& e) {
        if (e.second >= keepFrom) return false;
        forgottenUpToSeq_ = forgotTags_ ? std::max(forgottenUpToSeq_, e.second) : e.second;
        forgotTags_ = true;
        return true;
      });
    }
    postedSends_.push_back(msg);
  }
  if (msg->eager) msg->req->complete(Status::ok(), bytes);
  kick();
  return msg->req;
}

Result<RequestPtr> MultipathChannel::irecv(void* data, std::size_t capacityBytes, std::uint64_t tag) {
  if (data == nullptr && capacityBytes > 0) return invalidArgument("irecv: null buffer with {} bytes", capacityBytes);
  auto req = std::make_shared<Request>(progressor_);
  {
    std::lock_guard lock(postMu_);
    if (failed_.load(std::memory_order_relaxed)) return error_;
    if (!closing_.isOk()) return closing_;
    postedRecvs_.push_back({static_cast<std::uint8_t*>(data), capacityBytes, tag, req});
  }
  // No kick: whoever runs the engine next takes posted receives in before it reads any
  // data (TcpDevice::processEvents), so the receive is in place when its message lands.
  return req;
}

void MultipathChannel::kick() {
  // Start the work from this thread when the engine is free (no hand-off to the progress
  // thread); otherwise ring its doorbell.
  bool ran = false;
  if (progressor_) progressor_->pollOnce(&ran);
  if (!ran) wake_();
}

std::vector<PathStats> MultipathChannel::pathStats() const {
  std::vector<PathStats> out;
  for (const auto& p : paths_) {
    PathStats s;
    s.localAddress = p->endpoints.localAddress;
    s.remoteAddress = p->endpoints.remoteAddress;
    s.alive = p->alive.load(std::memory_order_relaxed);
    s.stalled = p->stalled.load(std::memory_order_relaxed);
    s.relay = p->endpoints.relay;
    s.relayVia = p->relayVia.load(std::memory_order_relaxed);
    s.kind = p->endpoints.kind;
    s.bytesSent = p->bytesSent->value();
    s.chunksSent = p->chunksSent->value();
    s.chunksResent = p->chunksResent->value();
    s.bytesReceived = p->bytesReceived->value();
    s.rateBytesPerSec = p->rateBytesPerSec.load(std::memory_order_relaxed);
    s.weight = p->weight.load(std::memory_order_relaxed);
    {
      std::lock_guard lock(p->telemetryMu);
      s.telemetry = p->telemetry;
    }
    out.push_back(std::move(s));
  }
  return out;
}

void MultipathChannel::setPathWeights(std::span<const double> weights) {
  for (std::size_t i = 0; i < weights.size() && i < paths_.size(); ++i) {
    // Zero or below: down (schedule() still uses the path when nothing else is left); a
    // positive weight is kept above the floor the scheduler's rate arithmetic needs.
    const double w = weights[i] <= 0 ? 0.0 : std::max(weights[i], kMinPathWeight);
    // A path routing trusts more again gets a share it can be measured on: its estimate was
    // made while it was avoided and may be stuck too low to win any chunk (schedule()).
    if (w > paths_[i]->weight.exchange(w, std::memory_order_relaxed)) {
      paths_[i]->rerate.store(true, std::memory_order_relaxed);
      rerateAny_.store(true, std::memory_order_release);
    }
  }
}

Status MultipathChannel::health() const {
  std::lock_guard lock(postMu_);
  return error_;
}

// ---------------------------------------------------------------- sending (progress thread)

void MultipathChannel::drainPosted() {
  std::vector<std::shared_ptr<OutMessage>> sends;
  {
    std::lock_guard lock(postMu_);
    sends.swap(postedSends_);
  }
  for (auto& m : sends) {
    drainedSendSeqEnd_ = m->seq + 1;
    sendingBySeq_[m->seq] = m;
    sending_.push_back(std::move(m));
  }
  drainPostedRecvs();
}

void MultipathChannel::drainPostedRecvs() {
  std::vector<PostedRecv> recvs;
  {
    std::lock_guard lock(postMu_);
    recvs.swap(postedRecvs_);
  }
  for (auto& r : recvs) {
    auto uq = unexpectedByTag_.find(r.tag);
    if (uq != unexpectedByTag_.end() && !uq->second.empty()) {
      std::shared_ptr<InMessage> msg = std::move(uq->second.front());
      uq->second.pop_front();
      if (uq->second.empty()) unexpectedByTag_.erase(uq);
      Status st = bind(*msg, std::move(r));
      if (!st.isOk()) {
        fail(st);
        return;
      }
      if (msg->complete) finishIn(msg);
    } else {
      recvsByTag_[r.tag].push_back(std::move(r));
    }
  }
}

void MultipathChannel::schedule(std::int64_t nowUs) {
  if (sending_.empty()) return;
  std::vector<PathLoad>& loads = loads_;  // reused: no allocation on the data path
  loads.resize(paths_.size());
  bool anyUsable = false;
  if (config_.adaptive && rerateAny_.exchange(false, std::memory_order_relaxed)) {
    double best = 0;  // among live paths: a relay slot that is down keeps its initial guess
    for (const auto& p : paths_) {
      if (p->alive.load(std::memory_order_relaxed)) best = std::max(best, p->rate.bytesPerSec());
    }
    // Raised to an eighth of the best path's rate, not to all of it: a path that only looks
    // clear because it was avoided (a slow link the traffic itself congests) would otherwise
    // take a full share of the next burst, stall under it and be avoided again, over and over
    // (seen with an 8 Mbit/s plane next to 40 Mbit/s ones). An eighth is a few chunks of a
    // burst: enough to measure it again, little to lose if it is still slow. From there it
    // probes up to the best path's rate, doubling each round trip it keeps up: its samples
    // alone would only measure the eighth it is given wherever round trips are not set by
    // the path itself (two loopback paths: an eighth for good, issue 24). Its own rate counts
    // only once measured: the initial guess would skip the probe, and the first sample would
    // then replace it outright, one chunk's worth.
    for (auto& p : paths_) {
      if (p->rerate.exchange(false, std::memory_order_relaxed)) {
        const double own = p->rate.measured() ? p->rate.bytesPerSec() : 0;
        p->rate.probe(std::max(best / kRaisedRateShareOfBest, own), best);
      }
    }
  }
  if (!config_.adaptive) assignedBytes_.resize(paths_.size());
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    const PathState& p = *paths_[i];
    // Static striping sees every path alike; adaptive scheduling, the measured rate and
    // routing's weight.
    const bool cold =
        config_.adaptive && !p.rate.measured() && p.rate.deliveredBytes() < config_.coldWindowBytes;
    loads[i] = PathLoad{p.alive.load(std::memory_order_relaxed) && !p.stalled.load(std::memory_order_relaxed),
                        p.unackedBytes,
                        cold ? config_.coldWindowBytes : config_.pathWindowBytes,
                        config_.adaptive ? p.rate.bytesPerSec() : kStaticRateBytesPerSec,
                        0.0,
                        config_.adaptive ? p.weight.load(std::memory_order_relaxed) : 1.0,
                        cold};
  }
  // Standby paths (TCP beside fabric paths under MERIDIAN_FABRIC_TCP=standby) take data only
  // while no other path is usable.
  bool activeUsable = false;
  for (std::size_t i = 0; anyStandby_ && i < paths_.size(); ++i) {
    activeUsable |= loads[i].usable && !paths_[i]->endpoints.standby;
  }
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    if (activeUsable && paths_[i]->endpoints.standby) loads[i].usable = false;
    anyUsable = anyUsable || loads[i].usable;
  }
  if (!anyUsable) {
    // Only stalled paths are left: they are better than none.
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      PathState& p = *paths_[i];
      if (p.alive.load(std::memory_order_relaxed) && p.stalled.exchange(false, std::memory_order_relaxed)) {
        MLOG_WARN(kTransport, "no other path to rank {} is left: using stalled path {} again", peerRank_, i);
        p.up->set(1);
        loads[i].usable = true;
      }
    }
  }
  if (config_.adaptive &&
      std::none_of(loads.begin(), loads.end(), [](const PathLoad& l) { return l.usable && l.weight > 0; })) {
    // Every usable path is one routing sees down: they are better than none, alike.
    for (auto& l : loads) l.weight = kMinPathWeight;
  }
  for (auto& msg : sending_) {
    for (std::uint32_t i = msg->firstPending; i < msg->chunkCount(); ++i) {
      if (msg->state[i] != ChunkState::kPending) {
        if (i == msg->firstPending) ++msg->firstPending;
        continue;
      }
      std::uint64_t len = msg->chunkWireBytes(i);
      auto choice = config_.adaptive ? pickPath(loads, len) : pickPathEvenly(loads, assignedBytes_, len);
      if (!choice || !choice->hasRoom) return;  // nothing usable, or wait for the chosen path to drain
      PathState& p = *paths_[choice->path];
      if (p.unackedBytes == 0) {
        p.lastProgressUs = nowUs;
      }
      p.unackedBytes += len;
      if (!config_.adaptive) assignedBytes_[choice->path] += len;
      loads[choice->path].queuedBytes = p.unackedBytes;
      msg->state[i] = ChunkState::kAssigned;
      msg->assignedPath[i] = static_cast<std::uint8_t>(choice->path);
      msg->stamp[i].sentUs = 0;
      p.queue.push_back({msg, i});
      if (i == msg->firstPending) ++msg->firstPending;
    }
  }
}

bool MultipathChannel::nextChunk(std::size_t path, OutChunk* out) {
  auto& q = paths_[path]->queue;
  while (!q.empty()) {
    OutChunk c = std::move(q.front());
    q.pop_front();
    if (c.msg->finished || c.msg->state[c.index] != ChunkState::kAssigned || c.msg->assignedPath[c.index] != path) {
      continue;  // acknowledged meanwhile, or moved to another path
    }
    *out = std::move(c);
    return true;
  }
  return false;
}

FrameHeader MultipathChannel::chunkHeader(const OutChunk& c) const {
  FrameHeader h;
  h.type = c.msg->direct ? FrameType::kDataRef : FrameType::kData;
  h.tag = c.msg->tag;
  h.seq = c.msg->seq;
  h.prevSameTag = c.msg->prevSameTag;
  h.prevExact = c.msg->prevExact;
  h.offset = c.msg->chunkOffset(c.index);
  h.totalBytes = c.msg->totalBytes;
  h.length = c.msg->chunkLength(c.index);
  return h;
}

RemoteRef MultipathChannel::chunkRef(const OutChunk& c) const {
  return RemoteRef{reinterpret_cast<std::uintptr_t>(c.msg->data + c.msg->chunkOffset(c.index)), 0};
}

const std::uint8_t* MultipathChannel::chunkPayload(const OutChunk& c, std::uint64_t progress, std::size_t* bytes) const {
  std::uint64_t remaining = c.msg->chunkLength(c.index) - progress;
  if (c.msg->finished) {
    // The sender's buffer is the caller's again: finish the frame with zeros.
    *bytes = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, sizeof(kZeros)));
    return kZeros;
  }
  *bytes = static_cast<std::size_t>(remaining);
  return c.msg->data + c.msg->chunkOffset(c.index) + progress;
}

void MultipathChannel::onChunkWritten(std::size_t path, const OutChunk& c, std::int64_t nowUs) {
  PathState& p = *paths_[path];
  p.bytesSent->add(c.msg->chunkLength(c.index));
  p.chunksSent->add();
  OutMessage& msg = *c.msg;
  // A frame finished after its chunk moved elsewhere (a stall) is not this path's to time.
  if (msg.finished || msg.state[c.index] != ChunkState::kAssigned || msg.assignedPath[c.index] != path) return;
  msg.stamp[c.index] = p.rate.onSent(nowUs, p.inFlightBytes == 0);
  p.inFlightBytes += msg.chunkWireBytes(c.index);
}

Status MultipathChannel::onAck(const FrameHeader& h, std::size_t path, std::int64_t nowUs) {
  // Any acknowledgement on a path shows it moves again, even a late one for a chunk that
  // another path delivered meanwhile.
  PathState& via = *paths_[path];
  via.lastProgressUs = nowUs;
  if (via.stalled.exchange(false, std::memory_order_relaxed)) {
    MLOG_INFO(kTransport, "path {} to rank {} recovered from a stall", path, peerRank_);
    via.up->set(1);
  }
  if (h.seq >= drainedSendSeqEnd_) return peerError("ack for message {}, which was never sent", h.seq);
  auto it = sendingBySeq_.find(h.seq);
  if (it == sendingBySeq_.end()) return Status::ok();  // a duplicate ack of a finished message
  OutMessage& msg = *it->second;
  if (h.offset % msg.chunkBytes != 0 || h.offset / msg.chunkBytes >= msg.chunkCount() ||
      h.totalBytes != msg.totalBytes || h.length != msg.chunkLength(static_cast<std::uint32_t>(h.offset / msg.chunkBytes))) {
    return peerError("ack for message {} names chunk [{}, +{}) that was never sent", h.seq, h.offset, h.length);
  }
  auto i = static_cast<std::uint32_t>(h.offset / msg.chunkBytes);
  if (msg.state[i] == ChunkState::kAcked) return Status::ok();
  if (msg.state[i] == ChunkState::kAssigned) {
    PathState& p = *paths_[msg.assignedPath[i]];
    p.unackedBytes -= msg.chunkWireBytes(i);
    if (msg.stamp[i].sentUs != 0) {  // written on the path it is assigned to (not a late ack from an old one)
      p.inFlightBytes -= msg.chunkWireBytes(i);
      p.rate.onAcked(msg.chunkWireBytes(i), msg.stamp[i], nowUs);
    }
    // Figures for routing only once measured: the optimistic starting rate is a guess.
    if (p.rate.measured()) p.rateBytesPerSec.store(p.rate.bytesPerSec(), std::memory_order_relaxed);
    p.lastProgressUs = nowUs;
  }
  msg.state[i] = ChunkState::kAcked;
  if (++msg.acked == msg.chunkCount()) {
    msg.finished = true;
    if (msg.eager) {
      eagerBytes_.fetch_sub(msg.totalBytes, std::memory_order_relaxed);
    } else {
      msg.req->complete(Status::ok(), msg.totalBytes);
    }
    sendingBySeq_.erase(it);
    while (!sending_.empty() && sending_.front()->finished) sending_.pop_front();
  }
  return Status::ok();
}

void MultipathChannel::requeueChunksOf(std::size_t path) {
  PathState& p = *paths_[path];
  for (auto& msg : sending_) {
    if (msg->finished) continue;
    for (std::uint32_t i = 0; i < msg->chunkCount(); ++i) {
      if (msg->state[i] == ChunkState::kAssigned && msg->assignedPath[i] == path) {
        msg->state[i] = ChunkState::kPending;
        msg->firstPending = std::min(msg->firstPending, i);
        p.chunksResent->add();
      }
    }
  }
  p.queue.clear();
  p.unackedBytes = 0;
  p.inFlightBytes = 0;
}

void MultipathChannel::onPathFailed(std::size_t path, const Status& why, bool graceful) {
  PathState& p = *paths_[path];
  if (!p.alive.exchange(false, std::memory_order_relaxed)) return;
  p.up->set(0);
  p.relayVia.store(-1, std::memory_order_relaxed);
  if (!graceful) {
    p.failures->add();
    if (p.endpoints.relay) {
      // Routine: the via rank left or closed it (a job ending tears relays down mid-stream).
      MLOG_INFO(kTransport, "relay path {} to rank {} ended: {}; its chunks move to the other paths", path, peerRank_,
                why.toString());
    } else {
      MLOG_WARN(kTransport, "path {} ({} -> {}) to rank {} failed: {}; its chunks move to the other paths", path,
                p.endpoints.localAddress, p.endpoints.remoteAddress, peerRank_, why.toString());
    }
  }
  requeueChunksOf(path);
  bool anyAlive = std::any_of(paths_.begin(), paths_.end(), [](const auto& q) { return q->alive.load(); });
  if (!anyAlive) {
    // Background traffic (routing's rows and plans) to a peer that left on purpose is not
    // lost work: the peer finished first. Anything else outstanding is.
    const bool idle =
        std::all_of(sending_.begin(), sending_.end(), [](const auto& m) { return m->finished || isBackgroundTag(m->tag); }) &&
        std::all_of(incoming_.begin(), incoming_.end(), [](const auto& e) { return isBackgroundTag(e.second->tag); }) &&
        std::all_of(recvsByTag_.begin(), recvsByTag_.end(), [](const auto& entry) { return isBackgroundTag(entry.first); });
    Status st = peerError("every path to rank {} is gone (last: {})", peerRank_, why.message());
    if (!graceful || !idle) MLOG_ERROR(kTransport, "{}", st.message());
    peerLeft_.store(graceful && idle, std::memory_order_release);
    fail(st);
  }
}

void MultipathChannel::onPathUp(std::size_t path, int via) {
  PathState& p = *paths_[path];
  if (p.alive.load(std::memory_order_relaxed)) return;
  double best = 0;
  for (const auto& q : paths_) {
    if (q.get() != &p && q->alive.load(std::memory_order_relaxed)) best = std::max(best, q->rate.bytesPerSec());
  }
  p.rate.reset(best > 0 ? best : 1e9);
  p.rateBytesPerSec.store(0, std::memory_order_relaxed);
  p.unackedBytes = 0;
  p.inFlightBytes = 0;
  p.queue.clear();
  p.relayVia.store(via, std::memory_order_relaxed);
  p.stalled.store(false, std::memory_order_relaxed);
  p.alive.store(true, std::memory_order_release);
  p.up->set(1);
  if (via >= 0) {
    MLOG_INFO(kTransport, "path {} to rank {} is up (relayed through rank {})", path, peerRank_, via);
  } else {
    MLOG_INFO(kTransport, "path {} ({} -> {}) to rank {} is up", path, p.endpoints.localAddress, p.endpoints.remoteAddress,
              peerRank_);
  }
}

void MultipathChannel::setPathTelemetry(std::size_t path, const PathTelemetry& figures) {
  PathState& p = *paths_[path];
  std::lock_guard lock(p.telemetryMu);
  p.telemetry = figures;
}

MetricLabels MultipathChannel::pathLabels(std::size_t path) const { return paths_[path]->labels; }

EngineChannel makeMultipathChannel(int peerRank, std::vector<PathEndpoints> paths, MultipathConfig config,
                                   std::function<void()> wakeProgress, std::shared_ptr<Progressor> progressor) {
  auto ch = std::make_shared<MultipathChannel>(peerRank, std::move(paths), std::move(config), std::move(wakeProgress),
                                               std::move(progressor));
  return EngineChannel{ch, ch};
}

std::int64_t MultipathChannel::stallLimitUs(const PathState& p, bool idleElsewhere) const {
  // A slow path that is alive may need longer than the limit for what is in flight on it (a
  // 512 KiB chunk takes 4 s at 1 Mbit/s): give it twice what its measured rate needs, up to
  // four limits, or it is declared stalled, its chunks are sent twice and it is dropped
  // until its next acknowledgement, over and over.
  // While another usable path sits idle, the chunks on this one are the tail its messages
  // wait for, and that path could carry them now: twice what the measured rate needs, from a
  // third of the limit up to the limit. (A path swamped by cross-traffic loses segments
  // and its TCP backs off for seconds; the lab saw one 16 MiB allreduce take 4.5 s that way.)
  const std::int64_t base = config_.pathStallUs;
  if (!p.rate.measured() || p.rate.bytesPerSec() <= 0) return base;
  const auto needUs = static_cast<std::int64_t>(2e6 * static_cast<double>(p.inFlightBytes) / p.rate.bytesPerSec());
  if (idleElsewhere) return std::clamp(needUs, base / kTailStallShare, base);
  return std::clamp(needUs, base, 4 * base);
}

void MultipathChannel::checkStalls(std::int64_t nowUs) {
  // Usable paths (alive, not stalled), and how many of them are idle with a positive weight.
  auto usable = [](const PathState& q) {
    return q.alive.load(std::memory_order_relaxed) && !q.stalled.load(std::memory_order_relaxed);
  };
  std::size_t live = 0, idle = 0;
  for (const auto& q : paths_) {
    if (!usable(*q)) continue;
    ++live;
    // A standby path is always idle while it stands by: no sooner move for that.
    if (q->unackedBytes == 0 && q->weight.load(std::memory_order_relaxed) > 0 && !q->endpoints.standby) ++idle;
  }
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    PathState& p = *paths_[i];
    if (!usable(p) || p.unackedBytes == 0) continue;
    // p is usable and busy: the others are live - 1, the idle ones all elsewhere.
    if (live <= 1) continue;  // nowhere better to go: keep waiting on this one
    if (nowUs - p.lastProgressUs > stallLimitUs(p, idle > 0)) {
      --live;
      p.stalled.store(true, std::memory_order_relaxed);
      p.up->set(0);
      MLOG_WARN(kTransport, "path {} to rank {} stalled ({} bytes unacknowledged for {} ms); resending elsewhere", i,
                peerRank_, p.unackedBytes, (nowUs - p.lastProgressUs) / 1000);
      requeueChunksOf(i);
    }
  }
}

void MultipathChannel::fail(const Status& why) {
  {
    std::lock_guard lock(postMu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    error_ = why;
    failed_.store(true, std::memory_order_release);
  }
  drainPosted();  // the failed_ flag stops new posts; fail what was already posted too
  for (auto& m : sending_) {
    if (!m->finished) {
      m->finished = true;
      m->req->complete(why, 0);
    }
  }
  sending_.clear();
  sendingBySeq_.clear();
  for (auto& [tag, q] : recvsByTag_) {
    for (auto& r : q) r.req->complete(why, 0);
  }
  recvsByTag_.clear();
  for (auto& [seq, m] : incoming_) {
    if (m->req && !m->finished) m->req->complete(why, 0);
    m->finished = true;
  }
  incoming_.clear();
  unexpectedByTag_.clear();
  for (auto& p : paths_) p->queue.clear();
}

// ---------------------------------------------------------------- receiving (progress thread)

bool MultipathChannel::isFinishedSeq(std::uint64_t seq) const {
  if (incoming_.count(seq) != 0) return false;
  return seq < nextMatchSeq_ || matchedAhead_.count(seq) != 0;
}

Status MultipathChannel::allocateBuffer(InMessage& msg) {
  if (msg.buffer.data || msg.totalBytes == 0) return Status::ok();
  if (bufferedBytes_ + msg.totalBytes > config_.maxUnexpectedBytes) {
    return peerError("rank {} sent {} bytes ahead of matching receives, over MERIDIAN_MAX_UNEXPECTED_BYTES={}",
                     peerRank_, bufferedBytes_ + msg.totalBytes, config_.maxUnexpectedBytes);
  }
  msg.buffer = pool_.take(msg.totalBytes);
  bufferedBytes_ += msg.totalBytes;
  unexpectedBytes_->add(msg.totalBytes);
  msg.dest = msg.buffer.data.get();
  return Status::ok();
}

void MultipathChannel::releaseBuffer(InMessage& msg) {
  if (!msg.buffer.data) return;
  bufferedBytes_ -= msg.totalBytes;
  pool_.give(std::move(msg.buffer));
}

Result<RecvTarget> MultipathChannel::onDataHeader(const FrameHeader& h, std::size_t path) {
  paths_[path]->bytesReceived->add(h.length);
  if (isFinishedSeq(h.seq)) return RecvTarget{nullptr, h};
  auto it = incoming_.find(h.seq);
  if (it == incoming_.end()) {
    auto msg = std::make_shared<InMessage>();
    msg->seq = h.seq;
    msg->tag = h.tag;
    msg->prevSameTag = h.prevSameTag;
    msg->prevExact = h.prevExact;
    msg->totalBytes = h.totalBytes;
    it = incoming_.emplace(h.seq, msg).first;
    if (canMatch(*msg)) {
      matchReady(msg);
      if (failed()) return error_;
    } else {
      MERIDIAN_RETURN_IF_ERROR(allocateBuffer(*msg));  // wait for earlier messages to be matched
    }
  } else if (it->second->tag != h.tag || it->second->totalBytes != h.totalBytes) {
    return peerError("chunk of message {} disagrees with its earlier chunks (tag {} vs {}, size {} vs {})", h.seq,
                     h.tag, it->second->tag, h.totalBytes, it->second->totalBytes);
  }
  return RecvTarget{it->second, h};
}

void MultipathChannel::matchReady(std::shared_ptr<InMessage> msg) {
  // `msg` is next in its tag's order: give it the oldest receive posted for the tag.
  std::vector<std::shared_ptr<InMessage>> work{std::move(msg)};
  while (!work.empty() && !failed()) {
    std::shared_ptr<InMessage> m = std::move(work.back());
    work.pop_back();
    auto rq = recvsByTag_.find(m->tag);
    if (rq == recvsByTag_.end()) {
      // Its receive may have been posted during this round of progress (the poster runs on
      // another thread): take it in now rather than buffer the message and copy it later.
      drainPostedRecvs();
      if (failed()) return;
      rq = recvsByTag_.find(m->tag);
    }
    Status st;
    if (rq != recvsByTag_.end() && !rq->second.empty()) {
      PostedRecv r = std::move(rq->second.front());
      rq->second.pop_front();
      if (rq->second.empty()) recvsByTag_.erase(rq);
      st = bind(*m, std::move(r));
    } else {
      m->state = InState::kUnexpected;
      st = allocateBuffer(*m);
      unexpectedByTag_[m->tag].push_back(m);
    }
    if (!st.isOk()) {
      fail(st);
      return;
    }
    if (lastMatchedByTag_.size() >= kMaxTagMemo) lastMatchedByTag_.clear();
    lastMatchedByTag_[m->tag] = m->seq;
    markMatched(m->seq);
    if (m->complete) finishIn(m);
    // Messages that waited for this one: the next in global order, and any whose
    // previous same-tag message this was.
    for (auto& entry : incoming_) {
      const std::shared_ptr<InMessage>& other = entry.second;
      if (other->state != InState::kUnmatched || other.get() == m.get()) continue;
      if (canMatch(*other) && std::none_of(work.begin(), work.end(), [&](auto& w) { return w.get() == other.get(); })) {
        work.push_back(other);
      }
    }
  }
}

bool MultipathChannel::canMatch(const InMessage& m) const {
  // Next in its tag's order once every earlier message with the tag is matched: it is the
  // first with the tag, or all messages up to the bound are matched, or the exact
  // previous one is the last matched with this tag.
  if (m.seq == nextMatchSeq_ || m.prevSameTag == kNoPrevSeq || m.prevSameTag < nextMatchSeq_) return true;
  if (!m.prevExact) return false;
  auto last = lastMatchedByTag_.find(m.tag);
  return last != lastMatchedByTag_.end() && last->second == m.prevSameTag;
}

void MultipathChannel::markMatched(std::uint64_t seq) {
  if (seq == nextMatchSeq_) {
    ++nextMatchSeq_;
    while (!matchedAhead_.empty() && *matchedAhead_.begin() == nextMatchSeq_) {
      matchedAhead_.erase(matchedAhead_.begin());
      ++nextMatchSeq_;
    }
  } else {
    matchedAhead_.insert(seq);
  }
}

Status MultipathChannel::bind(InMessage& msg, PostedRecv recv) {
  if (msg.totalBytes > recv.capacity) {
    recv.req->complete(invalidArgument("a {}-byte message from rank {} (tag {}) does not fit the {}-byte receive buffer",
                                       msg.totalBytes, peerRank_, msg.tag, recv.capacity),
                       0);
    msg.state = InState::kDiscard;
    releaseBuffer(msg);
    msg.dest = nullptr;
    return Status::ok();
  }
  if (msg.buffer.data) {
    std::memcpy(recv.data, msg.buffer.data.get(), msg.totalBytes);
    releaseBuffer(msg);
  }
  msg.dest = recv.data;
  msg.req = std::move(recv.req);
  msg.state = InState::kBound;
  return Status::ok();
}

void MultipathChannel::finishIn(const std::shared_ptr<InMessage>& msg) {
  if (msg->finished) return;
  if (msg->state == InState::kBound) {
    msg->finished = true;
    msg->req->complete(Status::ok(), msg->totalBytes);
  } else if (msg->state == InState::kDiscard) {
    msg->finished = true;
  }
  // Unexpected messages stay queued (complete) until a receive is posted for them.
  if (msg->state != InState::kUnmatched) incoming_.erase(msg->seq);
}

std::uint8_t* MultipathChannel::targetPointer(const RecvTarget& t, std::uint64_t progress) const {
  if (!t.msg) return nullptr;
  const InMessage& m = *t.msg;
  if (m.finished || m.dest == nullptr || m.state == InState::kDiscard || m.doneOffsets.count(t.header.offset) != 0) {
    return nullptr;
  }
  return m.dest + t.header.offset + progress;
}

Result<FrameHeader> MultipathChannel::onDataComplete(const RecvTarget& t, std::size_t path) {
  (void)path;
  FrameHeader ack = t.header;
  ack.type = FrameType::kAck;
  ack.prevSameTag = kNoPrevSeq;
  if (t.msg && !t.msg->finished && t.msg->doneOffsets.insert(t.header.offset).second) {
    InMessage& m = *t.msg;
    if (t.header.length > m.totalBytes - m.doneBytes) {
      return peerError("message {} from rank {}: overlapping chunks add up to more than its {} bytes", m.seq,
                       peerRank_, m.totalBytes);
    }
    m.doneBytes += t.header.length;
    ++m.doneChunks;
    if (m.doneBytes == m.totalBytes) {
      m.complete = true;
      if (m.state != InState::kUnmatched) finishIn(t.msg);
    }
  }
  return ack;
}

}  // namespace meridian::transport
