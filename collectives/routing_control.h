// RoutingControl: the communicator's control loop for routing ("mer-route" thread).
//  - Link state: every MERIDIAN_LINK_STATE_INTERVAL_MS each rank builds its row of the
//    link-state table (routing/link_state.h) from the path monitor's probe figures and its
//    channels' delivered rates, and sends it to every other rank (kLinkStateTag); each rank
//    keeps one receive posted per peer, so every rank holds the whole table.
//  - Re-planning (rank 0, adaptive routing): once the table is complete, and then at most
//    every MERIDIAN_REPLAN_INTERVAL_MS, it builds the planner's view, plans every size class
//    and proposes the new table to PlanSync when some class is predicted at least
//    kReplanGain faster than under the plan in force (so measurement noise never flips plans
//    back and forth). The interval holds back changes of mind, not learning: when the table
//    holds rates measured on paths that had none at the last check (the first plan of a job
//    is made on RTTs and priors), the next check comes one row period later. Each replan is
//    logged with its reason and counted by reason.
//  - Forced replans (rank 0): forceReplan(), or every MERIDIAN_CHAOS_REPLAN_MS, a random
//    valid plan table (routing::randomPlan), to prove any plan switch is safe.
// A peer whose control messages fail is left out from then on (its channel is broken; the
// collectives report that). stop() joins the thread; the object, which owns the buffers of
// posted receives, must outlive the transport device.
// Nothing thrown on the thread ends the process: the loop catches at its top, records the
// error (health()), stops routing, and fails PlanSync, so the communicator's next collective
// reports it and breaks the communicator (docs/errors.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/membership.h"
#include "collectives/plan_sync.h"
#include "routing/failure_detector.h"
#include "routing/link_state.h"
#include "routing/path_monitor.h"
#include "routing/regions.h"
#include "transport/channel.h"

namespace meridian::collectives {

inline constexpr double kReplanGain = 0.10;
// Relays: a 16 MiB transfer is the reference; a relay opens when two hops (on one plane) are
// predicted to take at most kRelayOpenRatio of the direct time (over every plane), closes
// when no third rank beats direct any more, and a pair's relay changes at most every
// kRelayHold. The margin is wide because the cost model sees links as independent while a
// relay's legs also carry the via rank's own traffic, often in the same round.
inline constexpr double kRelayReferenceBytes = 16.0 * 1024 * 1024;
inline constexpr double kRelayOpenRatio = 0.5;
inline constexpr auto kRelayHold = std::chrono::seconds(10);

struct RoutingControlOptions {
  std::chrono::milliseconds linkStateInterval{1000};
  // Failure detection (routing/failure_detector.h): a peer silent this long is declared lost.
  std::chrono::milliseconds peerTimeout{5000};
  std::chrono::milliseconds replanInterval{5000};
  std::chrono::milliseconds chaosInterval{0};  // 0: no forced replans
  bool adaptive = true;
  std::vector<std::string> regionNames;  // per rank; all non-empty: regions by name
  // Relay paths (adaptive routing, three ranks or more; empty: none). The lower rank of each
  // pair decides, from its copy of the table: it opens the relay slot of its channel to
  // `peer` through `via` on plane `plane`, and closes it again.
  std::function<Status(int peer, int via, int plane)> openRelay;
  std::function<Status(int peer)> closeRelay;
  // Rank 0's planner: the plan table for a network view (empty: routing::planAll). Tests
  // inject one that fails.
  std::function<routing::PlanTable(const routing::NetworkView&)> planner;
  // Membership: the epoch this communicator starts at (a successor's, docs/elastic.md), and
  // what to call on the control thread when a new view is agreed (`evicted`: without this
  // rank). It must not stop this object (hand the work to another thread).
  std::uint64_t startEpoch = 0;
  std::function<void(const bootstrap::membership::View& view, bool evicted)> onView;
  // Called once, on the control thread, when the ranks this one declared lost leave fewer
  // than a majority of the view reachable (its own side of a partition cannot agree on
  // anything): `reachable` counts this rank too.
  std::function<void(std::size_t reachable, const bootstrap::membership::View& view)> onCutOff;
  // Sets the process's membership gauges (meridian_membership_*): the job's communicator
  // does; one split from it (a subset of the ranks) does not.
  bool reportMembership = true;
};

class RoutingControl {
 public:
  // `monitor` may be null (no probing): rows then carry only rates. It must outlive stop().
  RoutingControl(int rank, int size, std::vector<transport::ChannelPtr> channels, routing::PathMonitor* monitor,
                 PlanSync* sync, RoutingControlOptions options);
  ~RoutingControl();
  RoutingControl(const RoutingControl&) = delete;
  RoutingControl& operator=(const RoutingControl&) = delete;

