// The routing control loop (routing_control.h).
#include "collectives/routing_control.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "core/metrics.h"
#include "kernels/reduce.h"

namespace meridian::collectives {

namespace {

constexpr auto kTick = std::chrono::milliseconds(50);

Counter& replans(const char* reason) {
  return MetricsRegistry::global().counter("meridian_routing_replans_total",
                                           "Collective plans rank 0 published, by reason", {{"reason", reason}});
}

Counter& relayChanges(int rank, const char* action) {
  return MetricsRegistry::global().counter("meridian_routing_relay_changes_total",
                                           "Relay paths this rank opened or closed (or failed to open)",
                                           {{"rank", std::to_string(rank)}, {"action", action}});
}

namespace membership = bootstrap::membership;

membership::View wholeJob(int size, std::uint64_t epoch) {
  membership::View v;
  v.epoch = epoch;
  for (int r = 0; r < size; ++r) v.members.push_back(r);
  return v;
}

// A proposer waits a quarter of the peer timeout for answers (a slow but live rank has
// answered by then: it was heard within the timeout), and candidates take over at half of it.
membership::Agent::Options agentOptions(std::chrono::milliseconds peerTimeout) {
  membership::Agent::Options o;
  o.phaseTimeout = std::max<Clock::duration>(peerTimeout / 4, std::chrono::milliseconds(100));
  o.takeover = std::max<Clock::duration>(peerTimeout / 2, std::chrono::milliseconds(200));
  return o;
}

Gauge& membershipEpoch() {
  return MetricsRegistry::global().gauge("meridian_membership_epoch",
                                         "The membership epoch the survivors agreed on (0: the job as it started)");
}

Gauge& membershipSize() {
  return MetricsRegistry::global().gauge("meridian_membership_size", "Ranks in the agreed membership");
}

Counter& peersLost() {
  return MetricsRegistry::global().counter("meridian_membership_peers_lost_total",
                                           "Peers this rank declared lost (MERIDIAN_PEER_TIMEOUT_MS, or a failed channel)");
}

Gauge& relayVia(int rank, int peer) {
  return MetricsRegistry::global().gauge("meridian_routing_relay_via_rank",
                                         "The rank the relay path to a peer goes through (-1: none)",
                                         {{"rank", std::to_string(rank)}, {"peer", std::to_string(peer)}});
}

std::string sizeName(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30)) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

RoutingControl::RoutingControl(int rank, int size, std::vector<transport::ChannelPtr> channels,
                               routing::PathMonitor* monitor, PlanSync* sync, RoutingControlOptions options)
    : rank_(rank),
      size_(size),
      channels_(std::move(channels)),
      monitor_(monitor),
      sync_(sync),
      options_(std::move(options)),
      io_(static_cast<std::size_t>(size)),
      nextRelayChange_(static_cast<std::size_t>(size)),
      detector_(rank, size, options_.peerTimeout, Clock::now()),
      receivedBefore_(static_cast<std::size_t>(size)),
      echoesBefore_(static_cast<std::size_t>(size)),
      agent_(rank, wholeJob(size, options_.startEpoch), agentOptions(options_.peerTimeout)),
      table_(size),
      view_(wholeJob(size, options_.startEpoch)) {}

RoutingControl::~RoutingControl() { stop(); }

void RoutingControl::start() {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) {
      postRowReceive(p);
      postMembershipReceive(p);
    }
  }
  if (options_.reportMembership) {
    membershipEpoch().set(static_cast<double>(options_.startEpoch));
    membershipSize().set(size_);
  }
  const TimePoint now = Clock::now();
  nextRow_ = now;
  nextReplan_ = now;
  nextReplanCheck_ = now;
  nextChaos_ = now + options_.chaosInterval;
  thread_ = std::thread([this] { loop(); });
}

