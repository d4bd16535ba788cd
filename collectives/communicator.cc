// Communicator: set-up over the store (addresses, session id, full mesh of channels),
// the ordered op executor (inline or on the "mer-coll" worker), error stickiness and
// transport abort, metrics. The ops themselves are in communicator_ops.cc.
#include "collectives/communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <thread>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "bootstrap/launch_env.h"
#include "core/check.h"
#include "core/fd.h"
#include "core/knobs.h"
#include "core/local_launch.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/secret.h"

namespace meridian::collectives {

using kernels::DataType;
using kernels::ReduceOp;

namespace {


constexpr std::array<const char*, static_cast<std::size_t>(Communicator::OpKind::kCount)> kOpNames{
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier", "send", "recv"};

// Payload size classes for the latency histogram.
constexpr std::array<const char*, 4> kSizeClasses{"le_4KiB", "le_64KiB", "le_4MiB", "gt_4MiB"};
// How long opening a relay may take (a few round trips to the via rank and the peer).
constexpr auto kRelayOpenTimeout = std::chrono::seconds(10);
std::size_t sizeClass(std::size_t bytes) {
  if (bytes <= (std::size_t{4} << 10)) return 0;
  if (bytes <= (std::size_t{64} << 10)) return 1;
  if (bytes <= (std::size_t{4} << 20)) return 2;
  return 3;
}

bool isCollective(Communicator::OpKind k) {
  return k != Communicator::OpKind::kSend && k != Communicator::OpKind::kRecv;
}


// The set-up exchange a device may use to settle group-wide things (transport/device.h),
// over this communicator's keys in the store.
class StoreExchange final : public transport::GroupExchange {
 public:
  StoreExchange(bootstrap::Store& store, std::string base, int rank, int size)
      : store_(store), base_(std::move(base)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<std::vector<std::vector<std::uint8_t>>> allGather(std::string_view key, std::span<const std::uint8_t> mine,
                                                           TimePoint deadline) override {
    return bootstrap::storeAllGather(store_, fmt::format("{}/device/{}", base_, key), rank_, size_, mine, deadline);
  }

 private:
  bootstrap::Store& store_;
  std::string base_;
  int rank_;
  int size_;
};

}  // namespace
// ---- Metrics ------------------------------------------------------------------------

struct Communicator::Metrics {
  static constexpr std::size_t kOps = static_cast<std::size_t>(OpKind::kCount);
  std::array<std::array<Histogram*, kSizeClasses.size()>, kOps> latency{};
  std::array<Counter*, kOps> bytes{};
  std::array<Counter*, kOps> errors{};
  std::array<std::array<Gauge*, kSizeClasses.size()>, kOps> busbw{};

  Metrics() {
    auto& reg = MetricsRegistry::global();
    for (std::size_t op = 0; op < kOps; ++op) {
      for (std::size_t c = 0; c < kSizeClasses.size(); ++c) {
        latency[op][c] = &reg.histogram("meridian_collectives_op_latency_seconds",
                                        "Latency of communicator ops from start to completion, in seconds",
                                        {{"op", kOpNames[op]}, {"size_class", kSizeClasses[c]}},
                                        exponentialBuckets(1e-6, 4, 14));
      }
      for (std::size_t c = 0; c < kSizeClasses.size(); ++c) {
        busbw[op][c] = &reg.gauge("meridian_collectives_busbw_bytes_per_second",
                                  "Bus bandwidth of the latest op of this kind and size class (nccl-tests convention)",
                                  {{"op", kOpNames[op]}, {"size_class", kSizeClasses[c]}});
      }
      bytes[op] = &reg.counter("meridian_collectives_op_bytes_total",
                               "Payload bytes per rank of finished communicator ops", {{"op", kOpNames[op]}});
      errors[op] = &reg.counter("meridian_collectives_op_errors_total", "Communicator ops that failed",
                                {{"op", kOpNames[op]}});
    }
  }
};

struct Communicator::Owned {
  std::unique_ptr<bootstrap::StoreServer> server;
  std::unique_ptr<bootstrap::Store> store;
  // A successor keeps its predecessor's: the job's first store stays up while its host does.
  std::unique_ptr<Owned> previous;
};

// ---- Set-up -------------------------------------------------------------------------

Communicator::Communicator(int rank, int worldSize, const CommOptions& resolved)
    : rank_(rank),
      size_(worldSize),
      timeout_(resolved.timeout),
      smallBytes_(resolved.smallMessageBytes),
      segmentBytes_(resolved.ringSegmentBytes),
      metrics_(std::make_unique<Metrics>()) {}

Result<std::unique_ptr<Communicator>> Communicator::create(bootstrap::Store& store, int rank, int worldSize,
                                                           const CommOptions& options) {
  return build(store, rank, worldSize, options, Lineage{});
}

Result<std::unique_ptr<Communicator>> Communicator::build(bootstrap::Store& store, int rank, int worldSize,
                                                          const CommOptions& options, Lineage lineage) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    return invalidArgument("rank {} / world size {} out of range", rank, worldSize);
  }
  if (lineage.jobRanks.empty()) {
    for (int r = 0; r < worldSize; ++r) lineage.jobRanks.push_back(r);
  }
  if (lineage.jobRanks.size() != static_cast<std::size_t>(worldSize)) {
    return internalError("a successor of {} ranks names {} job ranks", worldSize, lineage.jobRanks.size());
  }
  CommOptions opts = options;
  if (opts.localAddresses.empty()) opts.localAddresses = splitCommaList(knobString(knobs::kPaths));
  if (opts.localAddresses.empty()) opts.localAddresses = {"127.0.0.1"};
  if (opts.timeout.count() <= 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kTimeoutMs));
    opts.timeout = std::chrono::milliseconds(ms);
  }
  if (opts.smallMessageBytes == 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t bytes, readKnobInt(knobs::kSmallAllreduceBytes));
    opts.smallMessageBytes = static_cast<std::size_t>(bytes);
  }
  if (opts.ringSegmentBytes == 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t bytes, readKnobInt(knobs::kRingSegmentBytes));
    opts.ringSegmentBytes = static_cast<std::size_t>(bytes);
  }
  if (opts.secret.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(opts.secret, readJobSecret(worldSize));
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::string elastic, readKnobChoice(knobs::kElastic, opts.elastic));
  opts.elastic = elastic;
  log::setRank(lineage.jobRanks[static_cast<std::size_t>(rank)]);
  transport::setWaitersShareCores(localRanksOutnumberCores());
  const TimePoint deadline = Clock::now() + opts.timeout;

  std::unique_ptr<Communicator> comm(new Communicator(rank, worldSize, opts));
  comm->options_ = opts;
  comm->elastic_ = elastic == "on";
  comm->jobRanks_ = std::move(lineage.jobRanks);
  comm->epoch_ = lineage.epoch;
  comm->split_ = lineage.split;
  comm->jobStore_ = &store;  // a successor's caller puts the job's store back

  MERIDIAN_ASSIGN_OR_RETURN(const std::string routingMode, readKnobChoice(knobs::kRouting, opts.routing));
  comm->adaptive_ = routingMode == "adaptive";
  MERIDIAN_ASSIGN_OR_RETURN(comm->algo_, readKnobChoice(knobs::kAlgo, opts.algo));
  static constexpr std::array<std::pair<std::string_view, AlgoChoice>, 5> kAlgos{
      {{"auto", AlgoChoice::kAuto},
       {"ring", AlgoChoice::kRing},
       {"recursive_doubling", AlgoChoice::kRecursiveDoubling},
       {"hierarchical", AlgoChoice::kHierarchical},
       {"direct", AlgoChoice::kDirect}}};
  const auto known = std::find_if(kAlgos.begin(), kAlgos.end(), [&](const auto& a) { return a.first == comm->algo_; });
  if (known == kAlgos.end()) return internalError("MERIDIAN_ALGO={} has no algorithm here", comm->algo_);
  comm->algoChoice_ = known->second;
  MERIDIAN_ASSIGN_OR_RETURN(const std::string relay, readKnobChoice(knobs::kRelay));
  comm->relay_ = comm->adaptive_ && relay == "auto";
  MERIDIAN_ASSIGN_OR_RETURN(const std::string directRead, readKnobChoice(knobs::kDirectRead));
  transport::DeviceOptions dev;
  dev.adaptive = comm->adaptive_;
  dev.relaySlot = comm->relay_;
  dev.directRead = directRead == "auto";
  dev.localAddresses = opts.localAddresses;
  dev.tcp.streamsPerPath = opts.streamsPerPath;
  dev.secret = opts.secret;
  if (opts.name.size() > 6) return invalidArgument("communicator name '{}' is longer than 6 characters", opts.name);
  comm->metricsName_ = opts.name + std::to_string(rank);
  dev.name = comm->metricsName_;
  MERIDIAN_ASSIGN_OR_RETURN(comm->device_, transport::Device::create(std::move(dev)));

  // Communicators created in the same order on every rank get the same generation.
  MERIDIAN_ASSIGN_OR_RETURN(std::int64_t ticket, store.add(opts.storePrefix + "/generation", 1));
  const std::string base = fmt::format("{}/{}", opts.storePrefix, (ticket - 1) / worldSize);

  // Rank 0 picks the session id that tags every channel of this communicator.
  const std::string sessionKey = base + "/session";
  std::array<std::uint8_t, 8> sessionBytes{};
  if (rank == 0) {
    do {
      randomBytes(sessionBytes);
      std::memcpy(&comm->sessionId_, sessionBytes.data(), sizeof(comm->sessionId_));
    } while (comm->sessionId_ == 0);
    MERIDIAN_RETURN_IF_ERROR(store.set(sessionKey, sessionBytes));
  } else {
    MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::uint8_t> v, store.get(sessionKey, deadline));
    if (v.size() != sessionBytes.size()) return peerError("store key {} holds {} bytes, not 8", sessionKey, v.size());
    std::memcpy(&comm->sessionId_, v.data(), sizeof(comm->sessionId_));
  }

  MERIDIAN_ASSIGN_OR_RETURN(comm->peerEndpoints_,
                            bootstrap::storeAllGather(store, base + "/addr", rank, worldSize, comm->device_->endpoint(), deadline));
  StoreExchange exchange(store, base, rank, worldSize);
  MERIDIAN_ASSIGN_OR_RETURN(const transport::GroupInfo group,
                            comm->device_->joinGroup(exchange, comm->sessionId_, deadline));
  comm->allSameHost_ = group.everyPairReadsDirect;
  MERIDIAN_ASSIGN_OR_RETURN(const std::string shm, readKnobChoice(knobs::kShm, opts.shm));
  if (shm == "auto" && worldSize > 1) {
    std::string why;
    MERIDIAN_ASSIGN_OR_RETURN(comm->shm_, HostArena::join(exchange, opts.secret, comm->sessionId_, deadline, &why));
    if (comm->shm_) {
      MLOG_INFO(kCollectives, "rank {}: all {} ranks share this host: allreduce and barrier through shared memory",
                rank, worldSize);
    } else {
      MLOG_INFO(kCollectives, "rank {}: no shared memory between the ranks ({})", rank, why);
    }
  }

  MERIDIAN_RETURN_IF_ERROR(comm->openMesh(deadline));

  MERIDIAN_RETURN_IF_ERROR(comm->startRouting(store, base, opts, deadline));
  comm->worker_ = std::thread([c = comm.get()] { c->workerLoop(); });
  MLOG_INFO(kCollectives, "communicator up: rank {} of {}{}, session {:016x}, {} paths {}", rank, worldSize,
            comm->epoch_ > 0 ? fmt::format(" (membership epoch {})", comm->epoch_) : std::string(),
            comm->sessionId_, transport::deviceKindName(comm->device_->kind()),
            comm->device_->describe(comm->device_->endpoint()));
  return comm;
}

