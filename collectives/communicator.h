// Communicator: a group of ranks connected in a full mesh of transport channels, and the
// collectives over it (allreduce, reduce-scatter, allgather, broadcast, reduce, barrier,
// send/recv), each synchronous and asynchronous.
//
// Ownership and threads: one Communicator per rank, owned by the caller. It owns its
// TcpDevice (one progress thread), the channels, its scratch memory and one worker
// thread ("mer-coll"). Ops run strictly in issue order, one at a time: an async call
// queues the op for the worker and returns a Work; a sync call runs the op inline on the
// caller's thread when nothing is queued or running, else queues it and waits. Any thread
// may issue ops, but every rank must issue the same collectives in the same order (as
// with NCCL/MPI). Counts are in elements; buffers must stay valid and untouched until the
// op finished (Work::wait returned something other than kTimeout).
//
// Errors: an op returns the transport's Status (path errors are retried inside the
// transport). Any failure after an op started talking to peers (peer error, timeout,
// ranks disagreeing about an op) marks the communicator broken: later ops fail at once
// with kCommError carrying the original reason, and the communicator stops its transport
// (pending requests fail, peers see the failure, no buffer is touched after the failed op
// returned): at once, or, when elastic, once the survivors built the successor (below). Argument errors (kInvalidArgument) are found before anything is
// sent and leave the communicator usable (a collective rejected on some ranks only still
// fails on the others, by timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "collectives/host_arena.h"
#include "collectives/plan_sync.h"
#include "collectives/routing_control.h"
#include "bootstrap/membership.h"
#include "bootstrap/store.h"
#include "collectives/work.h"
#include "core/clock.h"
#include "core/status.h"
#include "kernels/types.h"
#include "routing/path_monitor.h"
#include "transport/channel.h"
#include "transport/device.h"

namespace meridian::collectives {

struct CommOptions {
  // Local IPv4 addresses, one per network path. Empty: MERIDIAN_PATHS, else 127.0.0.1
  // (createFromEnvironment: else the address that reaches the store).
  std::vector<std::string> localAddresses;
  int streamsPerPath = 0;                   // 0: MERIDIAN_TCP_STREAMS
  std::chrono::milliseconds timeout{0};     // set-up and per-op deadline; 0: MERIDIAN_TIMEOUT_MS
  std::size_t smallMessageBytes = 0;        // <= this: latency algorithms; 0: MERIDIAN_SMALL_ALLREDUCE_BYTES
  std::size_t ringSegmentBytes = 0;         // ring/chain pipelining segment; 0: MERIDIAN_RING_SEGMENT_BYTES
  std::string secret;                       // empty: the job secret (MERIDIAN_SECRET / _FILE)
  // Store keys of this communicator live under this prefix; communicators created in the
  // same order on every rank may share a store and a prefix.
  std::string storePrefix = "meridian/comm";
  // Routing: "adaptive" or "static" (empty: MERIDIAN_ROUTING). Static stripes evenly over
  // the live paths whatever their rates and congestion; adaptive follows measured rates and
  // congestion. Probing runs in both (the figures are wanted either way) unless probe=false.
  std::string routing;
  bool probe = true;
  std::chrono::milliseconds probeInterval{0};  // 0: MERIDIAN_PROBE_INTERVAL_MS
  std::string algo;                            // allreduce algorithm; empty: MERIDIAN_ALGO
  std::string shm;                             // "auto" or "off"; empty: MERIDIAN_SHM
  std::string region;                          // empty: MERIDIAN_REGION (may stay empty)
  std::string elastic;                         // "on" or "off"; empty: MERIDIAN_ELASTIC
  // Plan checkpoints at most this many collectives apart (0: 1024); 1 makes every
  // collective a checkpoint (tests of plan switching).
  std::size_t planCheckpointOps = 0;
  std::chrono::milliseconds chaosReplan{-1};  // < 0: MERIDIAN_CHAOS_REPLAN_MS; 0: off
  // Tells this communicator's metrics (device and prober labels, thread names) apart from
  // other communicators of the same process: "<name><rank>"; empty: "<rank>". At most 6
  // characters (thread names are short).
  std::string name;
};

// Ranks grouped by region name in rank order (regions by first appearance); none when a
// name is missing, there is one region, or the regions differ in size.
std::optional<Hierarchy> hierarchyFromRegions(const std::vector<std::string>& names);

class Communicator {
 public:
  using DataType = kernels::DataType;
  using ReduceOp = kernels::ReduceOp;
  using WorkPtr = std::shared_ptr<Work>;

