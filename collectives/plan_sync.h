// PlanSync: every rank switches to a new collective plan at the same collective, so that no
// op ever runs with two plans (a ring on one rank and a tree on another would exchange the
// wrong messages and hang).
//
// Protocol. Plans change only at checkpoints C0 = 0, C1 = 1, C2, ... (collective sequence
// numbers, the same on every rank). At checkpoint Ci rank 0 sends every rank an announcement
// A_i: the plan table in force from C(i+1) on and the sequence number of C(i+2). At Ci every
// other rank waits for A_(i-1) (sent one checkpoint earlier, so normally long arrived),
// switches to the table it names, learns C(i+1), and posts its receive for A_i. Rank 0 spaces
// the checkpoints about kCheckpointSpacing apart from the collectives' recent durations
// (between 1 and maxCheckpointOps collectives), so announcements cost a few tiny messages a
// second whatever the op rate. A plan proposed at time t is in force on every rank one to two
// checkpoints later.
//
// Announcements travel on the channels with the control tag kPlanTag, outside every
// collective's tag space, and are checked (routing/plan_codec.h) before use; a bad one
// fails the collective with a peer error, like any protocol violation.
//
// Threads: atCollective runs on the thread executing ops (strictly in sequence order);
// propose, inForce and fail may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "routing/plan_codec.h"
#include "transport/channel.h"

namespace meridian::collectives {

// Control messages live above every collective tag (collective tags stay below 2^62) and
// below the point-to-point tags (bit 63), on the transport's background tags.
inline constexpr std::uint64_t kControlTagBit = transport::kBackgroundTagBit;
inline constexpr std::uint64_t kPlanTag = kControlTagBit | 1;
inline constexpr std::uint64_t kLinkStateTag = kControlTagBit | 2;
inline constexpr std::uint64_t kMembershipTag = kControlTagBit | 3;
// The rendezvous of a successor communicator (docs/elastic.md): its first member sends the
// others the address of the store it hosts for the set-up.
inline constexpr std::uint64_t kSuccessorTag = kControlTagBit | 4;
// The same for a communicator split() makes (its first rank sends the others the address).
inline constexpr std::uint64_t kSplitTag = kControlTagBit | 5;

inline constexpr std::chrono::milliseconds kCheckpointSpacing{200};

struct PlanInForce {
  std::uint64_t epoch = 0;                             // 0: the built-in choice
  std::shared_ptr<const routing::PlanTable> table;    // null at epoch 0
  std::string reason;
  std::uint64_t sinceSeq = 0;  // the collective it took effect at
};

class PlanSync {
 public:
  // `channels` indexed by rank ([rank] null) must outlive this object's use.
  PlanSync(int rank, int size, std::vector<transport::ChannelPtr> channels, std::size_t maxCheckpointOps);
  ~PlanSync();
  PlanSync(const PlanSync&) = delete;
  PlanSync& operator=(const PlanSync&) = delete;

  // Rank 0: the table to announce at the next checkpoint; it gets the next epoch.
  void propose(std::shared_ptr<const routing::PlanTable> table, std::string reason);
  // The latest proposal on rank 0 (may not be in force yet); null before the first.
  std::shared_ptr<const routing::PlanTable> latestProposal() const;

  // Called before collective `seq` runs, in sequence order, with the recent mean duration
  // of collectives (rank 0 spaces checkpoints by it). Returns the table in force for this
  // collective (null: the built-in choice). Waits for a late announcement until `deadline`.
  Result<std::shared_ptr<const routing::PlanTable>> atCollective(std::uint64_t seq, TimePoint deadline,
                                                                 double meanOpSec);
  PlanInForce inForce() const;
  // Routing failed for good (its thread stopped on `why`): every later atCollective
  // returns `why`, which breaks the communicator. Any thread; the first failure stays.
  void fail(Status why);

 private:
  void adopt(std::uint64_t epoch, std::shared_ptr<const routing::PlanTable> table, std::string reason,
             std::uint64_t seq);
  Status announce(std::uint64_t seq, double meanOpSec);  // rank 0
  Status receive(std::uint64_t seq, TimePoint deadline);  // the others

  const int rank_;
  const int size_;
  const std::vector<transport::ChannelPtr> channels_;
  const std::size_t maxCheckpointOps_;

  // Touched by the op thread only.
  std::uint64_t nextCheckpoint_ = 0;  // Ci
  std::uint64_t afterNext_ = 1;       // C(i+1) (rank 0; the others learn it from announcements)
  bool firstCheckpoint_ = true;
  // Rank 0: what A_(i-1) announced for Ci, and the epoch last sent with its table.
  std::uint64_t announcedEpoch_ = 0;
  std::shared_ptr<const routing::PlanTable> announcedTable_;
  std::string announcedReason_;
  std::uint64_t tableSentEpoch_ = 0;
  struct Outgoing {
    std::vector<std::uint8_t> bytes;
    std::vector<transport::RequestPtr> sends;
  };
  std::vector<std::unique_ptr<Outgoing>> outgoing_;
  std::shared_ptr<const routing::PlanTable> opTable_;  // the table in force, for the op thread
  // The others: the posted receive of the next announcement.
  std::vector<std::uint8_t> inbox_;
  transport::RequestPtr pending_;

  std::atomic<bool> failed_{false};  // set once failure_ holds the error
  mutable std::mutex mu_;
  Status failure_;
  PlanInForce inForce_;
  std::uint64_t proposedEpoch_ = 0;
  std::shared_ptr<const routing::PlanTable> proposed_;
  std::string proposedReason_;
};

}  // namespace meridian::collectives