Status Communicator::openMesh(TimePoint deadline) {
  // Full mesh: this rank connects to every higher rank and takes the lower ranks'
  // connections. Opened one after another, each channel would cost its connect and
  // handshake round trips in turn (seconds to a handful of peers across oceans), so a few
  // openers work through the peers side by side: the higher ranks first, then the lower.
  // It cannot deadlock: an initiator's dial completes in the peer's event loop whether or
  // not the peer waits for it yet, and every wait ends by the deadline.
  channels_.resize(static_cast<std::size_t>(size_));
  std::vector<int> peers;
  for (int peer = rank_ + 1; peer < size_; ++peer) peers.push_back(peer);
  for (int peer = 0; peer < rank_; ++peer) peers.push_back(peer);
  std::vector<Status> results(peers.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto opener = [&] {
    // After a failure the set-up fails anyway: no new opens, those under way end by the deadline.
    for (std::size_t i = next.fetch_add(1); i < peers.size() && !failed; i = next.fetch_add(1)) {
      const int peer = peers[i];
      transport::ChannelSpec spec;
      spec.sessionId = sessionId_;
      spec.selfRank = rank_;
      spec.peerRank = peer;
      spec.initiate = peer > rank_;
      // Both sides pass the peer's endpoint: the path count is min(ours, theirs).
      spec.peer = peerEndpoints_[static_cast<std::size_t>(peer)];
      auto ch = device_->openChannel(spec, deadline);
      if (!ch.isOk()) {
        results[i] = ch.status().withContext(fmt::format("rank {}: channel to rank {}", rank_, peer));
        failed = true;
        continue;
      }
      channels_[static_cast<std::size_t>(peer)] = std::move(ch).value();
    }
  };
  // Bounded: each opener holds a thread (and an initiator a dialler per stream) while it waits.
  const std::size_t openers = std::min<std::size_t>(peers.size(), kMaxConcurrentOpens);
  {
    std::vector<std::jthread> pool;
    for (std::size_t t = 1; t < openers; ++t) pool.emplace_back(opener);
    opener();
  }  // joined: every open ended, by the deadline at the latest
  for (auto& st : results) MERIDIAN_RETURN_IF_ERROR(st);
  return Status::ok();
}

Result<std::unique_ptr<Communicator>> Communicator::createFromEnvironment(const CommOptions& options) {
  MERIDIAN_ASSIGN_OR_RETURN(bootstrap::LaunchInfo info, bootstrap::detectLaunch());
  log::setRank(info.rank);
  CommOptions opts = options;
  if (opts.timeout.count() <= 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kTimeoutMs));
    opts.timeout = std::chrono::milliseconds(ms);
  }
  if (opts.localAddresses.empty()) opts.localAddresses = bootstrap::localPathAddresses(info);
  auto owned = std::make_unique<Owned>();
  if (opts.secret.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(opts.secret, readJobSecret(info.worldSize));
  }
  MERIDIAN_ASSIGN_OR_RETURN(owned->store,
                            bootstrap::rendezvous(info, opts.secret, Clock::now() + opts.timeout, &owned->server));
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                            create(*owned->store, info.rank, info.worldSize, opts));
  comm->owned_ = std::move(owned);
  return comm;
}

void Communicator::labelMetrics() const {
  const std::string mine = static_cast<std::size_t>(rank_) < regionNames_.size() ? regionNames_[static_cast<std::size_t>(rank_)] : "";
  MetricLabels constant{{"rank", std::to_string(rank_)}};
  if (!mine.empty()) constant.emplace_back("region", mine);
  MetricsRegistry::global().setConstLabels(constant);
  labelPeerMetrics(regionNames_);
}