  // Connects `worldSize` ranks through `store`. Blocks until every channel is up or the
  // timeout passed. Without MERIDIAN_ELASTIC=on the store is used only during create; an
  // elastic communicator also asks it later whether ranks wait to join (membershipRequests), so
  // it must outlive the communicator and its successors. A malformed knob (or option standing for
  // one) is kInvalidArgument naming it; never throws.
  static Result<std::unique_ptr<Communicator>> create(bootstrap::Store& store, int rank, int worldSize,
                                                      const CommOptions& options = {});
  // Rank, world size and store from the environment (detectLaunch + rendezvous); the
  // store (and on rank 0 its server) live as long as the communicator.
  static Result<std::unique_ptr<Communicator>> createFromEnvironment(const CommOptions& options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  // Labels this process's metrics with this communicator's view: every series gets `rank`
  // and `region` (this rank's), this communicator's series of a peer get `peer_region`,
  // those of a path `plane` (MERIDIAN_PLANES). For the job's world communicator;
  // executables call it once.
  void labelMetrics() const;
  // Only the peer and path labels, for a communicator over a subset of the job's ranks:
  // memberRegions[r] is the region of this communicator's rank r.
  void labelPeerMetrics(const std::vector<std::string>& memberRegions) const;
  // The rendezvous store a createFromEnvironment communicator keeps (more communicators
  // of the same job can be created through it); null for one made with create().
  bootstrap::Store* store() const;
  int size() const { return size_; }
  std::uint64_t sessionId() const { return sessionId_; }
  // ok while usable; the reason once broken.
  Status health() const;
  // Routing's view: every path to every peer (figures, congestion state, weight); empty
  // without probing or after the communicator broke.
  std::vector<routing::PathView> paths() const;
  // Each rank's region as its MERIDIAN_REGION names it ("" where unnamed).
  const std::vector<std::string>& regionNames() const { return regionNames_; }
  bool adaptiveRouting() const { return adaptive_; }
  // Every pair of ranks reads each other's memory directly (they share one host; see
  // docs/transport.md): allreduces above the small-message threshold then take the direct
  // exchange when MERIDIAN_ALGO=auto and there are at most 8 ranks.
  bool allRanksOnOneHost() const { return allSameHost_; }
  // Allreduce and barrier run through shared memory (every rank on this host, MERIDIAN_SHM=auto).
  bool sharedMemory() const { return shm_ != nullptr; }
  // MERIDIAN_ALGO as resolved: "auto" follows the plan in force, anything else pins it.
  const std::string& allreduceAlgorithm() const { return algo_; }
  // The region groups large allreduces run hierarchically over (none: flat).
  const std::optional<Hierarchy>& hierarchy() const { return hierarchy_; }
  // The collective plan in force (epoch 0 and no table: the built-in choice, before the
  // first plan or with static routing).
  PlanInForce plan() const;
  // The peers this rank's failure detector declared lost (MERIDIAN_PEER_TIMEOUT_MS of
  // silence, or a failed channel), in the order it did; empty for one rank.
  std::vector<int> lostPeers() const;
  // The membership the survivors agreed on after losses (docs/elastic.md): epoch 0 and every
  // rank until a loss was agreed. The communicator does not shrink to it yet.
  bootstrap::membership::View membership() const;

  // Elastic communicators (MERIDIAN_ELASTIC=on; docs/elastic.md). Once the survivors of a
  // lost rank agree on a membership without it, every survivor (in an op or not) builds the
  // successor over them: its ranks are the members in order, its set-up goes through a store
  // the first member hosts, and it starts at the agreed epoch. Then this communicator stops:
  // the op in flight, and every op after it, fails with kCommError "aborted: membership epoch
  // N ...", and no buffer is touched after that (an output of the aborted op holds
  // unspecified bytes; some survivors may have finished that op before others aborted it).
  // The caller takes the successor and goes on with it.
  bool elastic() const { return elastic_; }
  // Each rank's rank in the job as it started (identity for one made by create()).
  const std::vector<int>& jobRanks() const { return jobRanks_; }
  // Waits until `deadline` for the successor and hands it over (once). An error says why
  // there is none: not elastic, this rank was left out, or the communicator broke for
  // another reason or while building it; kTimeout while it is still healthy.
  Result<std::unique_ptr<Communicator>> successor(TimePoint deadline);

  // Grow (docs/elastic.md). A process that wants in (started later with the job's secret, or
  // a rank the others went on without) calls join() with the job's store, the one rank 0 of
  // the job hosts (MERIDIAN_STORE); `jobRank` >= 0 asks for that job rank back (granted when
  // no member holds it). It returns once the members admitted it: a communicator of the
  // members and the joiners, in which it has the last ranks.
  static Result<std::unique_ptr<Communicator>> join(const std::string& storeAddress, int jobRank,
                                                    const CommOptions& options, TimePoint deadline);
  // What the members ask of the membership at a step boundary: processes waiting in the
  // job store to join, and members that asked to leave (drain: they finish the step, hand
  // over and go, and nobody sees an error).
  struct MembershipRequests {
    int joiners = 0;
    std::vector<int> leaving;  // ranks of this communicator, ascending
    // With a change under way (planMembershipChange): every member has built its new
    // communicator; some member could not.
    bool builtEverywhere = false;
    bool buildFailed = false;
    bool any() const { return joiners > 0 || !leaving.empty(); }
  };
  // Where this rank's build of a planned change stands (membershipRequests passes it on).
  enum class BuildState : std::uint8_t { kNone, kBuilding, kBuilt, kFailed };
  // Collective over the members: every member says whether it asks to leave (and where its
  // build of a planned change stands), rank 0 how many processes wait to join (0 when this
  // communicator has no job store).
  Result<MembershipRequests> membershipRequests(bool leave, BuildState build = BuildState::kNone);
  // A membership change the members agreed on whose new communicator is still to be built:
  // by build(), on any thread, while this communicator goes on (the trainer admits joiners
  // so, without stopping). Every staying member and every joiner must build it; the members
  // take it over together (handOver) or drop it.
  class MembershipChange {
   public:
    ~MembershipChange();
    MembershipChange(const MembershipChange&) = delete;
    MembershipChange& operator=(const MembershipChange&) = delete;
    // This rank's communicator of the new membership, up once every member and joiner built
    // theirs (or `deadline`, or cancel()); null on a rank that leaves. Once.
    Result<std::unique_ptr<Communicator>> build(TimePoint deadline);
    // Makes every build() of this change fail soon: on the rank hosting the set-up store
    // (this communicator's rank 0) the store stops, and the builds waiting on it fail. Any
    // thread, also while build() runs; nothing on the other ranks (theirs fail by it).
    void cancel();
    int joiners() const { return joiners_; }
    std::uint64_t epoch() const { return epoch_; }

   private:
    friend class Communicator;
    MembershipChange() = default;
    std::mutex mu_;
    std::unique_ptr<bootstrap::StoreServer> server_;  // rank 0: the set-up store; guarded by mu_
    std::string store_;                               // its address
    std::uint64_t epoch_ = 0;
    std::vector<int> jobRanks_;  // of the new membership
    int rank_ = -1;              // this rank's in it; -1: leaving
    int joiners_ = 0;
    int leaving_ = 0;
    CommOptions options_;
    bootstrap::Store* jobStore_ = nullptr;
  };
  // The first half of changeMembership (collective over the members, the leaving ones too,
  // after membershipRequests() asked for something): rank 0 decides who is in and hosts the
  // set-up store; every member learns the plan. kAgain when there is nothing to change
  // (the joiners went away, or rank 0 could not).
  Result<std::unique_ptr<MembershipChange>> planMembershipChange(const MembershipRequests& requests);
  // On switching to `next`, built by `change` (planned over this communicator): `next` keeps
  // what this one kept alive for the job (the job's store and its host, the set-up store).
  // Call before retiring this one.
  void handOver(MembershipChange& change, Communicator& next);
  // Collective over the members (the leaving ones too), after membershipRequests() asked for
  // something, with the requests it returned: the members that stay keep their order,
  // joiners follow in the order they asked, at the next membership epoch. A staying member
  // gets the new communicator; a leaving one gets null (it may go once this returned: the
  // others are over on the new one). This communicator stays as it was: when the new one
  // could not be built on every member by `deadline`, the members go on with it (the error
  // says why); otherwise the caller retires it. kInvalidArgument when every member asks to
  // leave (there is nobody to hand over to).
  Result<std::unique_ptr<Communicator>> changeMembership(const MembershipRequests& requests, TimePoint deadline);
  // A communicator over the ranks of this one that pass the same `color`, in this one's rank
  // order (every rank of this one calls it, with no op in flight; every rank gets one, maybe
  // of one rank). Its set-up goes through a store its first rank hosts; `name` labels its
  // metrics and threads (CommOptions::name). It is never elastic itself: when this
  // communicator's membership changes, or this one is retired, the child stops (its op in
  // flight and every later one fail) and the caller splits the successor anew. Destroy the
  // children before their parent.
  Result<std::unique_ptr<Communicator>> split(int color, const std::string& name);
  // The caller went over to a successor (after changeMembership, or one the survivors built) and
  // has no op in flight here: this communicator stops (its peers see it leave, not fail),
  // and later ops fail saying so. Idempotent.
  void retire();
  // This rank gives up on the communicator (it stops with an error of its own): every
  // channel fails at once, so the others declare it lost and go on without it, rather than
  // take its closing for a rank that left on purpose (which changes no membership). Any
  // thread, once; then destroy it.
  void abandon(const Status& why);
  // Every rank's latest row of the link-state table (empty rows without routing).
  routing::LinkStateTable linkState() const;
  // Regions as routing sees them (named, or inferred from RTTs).
  routing::RegionAssignment regions() const;
  // Rank 0: publish a random valid plan (routing::randomPlan) at the next checkpoint.
  Status forceReplan(std::uint64_t seed);
  // Rank 0: publish `table` (every plan must fit this communicator) at the next checkpoint;
  // with adaptive routing the planner replaces it once it predicts a better one.
  Status proposePlan(routing::PlanTable table, std::string reason);
  // The paths of the channel to `peer` with their counters and weights (empty for this
  // rank, a bad rank, or once the communicator broke).
  std::vector<transport::PathStats> peerPathStats(int peer) const;

  // recv[i] = op over ranks of send[i]; send == recv is in place.
  Status allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  WorkPtr allreduceAsync(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  // send holds recvCount * size() elements; rank r receives block r reduced. In place:
  // recv == send + rank * recvCount elements.
  Status reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType dtype, ReduceOp op);
  WorkPtr reduceScatterAsync(const void* send, void* recv, std::size_t recvCount, DataType dtype, ReduceOp op);
  // recv holds sendCount * size() elements, rank r's at block r. In place: send == recv +
  // rank * sendCount elements.
  Status allgather(const void* send, void* recv, std::size_t sendCount, DataType dtype);
  WorkPtr allgatherAsync(const void* send, void* recv, std::size_t sendCount, DataType dtype);
  // Root's send is copied into every rank's recv (send is read on root only).
  Status broadcast(const void* send, void* recv, std::size_t count, DataType dtype, int root);
  WorkPtr broadcastAsync(const void* send, void* recv, std::size_t count, DataType dtype, int root);
  // The reduction lands in root's recv; other ranks' recv is not used (may be null).
  Status reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root);
  WorkPtr reduceAsync(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op, int root);
  Status barrier();
  WorkPtr barrierAsync();
  // Point to point; messages between two ranks with the same tag match in order. Not
  // collectives: they do not advance the collective sequence. An async send/recv is
  // posted in issue order and completes when the transport finishes it, without holding
  // up later ops. tag < 2^32.
  Status send(const void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag = 0);
  WorkPtr sendAsync(const void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag = 0);
  Status recv(void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag = 0);
  WorkPtr recvAsync(void* buf, std::size_t count, DataType dtype, int peer, std::uint32_t tag = 0);

