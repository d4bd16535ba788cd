// Membership: how the ranks of a job agree on who is in it after ranks were lost or asked
// to join (issue 28). One agreed decision per change, also when the rank that coordinates
// the change is the one that died.
//
// A view is an epoch and its members (job-wide rank ids). Changing view e into view e + 1
// is one instance of single-decree Paxos among the members of view e:
//   1. a proposer (the lowest member it does not suspect) sends Prepare(e, ballot) to the
//      members (suspects too: one that is alive and already in a later view answers with it);
//   2. each member promises to ignore lower ballots for e and answers with the proposal it
//      already accepted for e, if any (Promise), or refuses (Nack: the ballot it promised);
//   3. with promises from a majority of view e, the proposer proposes: the accepted proposal
//      with the highest ballot among the promises if there is one (a value may have been
//      chosen already: it must stay chosen), otherwise its own, the members that promised,
//      minus the ranks it suspects, plus the ranks asking to join (Accept);
//   4. members accept unless they promised a higher ballot (Accepted);
//   5. with acceptances from a majority of view e the view is chosen: the proposer tells
//      every member of view e and of the new view (Commit), so the ranks left out learn it.
// Proposers wait for every member they do not suspect to answer, or for a majority and the
// phase deadline, so a rank that is merely slow is not left out at the first opportunity.
//
// Liveness: every rank orders the members it does not suspect; the k-th of them proposes
// once a change has been pending for k x takeover (the first at once), and a proposer whose
// phase ran out starts again with a higher ballot. A coordinator that died is suspected by
// the others' failure detectors, so the next rank is first in their order and proposes at
// once; if they disagree about who is lost, the stagger keeps two proposers from duelling.
//
// What is survived: any set of losses that leaves a majority of the current view alive
// and connected, the proposer's among them, one change at a time (two ranks lost at once are
// one change). What is not: losing half or more of a view at once. The minority side of a
// partition cannot decide (it keeps trying, and learns the majority's view when connected
// again); its ranks are then out, and rejoin as new ranks.
//
// Pure: no clock (times come in), no I/O (messages go out as values), no threads; the
// caller delivers messages and ticks. Messages from the wire are decoded with every length
// and rank bounded (decodeMessage).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace meridian::bootstrap::membership {

// Rank ids are below this (a job of more ranks is refused at set-up).
inline constexpr int kMaxRanks = 1 << 16;

struct View {
  std::uint64_t epoch = 0;
  std::vector<int> members;  // sorted, unique

  bool contains(int rank) const;
  // Acceptances or promises that decide for this view: a majority of its members.
  std::size_t quorum() const { return members.size() / 2 + 1; }
  std::string toString() const;  // "epoch 3 {0,1,4}"
  bool operator==(const View&) const = default;
};

struct Ballot {
  std::uint64_t round = 0;
  int proposer = -1;
  auto operator<=>(const Ballot&) const = default;
};

enum class MessageType : std::uint8_t { kPrepare = 1, kPromise, kNack, kAccept, kAccepted, kCommit };
const char* messageTypeName(MessageType type);

struct Message {
  MessageType type = MessageType::kPrepare;
  int from = -1;
  std::uint64_t epoch = 0;  // the epoch of the view being replaced (kCommit: of the new view - 1)
  Ballot ballot;            // kNack: the higher ballot the sender promised
  // kPromise: the proposal the sender accepted for this epoch, with its ballot, if any.
  std::optional<Ballot> acceptedBallot;
  // kPromise (with acceptedBallot): that proposal; kAccept, kCommit: the proposed or chosen view.
  View view;
  bool operator==(const Message&) const = default;
};

struct Outgoing {
  int to = -1;
  Message message;
};

// Bounds: members at most kMaxRanks, every rank in [0, kMaxRanks), members sorted and unique.
std::vector<std::uint8_t> encodeMessage(const Message& m);
Result<Message> decodeMessage(std::span<const std::uint8_t> bytes);
inline constexpr std::size_t kMessageHeaderBytes = 52;
// A message naming `ranks` members (a receive buffer for a job of that many ranks).
constexpr std::size_t messageBytes(std::size_t ranks) { return kMessageHeaderBytes + 4 * ranks; }
inline constexpr std::size_t kMaxMessageBytes = messageBytes(kMaxRanks);

class Agent {
 public:
  struct Options {
    Clock::duration phaseTimeout = std::chrono::milliseconds(500);  // a proposer's wait for answers
    Clock::duration takeover = std::chrono::milliseconds(1000);     // the stagger between candidates
  };

  // `initial` holds `self`, or is empty: a rank that asked to join and waits for the Commit
  // of a view with it (until then it takes part in nothing).
  Agent(int self, View initial, Options options);
  Agent(int self, View initial);

  // The failure detector declared `rank` lost: a change is pending until a view without it
  // is installed. Suspecting a rank outside the view, or itself, does nothing.
  void suspect(int rank);
  // `rank` (not a member) asks to join: a change is pending until a view with it is installed.
  void admit(int rank);

  std::vector<Outgoing> onMessage(const Message& m, TimePoint now);
  std::vector<Outgoing> onTick(TimePoint now);

  const View& view() const { return view_; }
  // A committed view without this rank: the others went on without it.
  bool evicted() const { return evicted_; }
  // Suspects or joiners are waiting for a new view.
  bool changePending() const;
  // Views installed since construction (each with its epoch), for logs and metrics.
  std::uint64_t changes() const { return changes_; }

 private:
  enum class Phase { kIdle, kPreparing, kAccepting };
  std::vector<Outgoing> startProposal(TimePoint now);
  std::vector<Outgoing> maybeAdvance(TimePoint now, bool deadlinePassed);
  void install(const View& next);
  std::vector<int> candidates() const;  // members not suspected, sorted
  Message make(MessageType type) const;

  int self_;
  Options options_;
  View view_;
  bool evicted_ = false;
  std::uint64_t changes_ = 0;
  std::set<int> suspects_;
  std::set<int> joiners_;
  std::optional<TimePoint> pendingSince_;
  // As an acceptor, for the change from view_.epoch.
  Ballot promised_;
  std::optional<Ballot> acceptedBallot_;
  View acceptedView_;
  std::uint64_t highestRound_ = 0;  // the highest round seen in any ballot
  // As a proposer.
  Phase phase_ = Phase::kIdle;
  Ballot ballot_;
  TimePoint phaseDeadline_{};
  std::set<int> promisedBy_;
  std::optional<Ballot> bestAcceptedBallot_;
  View bestAcceptedView_;
  View proposal_;
  std::set<int> acceptedBy_;
};

}  // namespace meridian::bootstrap::membership