void Communicator::labelPeerMetrics(const std::vector<std::string>& memberRegions) const {
  auto& reg = MetricsRegistry::global();
  // Transport series carry this communicator's device label, routing series its prober's.
  const MetricLabels mine[] = {{{"device", metricsName_}}, {{"prober", metricsName_}}};
  for (int p = 0; p < size_; ++p) {
    const auto pi = static_cast<std::size_t>(p);
    if (p == rank_ || pi >= memberRegions.size() || memberRegions[pi].empty()) continue;
    for (const auto& when : mine) reg.annotate("peer", std::to_string(p), {{"peer_region", memberRegions[pi]}}, when);
  }
  const std::vector<std::string> planes = splitCommaList(knobString(knobs::kPlanes));
  for (const auto& when : mine) {
    for (std::size_t i = 0; i < planes.size(); ++i) reg.annotate("path", std::to_string(i), {{"plane", planes[i]}}, when);
    reg.annotate("path", "relay", {{"plane", "relay"}}, when);
  }
}

double busBandwidthFactor(Communicator::OpKind op, int ranks) {
  const double n = ranks;
  switch (op) {
    case Communicator::OpKind::kAllreduce: return 2.0 * (n - 1) / n;
    case Communicator::OpKind::kReduceScatter:
    case Communicator::OpKind::kAllgather: return (n - 1) / n;
    default: return 1.0;
  }
}

bootstrap::Store* Communicator::store() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owned_ ? owned_->store.get() : nullptr;
}

Communicator::~Communicator() {
  if (parent_ != nullptr) {
    std::lock_guard<std::mutex> lock(parent_->mu_);
    std::erase(parent_->children_, this);
  }
  stopChildren(commError("its parent communicator was destroyed"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Communicator* child : children_) child->parent_ = nullptr;
    children_.clear();
  }
  std::deque<Op> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    abandoned.swap(queue_);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // A recovery under way ends by its deadline (it waits on the other survivors).
  if (recoveryThread_.joinable()) recoveryThread_.join();
  for (auto& op : abandoned) {
    op.work->complete(commError("communicator destroyed before op {} ran", op.work->sequence()));
  }
  abortTransport(commError("communicator destroyed"));
}

Status Communicator::startRouting(bootstrap::Store& store, const std::string& base, const CommOptions& opts, TimePoint deadline) {
  const std::string region = opts.region.empty() ? knobString(knobs::kRegion) : opts.region;
  std::vector<std::string> endpoints;
  if (opts.probe && size_ > 1) {
    routing::ProberOptions po;
    po.localAddresses = bootstrap::withoutPorts(opts.localAddresses);  // a port there is the data port
    po.interval = opts.probeInterval;
    if (po.interval.count() <= 0) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kProbeIntervalMs));
      po.interval = std::chrono::milliseconds(ms);
    }
    po.secret = opts.secret;  // resolved in create()
    po.sessionId = sessionId_;
    po.selfRank = rank_;
    po.name = metricsName_;
    // The channels outlive the monitor (it is reset first on abort), so it may use them.
    std::vector<transport::ChannelPtr> channels = channels_;
    auto channelOf = [channels](int peer) -> const transport::ChannelPtr& {
      return channels[static_cast<std::size_t>(peer)];
    };
    auto apply = [channelOf](int peer, const std::vector<double>& w) {
      if (const auto& ch = channelOf(peer)) ch->setPathWeights(w);
    };
    auto readPaths = [channelOf](int peer) {
      const auto& ch = channelOf(peer);
      return ch ? ch->pathStats() : std::vector<transport::PathStats>{};
    };
    MERIDIAN_ASSIGN_OR_RETURN(monitor_, routing::PathMonitor::create(po, adaptive_, apply, readPaths));
    endpoints = monitor_->endpoints();
  }
  nlohmann::json mine{{"region", region}, {"probe", endpoints}};
  const std::string text = mine.dump();
  MERIDIAN_ASSIGN_OR_RETURN(
      auto blobs, bootstrap::storeAllGather(store, base + "/routing", rank_, size_,
                                 std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()),
                                                               text.size()),
                                 deadline));
  regionNames_.assign(static_cast<std::size_t>(size_), "");
  for (int r = 0; r < size_; ++r) {
    const auto& blob = blobs[static_cast<std::size_t>(r)];
    auto j = nlohmann::json::parse(std::string(blob.begin(), blob.end()), nullptr, false);
    const bool wellFormed = !j.is_discarded() && j.is_object() && j.contains("region") && j["region"].is_string() &&
                            j.contains("probe") && j["probe"].is_array() &&
                            std::all_of(j["probe"].begin(), j["probe"].end(), [](const auto& e) { return e.is_string(); });
    if (!wellFormed) return peerError("rank {} published malformed routing data", r);
    regionNames_[static_cast<std::size_t>(r)] = j["region"].get<std::string>();
    const auto peerEndpoints = j["probe"].get<std::vector<std::string>>();
    if (monitor_ && r != rank_ && !peerEndpoints.empty()) MERIDIAN_RETURN_IF_ERROR(monitor_->setPeer(r, peerEndpoints));
  }
  // Every rank computes the same hierarchy from the same names: no plan needs sending.
  hierarchy_ = hierarchyFromRegions(regionNames_);
  if (algoChoice_ == AlgoChoice::kHierarchical && !hierarchy_) {
    return invalidArgument("MERIDIAN_ALGO=hierarchical needs every rank's MERIDIAN_REGION, at least 2 regions, "
                           "and the same number of ranks in each");
  }
  if (size_ > 1) {
    planSync_ = std::make_unique<PlanSync>(rank_, size_, channels_,
                                           opts.planCheckpointOps > 0 ? opts.planCheckpointOps : 1024);
    RoutingControlOptions rc;
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t rowMs, readKnobInt(knobs::kLinkStateIntervalMs));
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t replanMs, readKnobInt(knobs::kReplanIntervalMs));
    rc.linkStateInterval = std::chrono::milliseconds(rowMs);
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t peerTimeoutMs, readKnobInt(knobs::kPeerTimeoutMs));
    rc.peerTimeout = std::chrono::milliseconds(peerTimeoutMs);
    peerTimeout_ = rc.peerTimeout;
    rc.replanInterval = std::chrono::milliseconds(replanMs);
    rc.chaosInterval = opts.chaosReplan;
    if (rc.chaosInterval.count() < 0) {
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t chaosMs, readKnobInt(knobs::kChaosReplanMs));
      rc.chaosInterval = std::chrono::milliseconds(chaosMs);
    }
    rc.adaptive = adaptive_;
    rc.regionNames = regionNames_;
    rc.startEpoch = epoch_;
    rc.reportMembership = !split_;
    rc.onView = [this](const bootstrap::membership::View& v, bool evicted) { onView(v, evicted); };
    rc.onCutOff = [this](std::size_t reachable, const bootstrap::membership::View& v) { onCutOff(reachable, v); };
    if (relay_) {
      rc.openRelay = [this](int peer, int via, int plane) {
        transport::RelaySpec spec{sessionId_, rank_, peer, via, peerEndpoints_[static_cast<std::size_t>(via)], plane};
        return device_->openRelay(spec, Clock::now() + kRelayOpenTimeout);
      };
      rc.closeRelay = [this](int peer) { return device_->closeRelay(sessionId_, peer); };
    }
    control_ = std::make_unique<RoutingControl>(rank_, size_, channels_, monitor_.get(), planSync_.get(), rc);
    control_->start();
  }
  if (hierarchy_) {
    MLOG_INFO(kCollectives, "{} regions of {} ranks{}", hierarchy_->groups.size(), hierarchy_->groups.front().size(),
              algoChoice_ == AlgoChoice::kHierarchical ? ": large allreduces run hierarchically" : "");
  }
  return Status::ok();
}