  // Figures the algorithm choice uses (after knob resolution).
  std::size_t smallMessageBytes() const { return smallBytes_; }
  std::size_t ringSegmentBytes() const { return segmentBytes_; }

  enum class OpKind : std::uint8_t {
    kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kBarrier, kSend, kRecv, kCount
  };

 private:
  using Body = std::function<Status(const AlgoContext&, Work&)>;
  struct Op {
    OpKind kind = OpKind::kBarrier;
    DataType dtype = DataType::kF32;
    std::size_t bytes = 0;              // payload per rank, for metrics
    std::uint64_t collSeq = 0;          // tag space of collectives
    Body body;
    std::shared_ptr<Work> work;
  };
  struct Metrics;
  struct Owned;  // store / server kept alive for createFromEnvironment and successors
  // Where a successor comes from: the epoch of its view, and the job rank of each member.
  struct Lineage {
    std::uint64_t epoch = 0;
    std::vector<int> jobRanks;  // empty: identity
    bool split = false;         // made by split(): a subset of its parent's ranks
  };
  static Result<std::unique_ptr<Communicator>> build(bootstrap::Store& store, int rank, int worldSize,
                                                     const CommOptions& options, Lineage lineage);
  // A successor, grown or joined communicator, set up through the store its first member
  // hosts at `address` (unless `owned` holds a store already), within `deadline`. It keeps
  // `owned`, gets the store client added to it, and asks `jobStore` for joiners.
  static Result<std::unique_ptr<Communicator>> buildThrough(std::unique_ptr<Owned> owned, const std::string& address,
                                                            int rank, int worldSize, const CommOptions& options,
                                                            Lineage lineage, TimePoint deadline,
                                                            bootstrap::Store* jobStore);
  // Hosts such a set-up store on this rank's first path (the server goes into `owned`);
  // returns its address.
  Result<std::string> hostSetUpStore(Owned& owned) const;
  // The address of a set-up store, from `host` (who hosts it: `*address` holds it there) to
  // every other rank of `members` over this communicator's channels (they proved the job
  // secret) with `tag`; bounded and checked on receipt.
  Status shareSetUpAddress(int host, const std::vector<int>& members, std::uint64_t tag, std::string* address,
                           TimePoint deadline);
  // The children split() made stop: `why` says so to their callers. `planned`: a hand-over
  // the caller asked for (retire), logged quietly rather than warned about.
  void stopChildren(const Status& why, bool planned = false);