void RoutingControl::stop() {
  {
    std::lock_guard<std::mutex> lock(wake_->mu);
    wake_->stopping = true;
  }
  wake_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RoutingControl::Wake::ring() {
  {
    std::lock_guard<std::mutex> lock(mu);
    news = true;
  }
  cv.notify_all();
}

void RoutingControl::postRowReceive(int peer) {
  PeerIo& io = io_[static_cast<std::size_t>(peer)];
  if (io.inbox.empty()) io.inbox.resize(routing::kMaxLinkRowBytes);
  auto req = channels_[static_cast<std::size_t>(peer)]->irecv(io.inbox.data(), io.inbox.size(), kLinkStateTag);
  if (req.isOk()) {
    io.recv = std::move(req).value();
  } else {
    io.failed = true;
  }
}

void RoutingControl::loop() {
  pthread_setname_np(pthread_self(), "mer-route");
  // The thread's firewall: a broken invariant below (a MERIDIAN_CHECK in the planner, say)
  // stops routing and breaks the communicator, not the process.
  try {
    runLoop();
  } catch (const std::exception& e) {
    fail(internalError("routing control (rank {}) stopped: {}", rank_, e.what()));
  } catch (...) {
    fail(internalError("routing control (rank {}) stopped: an unknown exception", rank_));
  }
}

void RoutingControl::fail(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = why;
  }
  // Logged once, where it is handled: by the communicator that the next collective breaks.
  if (sync_ != nullptr) sync_->fail(why);
}

std::vector<int> RoutingControl::lostPeers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

void RoutingControl::noteChannelEnd(int peer, const Status& st) {
  if (st.code() != StatusCode::kPeerError || detector_.gone(peer)) return;
  if (channels_[static_cast<std::size_t>(peer)]->peerLeft()) {
    MLOG_INFO(kRouting, "rank {} left: it closed its channel to rank {}", peer, rank_);
    detector_.left(peer);
  } else {
    detector_.failed(peer, st.toString());
  }
}

void RoutingControl::detectFailures(TimePoint now) {
  if (quiesced_.load(std::memory_order_relaxed)) return;
  // A failed channel is news at once (every 50 ms tick: its health is one read). Signs of
  // life are counted a few times per timeout: reading every channel's figures each tick
  // would cost more than it tells.
  bool ended = false;
  for (int p = 0; p < size_; ++p) {
    const transport::ChannelPtr& ch = channels_[static_cast<std::size_t>(p)];
    if (p == rank_ || !ch || detector_.gone(p)) continue;
    if (const Status st = ch->health(); st.code() == StatusCode::kPeerError) {
      noteChannelEnd(p, st);
      ended = true;
    }
  }
  if (now < nextFailureCheck_ && !ended) return;
  if (now >= nextFailureCheck_) {
    nextFailureCheck_ = now + std::min<Clock::duration>(options_.peerTimeout / 4, std::chrono::milliseconds(250));
    std::vector<std::uint64_t> echoes(static_cast<std::size_t>(size_), 0);
    if (monitor_ != nullptr) {
      for (const routing::PathView& v : monitor_->paths()) {
        if (v.peer >= 0 && v.peer < size_) echoes[static_cast<std::size_t>(v.peer)] += v.figures.received;
      }
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !channels_[static_cast<std::size_t>(p)] || detector_.gone(p)) continue;
      std::uint64_t received = 0;
      for (const transport::PathStats& ps : channels_[static_cast<std::size_t>(p)]->pathStats()) {
        received += ps.bytesReceived;
      }
      const auto i = static_cast<std::size_t>(p);
      if (received != receivedBefore_[i] || echoes[i] != echoesBefore_[i]) detector_.heard(p, now);
      receivedBefore_[i] = received;
      echoesBefore_[i] = echoes[i];
    }
  }
  for (const routing::FailureDetector::Lost& l : detector_.tick(now)) {
    MLOG_WARN(kRouting, "rank {} declared rank {} lost: {}", rank_, l.peer, l.why);
    peersLost().add();
    agent_.suspect(l.peer);
    std::lock_guard<std::mutex> lock(mu_);
    lost_.push_back(l.peer);
  }
  const membership::View& v = agent_.view();
  const auto reachable = static_cast<std::size_t>(
      std::count_if(v.members.begin(), v.members.end(), [&](int m) { return !detector_.lost(m); }));
  if (!cutOffSaid_ && v.contains(rank_) && reachable < v.quorum()) {
    cutOffSaid_ = true;
    MLOG_WARN(kRouting, "rank {} reaches {} of the {} members of membership {}: fewer than a majority, so this side "
              "cannot agree on anything",
              rank_, reachable, v.members.size(), v.toString());
    if (options_.onCutOff) options_.onCutOff(reachable, v);
  }
}