PlanInForce Communicator::plan() const { return planSync_ ? planSync_->inForce() : PlanInForce{}; }

routing::LinkStateTable Communicator::linkState() const {
  return control_ ? control_->table() : routing::LinkStateTable(size_);
}

std::vector<int> Communicator::lostPeers() const { return control_ ? control_->lostPeers() : std::vector<int>{}; }

bootstrap::membership::View Communicator::membership() const {
  if (control_) return control_->membership();
  return bootstrap::membership::View{0, {rank_}};
}

routing::RegionAssignment Communicator::regions() const {
  return control_ ? control_->regions() : routing::RegionAssignment{};
}

Status Communicator::proposePlan(routing::PlanTable table, std::string reason) {
  if (!planSync_) return invalidArgument("a communicator of one rank has nothing to plan");
  if (rank_ != 0) return invalidArgument("only rank 0 publishes plans (this is rank {})", rank_);
  if (table.plans.empty() || table.plans.size() != table.classBytes.size() ||
      table.plans.size() > routing::kMaxPlanClasses ||
      std::adjacent_find(table.classBytes.begin(), table.classBytes.end(), std::greater_equal<>()) !=
          table.classBytes.end()) {
    return invalidArgument("plan table: {} classes, {} plans (want 1..{}, equal, sizes increasing)",
                           table.classBytes.size(), table.plans.size(), routing::kMaxPlanClasses);
  }
  for (const auto& p : table.plans) MERIDIAN_RETURN_IF_ERROR(routing::validatePlan(p, size_));
  planSync_->propose(std::make_shared<const routing::PlanTable>(std::move(table)), std::move(reason));
  return Status::ok();
}

Status Communicator::forceReplan(std::uint64_t seed) {
  if (!control_) return invalidArgument("a communicator of one rank has nothing to plan");
  return control_->forceReplan(seed);
}

std::optional<Hierarchy> hierarchyFromRegions(const std::vector<std::string>& names) {
  std::vector<std::string> order;  // regions by first appearance
  std::vector<std::vector<int>> groups;
  for (std::size_t r = 0; r < names.size(); ++r) {
    if (names[r].empty()) return std::nullopt;
    auto it = std::find(order.begin(), order.end(), names[r]);
    if (it == order.end()) {
      order.push_back(names[r]);
      groups.emplace_back();
      it = order.end() - 1;
    }
    groups[static_cast<std::size_t>(it - order.begin())].push_back(static_cast<int>(r));
  }
  Hierarchy h{std::move(groups), {}};
  if (!validateHierarchy(h, static_cast<int>(names.size())).isOk()) return std::nullopt;
  return h;
}

std::vector<routing::PathView> Communicator::paths() const {
  std::lock_guard<std::mutex> lock(mu_);
  return monitor_ ? monitor_->paths() : std::vector<routing::PathView>{};
}

std::vector<transport::PathStats> Communicator::peerPathStats(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer < 0 || peer >= size_ || !broken_.isOk()) return {};
  const auto& ch = channels_[static_cast<std::size_t>(peer)];
  return ch ? ch->pathStats() : std::vector<transport::PathStats>{};
}

void Communicator::stopTransport() {
  std::lock_guard<std::mutex> once(transportMu_);
  if (transportStopped_) return;
  transportStopped_ = true;
  // Peers waiting on this rank in shared memory fail now, not at their deadline.
  if (shm_) shm_->abort();
  if (control_) control_->stop();  // it reads the monitor and sends on the channels
  {
    std::unique_ptr<routing::PathMonitor> monitor;
    {
      std::lock_guard<std::mutex> lock(mu_);
      monitor = std::move(monitor_);
    }
  }  // joined here, outside mu_
  device_.reset();  // joins the progress thread: nothing touches a buffer after this
  std::lock_guard<std::mutex> lock(mu_);  // peerPathStats() and execute() read channels_ from other threads
  channels_.assign(channels_.size(), nullptr);
}

void Communicator::abortTransport(const Status& why, bool abandon) {
  if (abandon) abandonPeers(everyRank(), why);
  stopTransport();
  for (auto& req : opRequests_.takeUnfinished()) req->complete(why, 0);
  for (auto& req : deferred_) req->complete(why, 0);  // ignored by the finished ones
  deferred_.clear();
}

// ---- Executor -----------------------------------------------------------------------

Status Communicator::health() const { return brokenStatus(); }

Status Communicator::brokenStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return brokenStatusLocked();
}

Status Communicator::brokenStatusLocked() const {
  if (broken_.isOk()) return Status::ok();
  if (broken_.code() == StatusCode::kCommError) return broken_;  // says what happened already
  return commError("communicator broken: {}", broken_.toString());
}

void Communicator::markBroken(const Status& reason, bool replace, bool planned) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.isOk() || replace) {
    broken_ = reason;
    // An elastic communicator's failures are expected: its recovery says what came of them.
    if (planned) {
      MLOG_INFO(kCollectives, "rank {}: {}", rank_, reason.toString());
    } else if (elastic_ || replace) {
      MLOG_WARN(kCollectives, "rank {}: {}", rank_, reason.toString());
    } else {
      MLOG_ERROR(kCollectives, "rank {}: communicator broken: {}", rank_, reason.toString());
    }
  }
}

Status Communicator::checkPeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return invalidArgument("peer {} is not another rank of this communicator (rank {} of {})", peer, rank_, size_);
  }
  return Status::ok();
}

Communicator::WorkPtr Communicator::submit(OpKind kind, DataType dtype, std::size_t bytes, Body body,
                                           Status invalid) {
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work = std::make_shared<Work>(nextWorkSeq_++);
    // A collective rejected here still uses up its sequence number: when only some ranks
    // rejected it, the others' copy times out instead of matching this rank's next op.
    if (!invalid.isOk() && isCollective(kind)) ++nextCollSeq_;
    if (invalid.isOk() && broken_.isOk()) {
      Op op{kind, dtype, bytes, isCollective(kind) ? nextCollSeq_++ : 0, std::move(body), work};
      queue_.push_back(std::move(op));
      cv_.notify_all();
      return work;
    }
  }
  work->complete(invalid.isOk() ? brokenStatus() : std::move(invalid));
  return work;
}

Status Communicator::runSync(OpKind kind, DataType dtype, std::size_t bytes, Body body, Status invalid) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!invalid.isOk()) {
    if (isCollective(kind)) ++nextCollSeq_;  // as in submit()
    return invalid;
  }
  if (!broken_.isOk()) {
    lock.unlock();
    return brokenStatus();
  }
  auto work = std::make_shared<Work>(nextWorkSeq_++);
  Op op{kind, dtype, bytes, isCollective(kind) ? nextCollSeq_++ : 0, std::move(body), work};
  if (queue_.empty() && !running_) {
    running_ = true;
    lock.unlock();
    execute(op);  // inline: nothing ahead of us
    lock.lock();
    running_ = false;
    if (!queue_.empty()) cv_.notify_all();
    lock.unlock();
  } else {
    queue_.push_back(std::move(op));
    cv_.notify_all();
    lock.unlock();
  }
  return work->wait();
}

void Communicator::workerLoop() {
  pthread_setname_np(pthread_self(), "mer-coll");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
    if (stopping_) return;  // the destructor fails whatever is still queued
    Op op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    execute(op);
    lock.lock();
    running_ = false;
  }
}