  Communicator(int rank, int worldSize, const CommOptions& resolved);

  // Assigns sequence numbers and queues the op (async), or runs it inline / queues it and
  // waits (sync). A non-ok `invalid` fails the op at once without sending anything.
  WorkPtr submit(OpKind kind, DataType dtype, std::size_t bytes, Body body, Status invalid);
  Status runSync(OpKind kind, DataType dtype, std::size_t bytes, Body body, Status invalid);
  void execute(Op& op);
  void workerLoop();
  // Records why the communicator broke (the first reason, unless `replace`). `planned`: the
  // caller's own hand-over (retire), logged at INFO; a failure is warned about.
  void markBroken(const Status& reason, bool replace = false, bool planned = false);
  // After a failed op: stops the transport (no request touches a buffer any more, and the
  // peers see the failure at once) and completes every request still pending with `why`.
  // `abandon`: the channels fail first, so closing does not wait for peers to acknowledge
  // what they were sent (a broken communicator owes them nothing, and one cut off from
  // them would wait seconds). Op thread (or the destructor, which delivers first).
  void abortTransport(const Status& why, bool abandon = false);
  // The first half of that, from any thread, once.
  void stopTransport();
  // retire() and abandon(): stops this communicator and its children as this rank chose
  // (`why`, `childrenWhy`, logged quietly); the channels fail with `failChannels` first
  // unless it is OK (then the peers see this rank leave).
  void stopOnPurpose(const Status& why, const Status& childrenWhy, const Status& failChannels);
  // Fails the channels to `peers` at once (lost ranks: closing must not wait on them), with
  // `why`, or "rank p is lost" when it is OK.
  void abandonPeers(const std::vector<int>& peers, const Status& why = Status::ok());
  std::vector<int> everyRank() const;  // 0 .. size-1
  // Elastic: the control thread agreed on `view` (this rank in it unless `evicted`).
  void onView(const bootstrap::membership::View& view, bool evicted);
  // Runs `work` on the recovery thread, once per communicator (false: one ran already, or
  // the communicator is closing); `work` returns the successor or why there is none.
  bool startRecovery(std::function<Result<std::unique_ptr<Communicator>>()> work);
  // Elastic: this rank reaches fewer than a majority (control thread). It stops: its ops fail,
  // and successor() says it was cut off (the caller may join again).
  void onCutOff(std::size_t reachable, const bootstrap::membership::View& view);
  // The recovery thread: builds the successor over `view`, then stops this communicator.
  Result<std::unique_ptr<Communicator>> recover(const bootstrap::membership::View& view, bool evicted);
  Result<std::unique_ptr<Communicator>> buildSuccessor(const bootstrap::membership::View& view, TimePoint deadline);
  // The op thread after a failure, when elastic: waits for the recovery to end (or, with no
  // membership change in sight, a bounded time).
  void awaitRecovery();
  Status brokenStatus() const;
  Status brokenStatusLocked() const;  // mu_ held
  // Starts the path monitor (probes, congestion, weights) and learns every rank's region.
  // Opens the channel to every peer (set-up, after the endpoints are gathered).
  Status openMesh(TimePoint deadline);
  static constexpr std::size_t kMaxConcurrentOpens = 8;
  Status startRouting(bootstrap::Store& store, const std::string& base, const CommOptions& opts, TimePoint deadline);