membership::View RoutingControl::membership() const {
  std::lock_guard<std::mutex> lock(mu_);
  return view_;
}

void RoutingControl::postMembershipReceive(int peer) {
  PeerIo& io = io_[static_cast<std::size_t>(peer)];
  // A message names at most every rank of the job.
  if (io.memberInbox.empty()) io.memberInbox.resize(membership::messageBytes(static_cast<std::size_t>(size_)));
  auto req = channels_[static_cast<std::size_t>(peer)]->irecv(io.memberInbox.data(), io.memberInbox.size(), kMembershipTag);
  io.memberRecv = req.isOk() ? std::move(req).value() : nullptr;
  // A message, or the channel's end (a lost peer): the agreement goes on at once.
  if (io.memberRecv) io.memberRecv->whenDone([wake = wake_] { wake->ring(); });
}

void RoutingControl::sendMembership(std::vector<membership::Outgoing> out) {
  for (membership::Outgoing& o : out) {
    if (o.to < 0 || o.to >= size_ || o.to == rank_ || !channels_[static_cast<std::size_t>(o.to)]) continue;
    PeerIo& io = io_[static_cast<std::size_t>(o.to)];
    std::vector<std::uint8_t> bytes = membership::encodeMessage(o.message);
    auto req = channels_[static_cast<std::size_t>(o.to)]->isend(bytes.data(), bytes.size(), kMembershipTag);
    if (req.isOk()) io.memberSends.emplace_back(std::move(bytes), std::move(req).value());
  }
}