  void start();
  void stop();

  routing::LinkStateTable table() const;
  // Region of each rank (by name, else inferred from the table's RTTs; empty while unknown)
  // and the region names.
  routing::RegionAssignment regions() const;
  // Rank 0: proposes a random plan table from `seed` (invalidArgument on other ranks).
  Status forceReplan(std::uint64_t seed);
  // ok while the control loop runs; the error that stopped it otherwise.
  Status health() const;
  // The peers this rank declared lost (routing/failure_detector.h), in the order it did.
  std::vector<int> lostPeers() const;
  // The membership the survivors agreed on (bootstrap/membership.h): epoch 0 is the job as
  // it started; each loss that a majority of the previous view agreed on makes a new epoch.
  bootstrap::membership::View membership() const;
  // Stops failure detection and the agreement (the rest runs on): once a successor is being
  // built, what happens to this communicator's channels is no news.
  void quiesce() { quiesced_.store(true, std::memory_order_relaxed); }

 private:
  void loop();
  void runLoop();
  // Records why the loop ended and fails the plan sync with it (the thread's last act).
  void fail(const Status& why);
  void tick(TimePoint now);
  routing::LinkRow ownRow() const;
  routing::NetworkView currentView(routing::RegionAssignment* regions) const;
  void replan(TimePoint now);
  void updateRelays(TimePoint now);
  // The plane a relay to `peer` through `via` should use: the one whose two legs are not
  // congested and have the best measured rate (unmeasured counts as good).
  int relayPlane(const routing::LinkStateTable& table, int peer, int via, int planes) const;
  void postRowReceive(int peer);
  void detectFailures(TimePoint now);
  void noteChannelEnd(int peer, const Status& st);
  void runMembership(TimePoint now);
  void sendMembership(std::vector<bootstrap::membership::Outgoing> out);
  void postMembershipReceive(int peer);

  const int rank_;
  const int size_;
  const std::vector<transport::ChannelPtr> channels_;
  routing::PathMonitor* const monitor_;
  PlanSync* const sync_;
  const RoutingControlOptions options_;

  // The control thread's own state.
  struct PeerIo {
    std::vector<std::uint8_t> inbox;
    transport::RequestPtr recv;
    std::vector<std::uint8_t> outbox;
    transport::RequestPtr send;
    bool failed = false;
    // Membership messages: one receive posted, sends kept until done.
    std::vector<std::uint8_t> memberInbox;
    transport::RequestPtr memberRecv;
    std::vector<std::pair<std::vector<std::uint8_t>, transport::RequestPtr>> memberSends;
  };
  std::vector<PeerIo> io_;
  TimePoint nextRow_{};
  TimePoint nextReplanCheck_{};  // checks follow the rows' period
  TimePoint nextReplan_{};       // proposals at most every replanInterval
  std::size_t ratesAtLastCheck_ = 0;  // the table's measured rates when rank 0 last planned
  TimePoint nextChaos_{};
  std::uint64_t chaosSeed_ = 1;
  std::vector<TimePoint> nextRelayChange_;  // per peer
  // Failure detection: signs of life seen at the last check, per peer (bytes received on the
  // channel, probe echoes).
  routing::FailureDetector detector_;
  TimePoint nextFailureCheck_{};
  std::vector<std::uint64_t> receivedBefore_;
  std::vector<std::uint64_t> echoesBefore_;
  bootstrap::membership::Agent agent_;
  std::uint64_t agentChanges_ = 0;
  std::atomic<bool> quiesced_{false};
  bool cutOffSaid_ = false;

  mutable std::mutex mu_;
  routing::LinkStateTable table_;
  // What ends the loop's wait before its next tick: a stop, or news for the membership
  // agreement (a message, or a channel that ended), so each of its rounds costs a message's
  // trip and not a tick. Shared with the callbacks of pending receives, which may run after
  // this object is gone.
  struct Wake {
    std::mutex mu;
    std::condition_variable cv;
    bool stopping = false;  // guarded by mu
    bool news = false;      // guarded by mu
    void ring();
  };
  std::shared_ptr<Wake> wake_ = std::make_shared<Wake>();
  Status failure_;  // why the loop ended early; guarded by mu_
  std::vector<int> lost_;  // guarded by mu_
  bootstrap::membership::View view_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace meridian::collectives