  static std::size_t bytesOf(std::size_t count, DataType dtype) { return count * kernels::dataTypeSize(dtype); }
  Status checkPeer(int peer) const;
  Status rootArgs(int root, const char* what) const;
  Status reduceScatterArgs(const void* send, const void* recv, std::size_t recvCount, DataType dtype,
                           ReduceOp op) const;
  Status allgatherArgs(const void* send, const void* recv, std::size_t sendCount, DataType dtype) const;
  Status broadcastArgs(const void* send, const void* recv, std::size_t count, DataType dtype, int root) const;
  Status reduceArgs(const void* send, const void* recv, std::size_t count, DataType dtype, ReduceOp op,
                    int root) const;
  Status p2pArgs(const void* buf, std::size_t count, DataType dtype, int peer) const;
  Body barrierBody();
  Body allreduceBody(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  Body reduceScatterBody(const void* send, void* recv, std::size_t recvCount, ReduceOp op);
  Body broadcastBody(const void* send, void* recv, std::size_t count, int root);
  Body reduceBody(const void* send, void* recv, std::size_t count, ReduceOp op, int root);
  Body p2pBody(bool isSend, void* buf, std::size_t bytes, int peer, std::uint32_t tag, bool sync);

  const int rank_;
  const int size_;
  CommOptions options_;  // as resolved by create(), for a successor
  bool elastic_ = false;
  bool split_ = false;  // made by split()
  std::vector<int> jobRanks_;
  std::uint64_t epoch_ = 0;
  // The job's store (join requests), whoever owns it: this communicator's creator, or the
  // Owned chain a successor inherits. Null without one.
  bootstrap::Store* jobStore_ = nullptr;
  std::chrono::milliseconds peerTimeout_{5000};
  std::string metricsName_;  // device and prober label: CommOptions::name + rank
  std::uint64_t sessionId_ = 0;
  std::chrono::milliseconds timeout_;
  std::size_t smallBytes_;
  std::size_t segmentBytes_;

  std::unique_ptr<Owned> owned_;
  ScratchArena scratch_;  // declared before the device: freed after every channel closed
  // Also before the device: they own the buffers of posted control receives.
  std::unique_ptr<PlanSync> planSync_;
  std::unique_ptr<RoutingControl> control_;
  double meanOpSec_ = 0;  // recent collective durations (op thread), spaces plan checkpoints
  std::unique_ptr<transport::Device> device_;
  std::vector<transport::ChannelPtr> channels_;  // [rank]; [rank_] is null; cleared on abort
  std::vector<transport::EndpointName> peerEndpoints_;  // [rank]: its device's endpoint()
  bool relay_ = false;  // channels have relay slots (adaptive routing, MERIDIAN_RELAY=auto)
  // After the channels: it hands them weights from its own thread, so it goes first.
  std::unique_ptr<routing::PathMonitor> monitor_;
  std::vector<std::string> regionNames_;
  bool adaptive_ = true;
  std::string algo_ = "auto";             // MERIDIAN_ALGO as given
  enum class AlgoChoice : std::uint8_t { kAuto, kRing, kRecursiveDoubling, kHierarchical, kDirect };
  AlgoChoice algoChoice_ = AlgoChoice::kAuto;  // algo_, parsed once
  // Every pair of ranks reads each other directly (one host): auto then runs allreduces
  // above the small-message threshold as a direct exchange, when there are few ranks.
  bool allSameHost_ = false;
  // Every rank shares this host and maps every rank's segment (MERIDIAN_SHM=auto): allreduce
  // and barrier under MERIDIAN_ALGO=auto run through it.
  std::unique_ptr<HostArena> shm_;
  std::optional<Hierarchy> hierarchy_;    // ranks grouped by region, when the regions allow
  // Touched only by the thread executing an op (or the destructor after the worker quit).
  RequestTracker opRequests_;                    // the current op's requests
  std::vector<transport::RequestPtr> deferred_;  // async send/recv requests still pending
  std::unique_ptr<Metrics> metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool running_ = false;          // an op is executing (worker or inline)
  bool stopping_ = false;
  std::uint64_t nextWorkSeq_ = 0;  // every op
  std::uint64_t nextCollSeq_ = 0;  // collectives only (same on every rank)
  Status broken_;                  // sticky, guarded by mu_
  std::thread worker_;
  // Elastic recovery, guarded by mu_ (cv_ announces its end).
  enum class Recovery : std::uint8_t { kNone, kRunning, kDone, kFailed };
  Recovery recovery_ = Recovery::kNone;
  std::unique_ptr<Communicator> successor_;  // null once taken
  Status recoveryError_;
  std::thread recoveryThread_;
  // split(): the children of this one, and the parent of this one (guarded by the parent's
  // mu_; a child deregisters itself when destroyed).
  std::vector<Communicator*> children_;
  Communicator* parent_ = nullptr;
  std::mutex transportMu_;  // stopTransport() runs once
  bool transportStopped_ = false;
};

// busbw = algbw * factor (nccl-tests): 2(n-1)/n allreduce, (n-1)/n reduce-scatter and
// allgather (whose size is the whole buffer), 1 for the rest.
double busBandwidthFactor(Communicator::OpKind op, int ranks);

}  // namespace meridian::collectives