void Communicator::execute(Op& op) {
  AlgoContext ctx;
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);  // a recovery may break us and clear the channels meanwhile
    st = brokenStatusLocked();
    if (st.isOk()) ctx.channels = channels_;
  }
  const TimePoint start = Clock::now();
  if (st.isOk()) {
    ctx.rank = rank_;
    ctx.size = size_;
    ctx.dtype = op.dtype;
    ctx.elemBytes = kernels::dataTypeSize(op.dtype);
    ctx.tagBase = op.collSeq * kPhasesPerOp;
    ctx.deadline = start + timeout_;
    ctx.scratch = &scratch_;
    ctx.tracker = &opRequests_;
    ctx.segmentBytes = segmentBytes_;
    std::erase_if(deferred_, [](const transport::RequestPtr& r) { return r->done(); });
    std::shared_ptr<const routing::PlanTable> plans;
    try {
      if (isCollective(op.kind) && planSync_) {
        auto inForce = planSync_->atCollective(op.collSeq, ctx.deadline, meanOpSec_);
        if (inForce.isOk()) plans = std::move(inForce).value();
        st = inForce.status();
      }
      ctx.plans = plans.get();
      if (st.isOk()) st = op.body(ctx, *op.work);
    } catch (const std::exception& e) {
      st = internalError("{} threw: {}", kOpNames[static_cast<std::size_t>(op.kind)], e.what());
    }
    if (!st.isOk() && st.code() != StatusCode::kInvalidArgument) {
      markBroken(st);
      // Elastic: the channels to the survivors carry the agreement and the successor's
      // rendezvous, so they stay up until the successor is built.
      if (elastic_) {
        awaitRecovery();
        st = brokenStatus();  // the one reason every survivor gives (aborted, cut off, or the op's own)
      }
      abortTransport(commError("communicator broken: {}", st.toString()), /*abandon=*/true);
    } else if (!isCollective(op.kind)) {
      for (auto& req : opRequests_.takeUnfinished()) deferred_.push_back(std::move(req));
    }
    opRequests_.clear();
  }
  const auto k = static_cast<std::size_t>(op.kind);
  if (st.isOk()) {
    const double sec = std::chrono::duration<double>(Clock::now() - start).count();
    if (isCollective(op.kind)) meanOpSec_ = meanOpSec_ == 0 ? sec : 0.9 * meanOpSec_ + 0.1 * sec;
    metrics_->latency[k][sizeClass(op.bytes)]->observe(sec);
    metrics_->bytes[k]->add(op.bytes);
    if (isCollective(op.kind) && op.bytes > 0 && sec > 0)
      metrics_->busbw[k][sizeClass(op.bytes)]->set(static_cast<double>(op.bytes) / sec * busBandwidthFactor(op.kind, size_));
  } else {
    metrics_->errors[k]->add();
  }
  op.work->complete(std::move(st));
}

// ---- Elastic recovery (docs/elastic.md) ---------------------------------------------

namespace {

// The successor's store address as its host sends it: "a.b.c.d:port".
constexpr std::size_t kMaxStoreAddressBytes = 64;

std::string membersOf(const std::vector<int>& jobRanks, const std::vector<int>& members) {
  std::string out;
  for (int m : members) {
    if (!out.empty()) out += ',';
    out += std::to_string(m >= 0 && static_cast<std::size_t>(m) < jobRanks.size() ? jobRanks[static_cast<std::size_t>(m)] : m);
  }
  return out;
}

}  // namespace

void Communicator::onView(const bootstrap::membership::View& view, bool evicted) {
  if (!elastic_) return;  // the control thread logged it; the next failure breaks us for good
  // One successor per communicator: later views are the successor's business.
  (void)startRecovery([this, view, evicted] { return recover(view, evicted); });
}

bool Communicator::startRecovery(std::function<Result<std::unique_ptr<Communicator>>()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || recovery_ != Recovery::kNone) return false;
  recovery_ = Recovery::kRunning;
  recoveryThread_ = std::thread([this, work = std::move(work)] {
    pthread_setname_np(pthread_self(), "mer-recover");
    if (control_) control_->quiesce();  // what happens to these channels now is no news
    stopChildren(commError("aborted: the membership of the parent communicator changed"));
    Result<std::unique_ptr<Communicator>> next = work();
    std::lock_guard<std::mutex> done(mu_);
    if (next.isOk()) {
      successor_ = std::move(next).value();
      recovery_ = Recovery::kDone;
    } else {
      recoveryError_ = next.status();
      recovery_ = Recovery::kFailed;
    }
    cv_.notify_all();
  });
  return true;
}

void Communicator::retire() {
  stopOnPurpose(commError("retired: a successor communicator took over"),
                commError("retired: the parent communicator's successor took over"), Status::ok());
}

void Communicator::abandon(const Status& why) {
  stopOnPurpose(commError("given up by this rank: {}", why.toString()),
                commError("its parent communicator was given up: {}", why.toString()), why);
}

void Communicator::stopOnPurpose(const Status& why, const Status& childrenWhy, const Status& failChannels) {
  markBroken(why, /*replace=*/false, /*planned=*/true);
  stopChildren(childrenWhy, /*planned=*/true);
  if (control_) control_->quiesce();  // what the others see of this is no news here
  if (!failChannels.isOk()) abandonPeers(everyRank(), failChannels);
  stopTransport();
}

void Communicator::abandonPeers(const std::vector<int>& peers, const Status& why) {
  std::lock_guard<std::mutex> once(transportMu_);
  if (transportStopped_ || !device_) return;
  for (int p : peers) {
    if (p != rank_) (void)device_->abandonChannel(sessionId_, p, why.isOk() ? peerError("rank {} is lost", p) : why);
  }
}