void RoutingControl::runMembership(TimePoint now) {
  if (quiesced_.load(std::memory_order_relaxed)) return;
  for (int p = 0; p < size_; ++p) {
    PeerIo& io = io_[static_cast<std::size_t>(p)];
    if (p == rank_) continue;
    std::erase_if(io.memberSends, [](const auto& s) { return s.second->done(); });
    if (!io.memberRecv || !io.memberRecv->done()) continue;
    if (const Status& st = io.memberRecv->status(); !st.isOk()) {
      io.memberRecv = nullptr;
      if (st.code() == StatusCode::kInvalidArgument) {  // larger than any message of this job
        MLOG_WARN(kRouting, "rank {} sent a bad membership message: {}", p, st.toString());
        postMembershipReceive(p);
      }  // otherwise the channel ended: the failure detector says what that means
      continue;
    }
    auto m = membership::decodeMessage(std::span<const std::uint8_t>(io.memberInbox.data(), io.memberRecv->bytes()));
    if (m.isOk() && m.value().from == p) {
      sendMembership(agent_.onMessage(m.value(), now));
    } else {
      MLOG_WARN(kRouting, "rank {} sent a bad membership message: {}", p,
                m.isOk() ? fmt::format("it claims to be rank {}", m.value().from) : m.status().toString());
    }
    postMembershipReceive(p);
  }
  sendMembership(agent_.onTick(now));
  if (agent_.changes() != agentChanges_) {
    agentChanges_ = agent_.changes();
    const membership::View v = agent_.view();
    if (agent_.evicted()) {
      MLOG_WARN(kRouting, "rank {} is out of the job: the others agreed on {} without it", rank_, v.toString());
    } else {
      MLOG_INFO(kRouting, "membership {}: agreed by a majority of the previous view", v.toString());
    }
    if (options_.reportMembership) {
      membershipEpoch().set(static_cast<double>(v.epoch));
      membershipSize().set(static_cast<double>(v.members.size()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      view_ = v;
    }
    if (options_.onView) options_.onView(v, agent_.evicted());
  }
}

Status RoutingControl::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void RoutingControl::runLoop() {
  std::unique_lock<std::mutex> lock(wake_->mu);
  while (!wake_->stopping) {
    wake_->news = false;
    lock.unlock();
    tick(Clock::now());
    lock.lock();
    wake_->cv.wait_for(lock, kTick, [&] { return wake_->stopping || wake_->news; });
  }
}

void RoutingControl::tick(TimePoint now) {
  // Rows that arrived.
  for (int p = 0; p < size_; ++p) {
    PeerIo& io = io_[static_cast<std::size_t>(p)];
    if (p == rank_ || io.failed || !io.recv || !io.recv->done()) continue;
    if (!io.recv->status().isOk()) {
      MLOG_DEBUG(kRouting, "link state from rank {} stopped: {}", p, io.recv->status().toString());
      io.failed = true;
      noteChannelEnd(p, io.recv->status());
      continue;
    }
    detector_.heard(p, now);  // a row is a heartbeat
    auto row = routing::decodeLinkRow(std::span<const std::uint8_t>(io.inbox.data(), io.recv->bytes()), size_);
    if (row.isOk() && row.value().rank == p) {
      std::lock_guard<std::mutex> lock(mu_);
      (void)table_.update(std::move(row).value());
    } else {
      MLOG_WARN(kRouting, "rank {} sent a bad link-state row: {}", p,
                row.isOk() ? fmt::format("it claims rank {}", row.value().rank) : row.status().toString());
    }
    postRowReceive(p);
  }
  detectFailures(now);
  runMembership(now);
  // Our row, to everyone whose previous row has left.
  if (now >= nextRow_) {
    nextRow_ = now + options_.linkStateInterval;
    routing::LinkRow row = ownRow();
    const std::vector<std::uint8_t> bytes = routing::encodeLinkRow(row);
    {
      std::lock_guard<std::mutex> lock(mu_);
      (void)table_.update(std::move(row));
    }
    for (int p = 0; p < size_; ++p) {
      PeerIo& io = io_[static_cast<std::size_t>(p)];
      if (p == rank_ || io.failed || (io.send && !io.send->done())) continue;
      if (io.send && !io.send->status().isOk()) {
        io.failed = true;
        continue;
      }
      io.outbox = bytes;
      auto req = channels_[static_cast<std::size_t>(p)]->isend(io.outbox.data(), io.outbox.size(), kLinkStateTag);
      if (req.isOk()) {
        io.send = std::move(req).value();
      } else {
        io.failed = true;
      }
    }
    updateRelays(now);
  }
  if (rank_ != 0) return;
  if (options_.adaptive && now >= nextReplanCheck_ &&
      (now >= nextReplan_ || table().measuredRates() > ratesAtLastCheck_)) {
    nextReplanCheck_ = now + options_.linkStateInterval;
    replan(now);
  }
  if (options_.chaosInterval.count() > 0 && now >= nextChaos_) {
    nextChaos_ = now + options_.chaosInterval;
    (void)forceReplan(chaosSeed_++);
  }
}

routing::LinkRow RoutingControl::ownRow() const {
  routing::LinkRow row;
  row.rank = rank_;
  row.atUs = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  std::vector<std::vector<transport::PathStats>> stats(static_cast<std::size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && channels_[static_cast<std::size_t>(p)]) stats[static_cast<std::size_t>(p)] = channels_[static_cast<std::size_t>(p)]->pathStats();
  }
  auto rateOf = [&](int peer, int path) -> std::optional<double> {
    const auto& s = stats[static_cast<std::size_t>(peer)];
    if (path < 0 || static_cast<std::size_t>(path) >= s.size()) return std::nullopt;
    const auto& ps = s[static_cast<std::size_t>(path)];
    if (!ps.alive || !(ps.rateBytesPerSec > 0)) return std::nullopt;
    return ps.rateBytesPerSec;
  };
  auto addRates = [&](bool unprobedOnly) {
    for (int p = 0; p < size_; ++p) {
      const auto& s = stats[static_cast<std::size_t>(p)];
      for (std::size_t k = 0; k < s.size() && k < static_cast<std::size_t>(routing::kMaxPathsPerPeer); ++k) {
        if (unprobedOnly && (transport::probesReach(s[k].kind) || !s[k].alive)) continue;
        routing::LinkFigures f;
        f.peer = p;
        f.path = static_cast<int>(k);
        f.kind = s[k].kind;
        f.rateBytesPerSec = rateOf(p, f.path);
        row.links.push_back(f);
      }
    }
  };
  if (monitor_ != nullptr) {
    for (const routing::PathView& v : monitor_->paths()) {
      if (v.path >= routing::kMaxPathsPerPeer) continue;
      routing::LinkFigures f;
      f.peer = v.peer;
      f.path = v.path;
      if (v.figures.valid) {
        f.minRttUs = v.figures.minRttUs;
        f.srttUs = v.figures.srttUs;
        f.jitterUs = v.figures.jitterUs;
        f.loss = v.figures.loss;
      }
      f.rateBytesPerSec = rateOf(v.peer, v.path);
      f.congested = v.state == routing::CongestionState::kCongested;
      row.links.push_back(f);
    }
    addRates(/*unprobedOnly=*/true);  // fabric and shared-memory paths: their measured rates
  } else {
    addRates(/*unprobedOnly=*/false);
  }
  return row;
}

routing::LinkStateTable RoutingControl::table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

routing::RegionAssignment RoutingControl::regions() const {
  auto named = routing::regionsFromNames(options_.regionNames);
  if (named.isOk()) return std::move(named).value();
  auto inferred = routing::inferRegions(table().rttMatrixUs(), size_);
  return inferred.isOk() ? std::move(inferred).value() : routing::RegionAssignment{};
}

int RoutingControl::relayPlane(const routing::LinkStateTable& table, int peer, int via, int planes) const {
  // A leg's figures on plane p, as the rank at its start measured them.
  auto leg = [&](int from, int to, int p) -> double {
    const auto& row = table.row(from);
    if (!row) return 1e300;
    for (const routing::LinkFigures& f : row->links) {
      if (f.peer != to || f.path != p) continue;
      if (f.congested) return 0;
      return f.rateBytesPerSec.value_or(1e300);
    }
    return 1e300;
  };
  int best = 0;
  double bestRate = -1;
  for (int p = 0; p < planes; ++p) {
    const double rate = std::min(leg(rank_, via, p), leg(via, peer, p));
    if (rate > bestRate) {
      bestRate = rate;
      best = p;
    }
  }
  return best;
}

void RoutingControl::updateRelays(TimePoint now) {
  if (!options_.adaptive || !options_.openRelay || size_ < 3) return;
  const routing::LinkStateTable t = table();
  if (!t.complete()) return;
  routing::RegionAssignment regions;
  routing::NetworkView view = currentView(&regions);
  if (!routing::validate(view).isOk()) return;
  // Relays are judged on measured rates only: a stand-in (a neighbour's rate, a prior) is good
  // enough to rank plans, not to move traffic onto a third rank's links. A pair measured in
  // neither direction counts as unusable, so it is never a leg (one measured direction stands
  // for both, as in the view).
  std::vector<bool> measured(static_cast<std::size_t>(size_) * static_cast<std::size_t>(size_), false);
  for (int r = 0; r < size_; ++r) {
    if (!t.row(r)) continue;
    for (const routing::LinkFigures& f : t.row(r)->links) {
      if (f.rateBytesPerSec) measured[static_cast<std::size_t>(r * size_ + f.peer)] = true;
    }
  }
  auto known = [&](int i, int j) {
    return measured[static_cast<std::size_t>(i * size_ + j)] || measured[static_cast<std::size_t>(j * size_ + i)];
  };
  for (int i = 0; i < size_; ++i) {
    for (int j = 0; j < size_; ++j) {
      if (i != j && !known(i, j)) view.links[static_cast<std::size_t>(i * size_ + j)].bytesPerSec = 0;
    }
  }
  for (int peer = rank_ + 1; peer < size_; ++peer) {  // the lower rank of a pair decides
    // Relays are for links between regions: inside one (or with regions unknown) the
    // measured rates of sub-millisecond links are too noisy to move traffic onto a third host.
    if (regions.regionOf.empty() || regions.regionOf[static_cast<std::size_t>(rank_)] ==
                                        regions.regionOf[static_cast<std::size_t>(peer)]) {
      continue;
    }
    const auto& ch = channels_[static_cast<std::size_t>(peer)];
    if (!ch || io_[static_cast<std::size_t>(peer)].failed || now < nextRelayChange_[static_cast<std::size_t>(peer)]) {
      continue;
    }
    const std::vector<transport::PathStats> stats = ch->pathStats();
    // The relay slot and the planes it may use (the direct paths; fabric paths, which follow
    // the relay slot, are not planes a relay can take).
    const auto slot = std::find_if(stats.begin(), stats.end(), [](const transport::PathStats& ps) { return ps.relay; });
    if (slot == stats.end()) return;  // no relay slots (MERIDIAN_RELAY=off)
    const int current = slot->alive ? slot->relayVia : -1;
    relayVia(rank_, peer).set(current);  // also when it went away on its own (the via rank failed)
    const int planes = static_cast<int>(
        std::count_if(stats.begin(), stats.end(), [](const transport::PathStats& ps) { return !ps.relay && probesReach(ps.kind); }));
    if (planes == 0) return;
    const routing::RelayOffer offer =
        routing::bestRelay(view, rank_, peer, kRelayReferenceBytes, 1.0 / planes);
    const bool directMeasured = known(rank_, peer);
    if (current < 0 && directMeasured && offer.via >= 0 && offer.relaySec <= kRelayOpenRatio * offer.directSec) {
      nextRelayChange_[static_cast<std::size_t>(peer)] = now + kRelayHold;
      const int plane = relayPlane(t, peer, offer.via, planes);
      Status st = options_.openRelay(peer, offer.via, plane);
      if (st.isOk()) {
        MLOG_INFO(kRouting, "relay to rank {} through rank {} (plane {}): 16 MiB direct {:.3g} s, two hops {:.3g} s",
                  peer, offer.via, plane, offer.directSec, offer.relaySec);
        relayChanges(rank_, "open").add();
        relayVia(rank_, peer).set(offer.via);
      } else {
        MLOG_WARN(kRouting, "relay to rank {} through rank {}: {}", peer, offer.via, st.toString());
        relayChanges(rank_, "open_failed").add();
      }
    } else if (current >= 0 && directMeasured && offer.via < 0) {
      nextRelayChange_[static_cast<std::size_t>(peer)] = now + kRelayHold;
      MLOG_INFO(kRouting, "relay to rank {} through rank {} closed: the direct link is as good again ({:.3g} s)", peer,
                current, offer.directSec);
      (void)options_.closeRelay(peer);
      relayChanges(rank_, "close").add();
      relayVia(rank_, peer).set(-1);
    }
  }
}

namespace {

// How fast this process folds one vector into another (f32 sum of 4 MiB vectors, the best of
// three passes): the planner's cost of a reduction (NetworkView::reduceBytesPerSec). Measured
// once per process, when the first view is built on a routing thread, never on the data path;
// it takes a few milliseconds.
double localReduceBytesPerSec() {
  static const double rate = [] {
    constexpr std::size_t kCount = std::size_t{1} << 20;
    std::vector<float> acc(kCount, 1.0f), in(kCount, 0.5f);  // filled: the pages are in
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const TimePoint t0 = Clock::now();
      kernels::reduceInto(acc.data(), in.data(), kCount, kernels::DataType::kF32, kernels::ReduceOp::kSum);
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      if (sec > 0) best = std::max(best, static_cast<double>(kCount * sizeof(float)) / sec);
    }
    MLOG_INFO(kRouting, "local reduction rate {:.2f} GB/s (f32 sum; the planner's cost of a reduction)", best / 1e9);
    return best;
  }();
  return rate;
}

}  // namespace