std::vector<int> Communicator::everyRank() const {
  std::vector<int> all(static_cast<std::size_t>(size_));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

void Communicator::onCutOff(std::size_t reachable, const bootstrap::membership::View& view) {
  if (!elastic_) return;
  const std::string jobView = fmt::format("epoch {} {{{}}}", view.epoch, membersOf(jobRanks_, view.members));
  (void)startRecovery([this, reachable, jobView, n = view.members.size()]() -> Result<std::unique_ptr<Communicator>> {
    const Status why = commError("cut off: this rank reaches {} of the {} members of membership {}, fewer than a "
                                 "majority (the others go on without it; it may join again)",
                                 reachable, n, jobView);
    markBroken(why, /*replace=*/true);
    abandonPeers(everyRank());  // none of them answers from here
    stopTransport();       // the op in flight waits on peers that cannot answer: it fails now
    return why;
  });
}

Result<std::unique_ptr<Communicator>> Communicator::recover(const bootstrap::membership::View& view, bool evicted) {
  std::vector<int> lost;
  for (int r = 0; r < size_; ++r) {
    if (!view.contains(r)) lost.push_back(r);
  }
  const std::string jobView = fmt::format("epoch {} {{{}}}", view.epoch, membersOf(jobRanks_, view.members));
  Result<std::unique_ptr<Communicator>> next = internalError("no successor");
  if (evicted) {
    next = commError("this rank is out of the job: the others agreed on membership {} without it", jobView);
    markBroken(next.status(), /*replace=*/true);
  } else {
    // From here every new op fails at once: the collective sequence ends on the old view.
    markBroken(commError("aborted: membership {} (job ranks), without rank(s) {}", jobView, membersOf(jobRanks_, lost)),
               /*replace=*/true);
    const TimePoint start = Clock::now();
    next = buildSuccessor(view, start + options_.timeout);
    if (next.isOk()) {
      MLOG_INFO(kCollectives, "successor communicator up: membership {}, this rank {} of {} ({:.0f} ms)", jobView,
                next.value()->rank(), next.value()->size(),
                std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    } else {
      MLOG_ERROR(kCollectives, "rank {}: no successor for membership {}: {}", jobRanks_[static_cast<std::size_t>(rank_)],
                 jobView, next.status().toString());
    }
  }
  // Every survivor is in the successor's set-up by now (it finished only once all were),
  // so this communicator's channels have said all they had to. The lost ranks' channels are
  // given up first: closing does not wait on peers that cannot answer.
  abandonPeers(lost);
  stopTransport();
  if (next.isOk()) {
    std::lock_guard<std::mutex> lock(mu_);  // store() reads owned_
    next.value()->owned_->previous = std::move(owned_);
  }
  return next;
}

Result<std::string> Communicator::hostSetUpStore(Owned& owned) const {
  const std::vector<std::string> ips = bootstrap::withoutPorts(options_.localAddresses);
  MERIDIAN_ASSIGN_OR_RETURN(owned.server, bootstrap::StoreServer::start(ips.front(), 0, options_.secret));
  return fmt::format("{}:{}", ips.front(), owned.server->port());
}

Status Communicator::shareSetUpAddress(int host, const std::vector<int>& members, std::uint64_t tag,
                                       std::string* address, TimePoint deadline) {
  if (host == rank_) {
    std::vector<transport::RequestPtr> sends;
    for (int m : members) {
      if (m == rank_) continue;
      MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                                channels_[static_cast<std::size_t>(m)]->isend(address->data(), address->size(), tag));
      sends.push_back(std::move(req));
    }
    for (auto& req : sends) MERIDIAN_RETURN_IF_ERROR(req->wait(deadline));
    return Status();
  }
  // Bounded by the receive: a longer message fails it.
  std::array<char, kMaxStoreAddressBytes> buf{};
  MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req, channels_[static_cast<std::size_t>(host)]->irecv(buf.data(), buf.size(), tag));
  MERIDIAN_RETURN_IF_ERROR(req->wait(deadline).withContext(fmt::format("from rank {}", jobRanks_[static_cast<std::size_t>(host)])));
  address->assign(buf.data(), req->bytes());
  const auto colon = address->rfind(':');
  const bool wellFormed = colon != std::string::npos && colon > 0 && colon + 1 < address->size() &&
                          std::all_of(address->begin(), address->end(), [](char c) {
                            return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == ':';
                          });
  if (!wellFormed) return peerError("rank {} sent a malformed store address", jobRanks_[static_cast<std::size_t>(host)]);
  return Status();
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, const std::string& name) {
  const TimePoint deadline = Clock::now() + options_.timeout;
  std::vector<std::int64_t> colors(static_cast<std::size_t>(size_));
  const std::int64_t mine = color;
  if (size_ > 1) MERIDIAN_RETURN_IF_ERROR(allgather(&mine, colors.data(), 1, DataType::kI64));
  else colors[0] = mine;
  std::vector<int> group;  // this communicator's ranks of the same colour, in order
  for (int r = 0; r < size_; ++r) {
    if (colors[static_cast<std::size_t>(r)] == mine) group.push_back(r);
  }
  const int newRank = static_cast<int>(std::find(group.begin(), group.end(), rank_) - group.begin());
  Lineage lineage{epoch_, {}, /*split=*/true};
  for (int m : group) lineage.jobRanks.push_back(jobRanks_[static_cast<std::size_t>(m)]);
  auto owned = std::make_unique<Owned>();
  std::string address;
  if (group.size() == 1) {
    owned->store = std::make_unique<bootstrap::StoreState>();
  } else {
    if (group.front() == rank_) {
      MERIDIAN_ASSIGN_OR_RETURN(address, hostSetUpStore(*owned));
    }
    MERIDIAN_RETURN_IF_ERROR(shareSetUpAddress(group.front(), group, kSplitTag, &address, deadline)
                                 .withContext(fmt::format("splitting communicator '{}'", name)));
  }
  CommOptions opts = options_;
  opts.name = name;
  opts.elastic = "off";  // its parent's membership decides
  opts.storePrefix = "meridian/split";
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child,
                            buildThrough(std::move(owned), address, newRank, static_cast<int>(group.size()), opts,
                                         std::move(lineage), deadline, nullptr));
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.isOk()) return brokenStatusLocked();  // the membership changed meanwhile
  children_.push_back(child.get());
  child->parent_ = this;
  return child;
}

void Communicator::stopChildren(const Status& why, bool planned) {
  // Under mu_: a child being destroyed waits here to deregister. A child takes no lock of
  // its parent's while it stops.
  std::lock_guard<std::mutex> lock(mu_);
  for (Communicator* child : children_) {
    child->markBroken(why, /*replace=*/true, planned);
    // A membership change: some of the child's peers may be gone or cut off, and closing
    // would wait on them for what they were last sent (seconds). The child is done with
    // every peer either way, and each survivor stops its own child for the same view.
    if (!planned) {
      child->abandonPeers(child->everyRank());
    }
    child->stopTransport();
  }
}

Result<std::unique_ptr<Communicator>> Communicator::buildThrough(std::unique_ptr<Owned> owned, const std::string& address,
                                                                 int rank, int worldSize, const CommOptions& options,
                                                                 Lineage lineage, TimePoint deadline,
                                                                 bootstrap::Store* jobStore) {
  if (!owned->store) {
    MERIDIAN_ASSIGN_OR_RETURN(owned->store, bootstrap::TcpStore::connect(address, options.secret, deadline));
  }
  std::chrono::milliseconds full = options.timeout;
  if (full.count() <= 0) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kTimeoutMs));
    full = std::chrono::milliseconds(ms);
  }
  // The set-up gets what is left until the deadline; the ops afterwards the usual timeout.
  CommOptions opts = options;
  opts.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (opts.timeout.count() <= 0) return timeoutError("no time left to set up the communicator");
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> next,
                            build(*owned->store, rank, worldSize, opts, std::move(lineage)));
  next->options_.timeout = full;
  next->timeout_ = full;
  next->owned_ = std::move(owned);
  next->jobStore_ = jobStore;
  return next;
}

Result<std::unique_ptr<Communicator>> Communicator::buildSuccessor(const bootstrap::membership::View& view,
                                                                   TimePoint deadline) {
  const auto at = std::find(view.members.begin(), view.members.end(), rank_);
  if (at == view.members.end()) return internalError("membership {} without rank {}", view.toString(), rank_);
  const int newRank = static_cast<int>(at - view.members.begin());
  const int newSize = static_cast<int>(view.members.size());
  Lineage lineage{view.epoch, {}};
  for (int m : view.members) lineage.jobRanks.push_back(jobRanks_[static_cast<std::size_t>(m)]);
  auto owned = std::make_unique<Owned>();
  const int host = view.members.front();
  std::string address;
  if (newSize == 1) {
    owned->store = std::make_unique<bootstrap::StoreState>();
  } else {
    if (host == rank_) {
      MERIDIAN_ASSIGN_OR_RETURN(address, hostSetUpStore(*owned));
    }
    MERIDIAN_RETURN_IF_ERROR(shareSetUpAddress(host, view.members, kSuccessorTag, &address, deadline)
                                 .withContext("the successor's store address"));
  }
  return buildThrough(std::move(owned), address, newRank, newSize, options_, std::move(lineage), deadline, jobStore_);
}

void Communicator::awaitRecovery() {
  // The agreement needs a loss declared (at most a peer timeout) and a few phases of at most
  // half a timeout each; with nothing started by then, there is no membership change coming.
  const TimePoint giveUp = Clock::now() + 3 * peerTimeout_ + std::chrono::seconds(1);
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, giveUp, [&] { return recovery_ != Recovery::kNone; })) {
    recovery_ = Recovery::kFailed;
    recoveryError_ = commError("communicator broken: {} (no membership change followed)", broken_.toString());
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return recovery_ == Recovery::kDone || recovery_ == Recovery::kFailed; });
}