routing::NetworkView RoutingControl::currentView(routing::RegionAssignment* regions) const {
  *regions = this->regions();
  if (regions->regionOf.empty()) regions->regionOf.assign(static_cast<std::size_t>(size_), 0);
  const int count = std::max(1, static_cast<int>(regions->names.size()));
  routing::NetworkView view = table().view(regions->regionOf, count);
  view.reduceBytesPerSec = localReduceBytesPerSec();
  return view;
}

void RoutingControl::replan(TimePoint now) {
  if (!table().complete()) return;
  ratesAtLastCheck_ = table().measuredRates();
  routing::RegionAssignment regions;
  const routing::NetworkView view = currentView(&regions);
  if (!routing::validate(view).isOk()) return;
  routing::PlanTable next = options_.planner ? options_.planner(view) : routing::planAll(view);
  const std::shared_ptr<const routing::PlanTable> current = sync_->latestProposal();
  std::string reason;
  const char* kind = "initial";
  if (!current) {
    reason = fmt::format("initial plan ({} regions{}); 16 MiB: {}", std::max<std::size_t>(1, regions.names.size()),
                         regions.inferred ? ", inferred" : "", next.forBytes(std::size_t{16} << 20).reason);
  } else {
    // The class gaining most against the plan in force, re-costed on today's links.
    double bestGain = 0;
    for (std::size_t c = 0; c < next.plans.size() && c < current->plans.size(); ++c) {
      const double was = routing::predictSeconds(view, current->plans[c], next.classBytes[c]);
      const double now_ = next.plans[c].predictedSec;
      if (was > 0 && now_ < was * (1.0 - kReplanGain) && 1.0 - now_ / was > bestGain) {
        bestGain = 1.0 - now_ / was;
        reason = fmt::format("links changed; {}: {} {:.3g} s -> {}", sizeName(next.classBytes[c]),
                             routing::algorithmName(current->plans[c].algorithm), was, next.plans[c].reason);
      }
    }
    if (reason.empty()) return;
    kind = "links_changed";
  }
  nextReplan_ = now + options_.replanInterval;
  MLOG_INFO(kRouting, "re-plan: {}", reason);
  replans(kind).add();
  sync_->propose(std::make_shared<const routing::PlanTable>(std::move(next)), std::move(reason));
}

Status RoutingControl::forceReplan(std::uint64_t seed) {
  if (rank_ != 0) return invalidArgument("only rank 0 publishes plans (this is rank {})", rank_);
  routing::RegionAssignment regions;
  const routing::NetworkView view = currentView(&regions);
  routing::PlanTable table;
  for (std::size_t b = routing::kMinClassBytes, k = 0; b <= routing::kMaxClassBytes; b <<= 1, ++k) {
    table.classBytes.push_back(b);
    table.plans.push_back(routing::randomPlan(view, seed * 64 + k));
  }
  replans("forced").add();
  sync_->propose(std::make_shared<const routing::PlanTable>(std::move(table)), fmt::format("forced (seed {})", seed));
  return Status::ok();
}

}  // namespace meridian::collectives