Result<std::unique_ptr<Communicator>> Communicator::successor(TimePoint deadline) {
  if (!elastic_) return invalidArgument("no successor: this communicator is not elastic (MERIDIAN_ELASTIC=off)");
  std::unique_lock<std::mutex> lock(mu_);
  const bool ended = cv_.wait_until(lock, deadline, [&] {
    return recovery_ == Recovery::kDone || recovery_ == Recovery::kFailed;
  });
  if (!ended) {
    if (!broken_.isOk()) return timeoutError("no successor yet: {}", broken_.toString());
    return timeoutError("no successor: the membership did not change");
  }
  if (recovery_ == Recovery::kFailed) return recoveryError_;
  if (!successor_) return invalidArgument("the successor was already taken");
  return std::move(successor_);
}

// ---- Grow (docs/elastic.md) ---------------------------------------------------------

namespace {

// Job-store keys of joining: a ticket counter, one request per ticket, its admission, and
// how many tickets were admitted (or given up) so far.
constexpr std::string_view kJoinCount = "meridian/elastic/join/count";
constexpr std::string_view kJoinDone = "meridian/elastic/join/done";
std::string joinRequestKey(std::int64_t ticket) { return fmt::format("meridian/elastic/join/{}", ticket); }
std::string joinAdmissionKey(std::int64_t ticket) { return fmt::format("meridian/elastic/join/{}/admitted", ticket); }
// An admission names every member: bounded well above any job.
constexpr std::size_t kMaxAdmissionBytes = std::size_t{1} << 20;
// How long rank 0 waits for a counted request to appear (the joiner sets it right after).
constexpr auto kJoinRequestWait = std::chrono::seconds(5);
// A joiner tries the job's store this long at a time, and gives up once it refused
// connections for kJoinRefusedFor.
constexpr auto kJoinAttempt = std::chrono::seconds(2);
constexpr auto kJoinRefusedFor = std::chrono::seconds(10);

std::vector<std::uint8_t> bytesOfText(const std::string& text) { return {text.begin(), text.end()}; }

// An admission as the joiners and members read it: where the grown communicator is set up,
// its epoch and its members' job ranks (this one's rank in it is the joiner's own field).
struct Admission {
  std::string store;
  std::uint64_t epoch = 0;
  std::vector<int> jobRanks;
  int rank = -1;
};

// At least `minRanks` members (a joiner joins someone: 2; after a drain one may be left).
Result<Admission> parseAdmission(std::span<const std::uint8_t> bytes, std::size_t minRanks = 2) {
  if (bytes.size() > kMaxAdmissionBytes) return peerError("an admission of {} bytes", bytes.size());
  auto j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  const bool wellFormed = !j.is_discarded() && j.is_object() && j.contains("store") && j["store"].is_string() &&
                          j.contains("epoch") && j["epoch"].is_number_unsigned() && j.contains("job_ranks") &&
                          j["job_ranks"].is_array() && j.contains("rank") && j["rank"].is_number_integer();
  if (!wellFormed) return peerError("a malformed admission");
  Admission a;
  a.store = j["store"].get<std::string>();
  a.epoch = j["epoch"].get<std::uint64_t>();
  a.rank = j["rank"].get<int>();
  for (const auto& r : j["job_ranks"]) {
    if (!r.is_number_integer() || r.get<std::int64_t>() < 0 || r.get<std::int64_t>() >= bootstrap::membership::kMaxRanks) {
      return peerError("an admission names a job rank out of range");
    }
    a.jobRanks.push_back(r.get<int>());
  }
  std::vector<int> sorted = a.jobRanks;
  std::sort(sorted.begin(), sorted.end());
  if (a.jobRanks.size() < minRanks || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || a.rank < -1 ||
      a.rank >= static_cast<int>(a.jobRanks.size())) {
    return peerError("an admission of {} job ranks (repeated, or too few) with rank {}", a.jobRanks.size(), a.rank);
  }
  return a;
}

std::string encodeAdmission(const Admission& a) {
  return nlohmann::json{{"store", a.store}, {"epoch", a.epoch}, {"job_ranks", a.jobRanks}, {"rank", a.rank}}.dump();
}

}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::join(const std::string& storeAddress, int jobRank,
                                                         const CommOptions& options, TimePoint deadline) {
  CommOptions opts = options;
  if (opts.secret.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(opts.secret, readJobSecret(2));  // for the store; build() resolves the rest
  }
  auto root = std::make_unique<Owned>();
  // The job's store exists already: unreachable (a cut network) is waited out until the
  // deadline, but a store refusing connections for a while means the job is over (or its
  // host is gone), and waiting longer helps nobody.
  for (TimePoint refusedSince = TimePoint::max();;) {
    auto store = bootstrap::TcpStore::connect(storeAddress, opts.secret, std::min(deadline, Clock::now() + kJoinAttempt));
    if (store.isOk()) {
      root->store = std::move(store).value();
      break;
    }
    const TimePoint now = Clock::now();
    if (store.status().message().find("refused") == std::string::npos) {
      refusedSince = TimePoint::max();
    } else if (refusedSince == TimePoint::max()) {
      refusedSince = now;
    } else if (now - refusedSince > kJoinRefusedFor) {
      return peerError("the job's store at {} has refused connections for {} s: the job is over, or its host is gone",
                       storeAddress, std::chrono::duration_cast<std::chrono::seconds>(kJoinRefusedFor).count());
    }
    if (now >= deadline) return store.status().withContext("joining the job");
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ticket, root->store->add(std::string(kJoinCount), 1));
  MERIDIAN_RETURN_IF_ERROR(
      root->store->set(joinRequestKey(ticket), bytesOfText(nlohmann::json{{"job_rank", jobRank}}.dump())));
  MLOG_INFO(kCollectives, "asked to join the job at {} (ticket {}{})", storeAddress, ticket,
            jobRank >= 0 ? fmt::format(", as job rank {}", jobRank) : std::string());
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::uint8_t> reply, root->store->get(joinAdmissionKey(ticket), deadline));
  MERIDIAN_ASSIGN_OR_RETURN(const Admission a, parseAdmission(reply));
  if (a.rank < 0) return peerError("the members admitted ticket {} without a rank", ticket);
  bootstrap::Store* jobStore = root->store.get();
  auto owned = std::make_unique<Owned>();
  owned->previous = std::move(root);
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> next,
                            buildThrough(std::move(owned), a.store, a.rank, static_cast<int>(a.jobRanks.size()), opts,
                                         Lineage{a.epoch, a.jobRanks}, deadline, jobStore));
  MLOG_INFO(kCollectives, "joined the job: membership epoch {} {{{}}}, this rank {} of {}", a.epoch,
            fmt::join(a.jobRanks, ","), next->rank(), next->size());
  return next;
}

Result<Communicator::MembershipRequests> Communicator::membershipRequests(bool leave, BuildState build) {
  std::int64_t pending = 0;
  if (rank_ == 0 && jobStore_ != nullptr) {
    auto count = jobStore_->add(std::string(kJoinCount), 0);
    auto done = jobStore_->add(std::string(kJoinDone), 0);
    if (count.isOk() && done.isOk()) {
      pending = std::max<std::int64_t>(0, count.value() - done.value());
    } else {
      MLOG_WARN(kCollectives, "the job's store does not answer, so no rank can join now: {}",
                (count.isOk() ? done.status() : count.status()).toString());
    }
  }
  // One word per member: bit 0 asks to leave, bits 1-2 the build state, the rest (rank 0's)
  // counts the joiners.
  std::vector<std::int64_t> words(static_cast<std::size_t>(size_));
  const std::int64_t mine = (std::min<std::int64_t>(pending, bootstrap::membership::kMaxRanks) << 3) |
                            (static_cast<std::int64_t>(build) << 1) | (leave ? 1 : 0);
  if (size_ > 1) MERIDIAN_RETURN_IF_ERROR(allgather(&mine, words.data(), 1, DataType::kI64));
  else words[0] = mine;
  MembershipRequests r;
  r.joiners = static_cast<int>(words[0] >> 3);
  r.builtEverywhere = true;
  for (int m = 0; m < size_; ++m) {
    const std::int64_t w = words[static_cast<std::size_t>(m)];
    if ((w & 1) != 0) r.leaving.push_back(m);
    const auto state = static_cast<BuildState>((w >> 1) & 3);
    r.builtEverywhere = r.builtEverywhere && state == BuildState::kBuilt;
    r.buildFailed = r.buildFailed || state == BuildState::kFailed;
  }
  return r;
}

Communicator::MembershipChange::~MembershipChange() = default;

Result<std::unique_ptr<Communicator>> Communicator::MembershipChange::build(TimePoint deadline) {
  if (rank_ < 0) return std::unique_ptr<Communicator>();
  return buildThrough(std::make_unique<Owned>(), store_, rank_, static_cast<int>(jobRanks_.size()), options_,
                      Lineage{epoch_, jobRanks_}, deadline, jobStore_);
}

void Communicator::MembershipChange::cancel() {
  std::unique_ptr<bootstrap::StoreServer> stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = std::move(server_);
  }
  // Its destructor answers the parked requests with an error and closes every connection.
  if (stopping) MLOG_INFO(kCollectives, "membership epoch {}: the change was dropped, its set-up store stops", epoch_);
}

Result<std::unique_ptr<Communicator::MembershipChange>> Communicator::planMembershipChange(
    const MembershipRequests& requests) {
  if (requests.leaving.size() >= static_cast<std::size_t>(size_)) {
    return invalidArgument("every member asks to leave: nobody to hand over to");
  }
  std::vector<int> staying;  // this communicator's ranks that stay, in order
  for (int r = 0; r < size_; ++r) {
    if (!std::binary_search(requests.leaving.begin(), requests.leaving.end(), r)) staying.push_back(r);
  }
  // Rank 0 decides who is in and where the new communicator is set up (it hosts the set-up
  // store and keeps it until every member built it, also when it leaves); the others learn
  // it in two broadcasts (the length, then the plan).
  auto change = std::unique_ptr<MembershipChange>(new MembershipChange());
  Admission plan;
  std::string text;
  if (rank_ == 0) {
    Owned host;
    auto address = hostSetUpStore(host);
    change->server_ = std::move(host.server);
    const bool joins = requests.joiners > 0 && jobStore_ != nullptr;
    auto count = joins ? jobStore_->add(std::string(kJoinCount), 0) : Result<std::int64_t>(0);
    auto done = joins ? jobStore_->add(std::string(kJoinDone), 0) : Result<std::int64_t>(0);
    if (address.isOk() && count.isOk() && done.isOk()) {
      plan.store = address.value();
      plan.epoch = std::max(epoch_, membership().epoch) + 1;
      for (int m : staying) plan.jobRanks.push_back(jobRanks_[static_cast<std::size_t>(m)]);
      std::vector<std::int64_t> tickets;
      for (std::int64_t t = done.value() + 1; t <= count.value(); ++t) {
        auto request = jobStore_->get(joinRequestKey(t), Clock::now() + kJoinRequestWait);
        int wanted = -1;
        if (request.isOk()) {
          auto j = nlohmann::json::parse(request->begin(), request->end(), nullptr, false);
          if (!j.is_discarded() && j.is_object() && j.contains("job_rank") && j["job_rank"].is_number_integer()) {
            wanted = static_cast<int>(std::clamp<std::int64_t>(j["job_rank"].get<std::int64_t>(), -1,
                                                               bootstrap::membership::kMaxRanks - 1));
          }
        }
        (void)jobStore_->add(std::string(kJoinDone), 1);  // answered either way
        if (!request.isOk()) continue;  // asked and went away
        const bool taken = wanted < 0 || std::find(plan.jobRanks.begin(), plan.jobRanks.end(), wanted) != plan.jobRanks.end();
        plan.jobRanks.push_back(taken ? *std::max_element(plan.jobRanks.begin(), plan.jobRanks.end()) + 1 : wanted);
        tickets.push_back(t);
      }
      for (std::size_t i = 0; i < tickets.size(); ++i) {
        Admission theirs = plan;
        theirs.rank = static_cast<int>(staying.size() + i);
        (void)jobStore_->set(joinAdmissionKey(tickets[i]), bytesOfText(encodeAdmission(theirs)));
      }
      if (!tickets.empty() || !requests.leaving.empty()) text = encodeAdmission(plan);
    } else {
      MLOG_WARN(kCollectives, "cannot change the membership now: {}",
                !address.isOk() ? address.status().toString()
                               : (count.isOk() ? done.status() : count.status()).toString());
    }
  }
  std::int64_t length = static_cast<std::int64_t>(text.size());
  MERIDIAN_RETURN_IF_ERROR(broadcast(&length, &length, 1, DataType::kI64, 0));
  if (length <= 0) return againStatus("nothing to change (the joiners went away, or rank 0 could not)");
  if (static_cast<std::size_t>(length) > kMaxAdmissionBytes) return internalError("an admission of {} bytes", length);
  std::vector<std::int32_t> words((static_cast<std::size_t>(length) + 3) / 4, 0);
  if (rank_ == 0) std::memcpy(words.data(), text.data(), text.size());
  MERIDIAN_RETURN_IF_ERROR(broadcast(words.data(), words.data(), words.size(), DataType::kI32, 0));
  MERIDIAN_ASSIGN_OR_RETURN(plan, parseAdmission(std::span<const std::uint8_t>(
                                      reinterpret_cast<const std::uint8_t*>(words.data()), static_cast<std::size_t>(length)),
                                  /*minRanks=*/1));
  const auto at = std::find(staying.begin(), staying.end(), rank_);
  change->store_ = plan.store;
  change->epoch_ = plan.epoch;
  change->jobRanks_ = plan.jobRanks;
  change->rank_ = at == staying.end() ? -1 : static_cast<int>(at - staying.begin());
  change->joiners_ = static_cast<int>(plan.jobRanks.size() - staying.size());
  change->leaving_ = static_cast<int>(requests.leaving.size());
  change->options_ = options_;
  change->jobStore_ = jobStore_;
  return change;
}

void Communicator::handOver(MembershipChange& change, Communicator& next) {
  std::scoped_lock lock(mu_, next.mu_, change.mu_);  // store() reads owned_
  next.owned_->previous = std::move(owned_);
  if (change.server_) next.owned_->server = std::move(change.server_);
}

Result<std::unique_ptr<Communicator>> Communicator::changeMembership(const MembershipRequests& requests,
                                                                    TimePoint deadline) {
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<MembershipChange> change, planMembershipChange(requests));
  // Every staying member builds the new communicator; all of them go over to it, or none does.
  Result<std::unique_ptr<Communicator>> next = change->build(deadline);
  std::int64_t built = next.isOk() ? 1 : 0;
  MERIDIAN_RETURN_IF_ERROR(allreduce(&built, &built, 1, DataType::kI64, ReduceOp::kMin));
  if (built == 0) {
    return next.isOk() ? againStatus("another member could not build the new communicator")
                       : next.status().withContext("changing the membership");
  }
  if (next.value() == nullptr) {
    MLOG_INFO(kCollectives, "left the job: membership epoch {} {{{}}} goes on without this rank", change->epoch_,
              fmt::join(change->jobRanks_, ","));
    return std::unique_ptr<Communicator>();
  }
  std::unique_ptr<Communicator> grown = std::move(next).value();
  handOver(*change, *grown);
  MLOG_INFO(kCollectives, "membership epoch {} {{{}}}: {} rank(s) joined, {} left", change->epoch_,
            fmt::join(change->jobRanks_, ","), change->joiners_, change->leaving_);
  return grown;
}

}  // namespace meridian::collectives
