#include "bootstrap/membership.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/check.h"
#include "core/wire.h"

namespace meridian::bootstrap::membership {

bool View::contains(int rank) const { return std::binary_search(members.begin(), members.end(), rank); }

std::string View::toString() const { return fmt::format("epoch {} {{{}}}", epoch, fmt::join(members, ",")); }

const char* messageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kPrepare: return "prepare";
    case MessageType::kPromise: return "promise";
    case MessageType::kNack: return "nack";
    case MessageType::kAccept: return "accept";
    case MessageType::kAccepted: return "accepted";
    case MessageType::kCommit: return "commit";
  }
  return "unknown";
}

// ---- Wire ---------------------------------------------------------------------------
//
// u8 type | u8 flags (bit 0: acceptedBallot present) | u16 reserved = 0 | i32 from |
// u64 epoch | u64 ballot round | i32 ballot proposer | u64 accepted round |
// i32 accepted proposer | u64 view epoch | u32 member count | count x u32 member

namespace {


class Writer {
 public:
  template <typename T>
  void put(T v) {
    std::uint8_t b[sizeof(T)];
    wire::store(b, v);
    out.insert(out.end(), b, b + sizeof(T));
  }
  std::vector<std::uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> b) : bytes(b) {}
  template <typename T>
  T get() {
    const T v = wire::load<T>(bytes.data() + at);
    at += sizeof(T);
    return v;
  }
  std::span<const std::uint8_t> bytes;
  std::size_t at = 0;
};

bool rankInRange(std::int64_t r) { return r >= 0 && r < kMaxRanks; }

}  // namespace

std::vector<std::uint8_t> encodeMessage(const Message& m) {
  Writer w;
  w.put(static_cast<std::uint8_t>(m.type));
  w.put(static_cast<std::uint8_t>(m.acceptedBallot ? 1 : 0));
  w.put(std::uint16_t{0});
  w.put(static_cast<std::int32_t>(m.from));
  w.put(m.epoch);
  w.put(m.ballot.round);
  w.put(static_cast<std::int32_t>(m.ballot.proposer));
  w.put(m.acceptedBallot ? m.acceptedBallot->round : std::uint64_t{0});
  w.put(static_cast<std::int32_t>(m.acceptedBallot ? m.acceptedBallot->proposer : -1));
  w.put(m.view.epoch);
  w.put(static_cast<std::uint32_t>(m.view.members.size()));
  for (int r : m.view.members) w.put(static_cast<std::uint32_t>(r));
  return std::move(w.out);
}

Result<Message> decodeMessage(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kMessageHeaderBytes || bytes.size() > kMaxMessageBytes) {
    return invalidArgument("membership message of {} bytes (expected {} to {})", bytes.size(), kMessageHeaderBytes,
                           kMaxMessageBytes);
  }
  Reader r(bytes);
  Message m;
  const auto type = r.get<std::uint8_t>();
  if (type < static_cast<std::uint8_t>(MessageType::kPrepare) || type > static_cast<std::uint8_t>(MessageType::kCommit)) {
    return invalidArgument("membership message of unknown type {}", type);
  }
  m.type = static_cast<MessageType>(type);
  const auto flags = r.get<std::uint8_t>();
  const auto reserved = r.get<std::uint16_t>();
  if (flags > 1 || reserved != 0) return invalidArgument("membership message: flags {:#x}, reserved {:#x}", flags, reserved);
  const auto from = r.get<std::int32_t>();
  if (!rankInRange(from)) return invalidArgument("membership message from rank {}", from);
  m.from = from;
  m.epoch = r.get<std::uint64_t>();
  m.ballot.round = r.get<std::uint64_t>();
  const auto proposer = r.get<std::int32_t>();
  if (proposer != -1 && !rankInRange(proposer)) return invalidArgument("membership message: ballot of rank {}", proposer);
  m.ballot.proposer = proposer;
  const auto acceptedRound = r.get<std::uint64_t>();
  const auto acceptedProposer = r.get<std::int32_t>();
  if (flags == 1) {
    if (!rankInRange(acceptedProposer)) {
      return invalidArgument("membership message: accepted ballot of rank {}", acceptedProposer);
    }
    m.acceptedBallot = Ballot{acceptedRound, acceptedProposer};
  } else if (acceptedRound != 0 || acceptedProposer != -1) {
    return invalidArgument("membership message: an accepted ballot without its flag");
  }
  m.view.epoch = r.get<std::uint64_t>();
  const auto count = r.get<std::uint32_t>();
  if (count > static_cast<std::uint32_t>(kMaxRanks) || bytes.size() != messageBytes(count)) {
    return invalidArgument("membership message: {} members in {} bytes", count, bytes.size());
  }
  m.view.members.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto member = r.get<std::uint32_t>();
    if (!rankInRange(member)) return invalidArgument("membership message: member {}", member);
    if (!m.view.members.empty() && static_cast<int>(member) <= m.view.members.back()) {
      return invalidArgument("membership message: members not sorted and unique");
    }
    m.view.members.push_back(static_cast<int>(member));
  }
  return m;
}

// ---- Agent --------------------------------------------------------------------------

Agent::Agent(int self, View initial) : Agent(self, std::move(initial), Options{}) {}

Agent::Agent(int self, View initial, Options options) : self_(self), options_(options), view_(std::move(initial)) {
  MERIDIAN_CHECK_MSG(std::is_sorted(view_.members.begin(), view_.members.end()) &&
                         std::adjacent_find(view_.members.begin(), view_.members.end()) == view_.members.end(),
                     "membership view {} is not sorted and unique", view_.toString());
  MERIDIAN_CHECK_MSG(view_.members.empty() || view_.contains(self_), "rank {} is not in its view {}", self_,
                     view_.toString());
}

void Agent::suspect(int rank) {
  if (rank != self_ && view_.contains(rank)) suspects_.insert(rank);
}

void Agent::admit(int rank) {
  if (rankInRange(rank) && !view_.contains(rank)) joiners_.insert(rank);
}

bool Agent::changePending() const {
  if (!view_.contains(self_)) return false;
  return !joiners_.empty() ||
         std::any_of(suspects_.begin(), suspects_.end(), [&](int r) { return view_.contains(r); });
}

std::vector<int> Agent::candidates() const {
  std::vector<int> c;
  std::copy_if(view_.members.begin(), view_.members.end(), std::back_inserter(c),
               [&](int r) { return suspects_.count(r) == 0; });
  return c;
}

Message Agent::make(MessageType type) const {
  Message m;
  m.type = type;
  m.from = self_;
  m.epoch = view_.epoch;
  return m;
}

std::vector<Outgoing> Agent::onTick(TimePoint now) {
  if (!changePending()) {
    pendingSince_.reset();
    return {};
  }
  if (!pendingSince_) pendingSince_ = now;
  if (phase_ != Phase::kIdle) return now >= phaseDeadline_ ? maybeAdvance(now, true) : std::vector<Outgoing>{};
  if (now < phaseDeadline_) return {};  // backing off after a refusal
  const std::vector<int> order = candidates();
  const auto at = std::find(order.begin(), order.end(), self_);
  const auto position = static_cast<long>(std::distance(order.begin(), at));
  if (now - *pendingSince_ >= position * options_.takeover) return startProposal(now);
  return {};
}

std::vector<Outgoing> Agent::startProposal(TimePoint now) {
  highestRound_ = std::max(highestRound_, promised_.round);
  ballot_ = Ballot{highestRound_ + 1, self_};
  highestRound_ = ballot_.round;
  phase_ = Phase::kPreparing;
  phaseDeadline_ = now + options_.phaseTimeout;
  promisedBy_.clear();
  acceptedBy_.clear();
  bestAcceptedBallot_.reset();
  // This rank's own promise, as any member's.
  promised_ = ballot_;
  promisedBy_.insert(self_);
  if (acceptedBallot_) {
    bestAcceptedBallot_ = acceptedBallot_;
    bestAcceptedView_ = acceptedView_;
  }
  // To every member, suspects too: a dead one drops it, and one that is alive but went on
  // without this rank (a partition healed) answers with the view it is in.
  std::vector<Outgoing> out;
  for (int r : view_.members) {
    if (r == self_) continue;
    Message m = make(MessageType::kPrepare);
    m.ballot = ballot_;
    out.push_back({r, std::move(m)});
  }
  std::vector<Outgoing> more = maybeAdvance(now, false);  // a view of one decides alone
  out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  return out;
}

std::vector<Outgoing> Agent::maybeAdvance(TimePoint now, bool deadlinePassed) {
  const std::size_t quorum = view_.quorum();
  if (phase_ == Phase::kPreparing) {
    const std::vector<int> expected = candidates();
    const bool everyone = std::all_of(expected.begin(), expected.end(), [&](int r) { return promisedBy_.count(r) > 0; });
    if (promisedBy_.size() >= quorum && (everyone || deadlinePassed)) {
      if (bestAcceptedBallot_) {
        proposal_ = bestAcceptedView_;  // possibly chosen already: it must stay chosen
      } else {
        proposal_ = View{view_.epoch + 1, {}};
        std::set<int> next(joiners_);
        for (int r : promisedBy_) {
          if (suspects_.count(r) == 0) next.insert(r);
        }
        proposal_.members.assign(next.begin(), next.end());
      }
      phase_ = Phase::kAccepting;
      phaseDeadline_ = now + options_.phaseTimeout;
      acceptedBy_.clear();
      acceptedBallot_ = ballot_;
      acceptedView_ = proposal_;
      acceptedBy_.insert(self_);
      std::vector<Outgoing> out;
      for (int r : promisedBy_) {
        if (r == self_) continue;
        Message m = make(MessageType::kAccept);
        m.ballot = ballot_;
        m.view = proposal_;
        out.push_back({r, std::move(m)});
      }
      std::vector<Outgoing> more = maybeAdvance(now, false);
      out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
      return out;
    }
    return deadlinePassed ? startProposal(now) : std::vector<Outgoing>{};
  }
  if (phase_ == Phase::kAccepting) {
    if (acceptedBy_.size() >= quorum) {
      const View chosen = proposal_;
      std::set<int> tell(view_.members.begin(), view_.members.end());
      tell.insert(chosen.members.begin(), chosen.members.end());
      std::vector<Outgoing> out;
      for (int r : tell) {
        if (r == self_) continue;
        Message m = make(MessageType::kCommit);
        m.view = chosen;
        out.push_back({r, std::move(m)});
      }
      install(chosen);
      return out;
    }
    return deadlinePassed ? startProposal(now) : std::vector<Outgoing>{};
  }
  return {};
}

void Agent::install(const View& next) {
  view_ = next;
  ++changes_;
  evicted_ = !view_.contains(self_);
  promised_ = Ballot{};
  acceptedBallot_.reset();
  acceptedView_ = View{};
  phase_ = Phase::kIdle;
  phaseDeadline_ = TimePoint{};
  pendingSince_.reset();
  for (auto it = suspects_.begin(); it != suspects_.end();) it = view_.contains(*it) ? std::next(it) : suspects_.erase(it);
  for (auto it = joiners_.begin(); it != joiners_.end();) it = view_.contains(*it) ? joiners_.erase(it) : std::next(it);
}

std::vector<Outgoing> Agent::onMessage(const Message& m, TimePoint now) {
  if (evicted_) return {};
  if (m.type == MessageType::kCommit) {
    // A rank waiting to be admitted takes only a view with it; the others, any newer view.
    const bool joining = view_.members.empty();
    if (joining ? m.view.contains(self_) : m.view.epoch > view_.epoch) install(m.view);
    return {};
  }
  if (!view_.contains(self_)) return {};  // still waiting to be admitted
  if (m.epoch < view_.epoch) {
    // A request from a rank that missed a commit: tell it what was decided (it learns it is
    // out, if it is). Late answers to this rank's own finished proposal need nothing.
    if (m.type != MessageType::kPrepare && m.type != MessageType::kAccept) return {};
    Message c = make(MessageType::kCommit);
    c.view = view_;
    return {{m.from, std::move(c)}};
  }
  if (m.epoch > view_.epoch || !view_.contains(m.from)) return {};  // this rank is behind, or a stranger
  highestRound_ = std::max(highestRound_, m.ballot.round);
  switch (m.type) {
    case MessageType::kPrepare: {
      if (m.ballot > promised_) {
        promised_ = m.ballot;
        Message p = make(MessageType::kPromise);
        p.ballot = m.ballot;
        p.acceptedBallot = acceptedBallot_;
        if (acceptedBallot_) p.view = acceptedView_;
        return {{m.from, std::move(p)}};
      }
      Message n = make(MessageType::kNack);
      n.ballot = promised_;
      return {{m.from, std::move(n)}};
    }
    case MessageType::kAccept: {
      if (m.ballot >= promised_ && m.view.epoch == view_.epoch + 1) {
        promised_ = m.ballot;
        acceptedBallot_ = m.ballot;
        acceptedView_ = m.view;
        Message a = make(MessageType::kAccepted);
        a.ballot = m.ballot;
        return {{m.from, std::move(a)}};
      }
      Message n = make(MessageType::kNack);
      n.ballot = promised_;
      return {{m.from, std::move(n)}};
    }
    case MessageType::kPromise:
      if (phase_ != Phase::kPreparing || m.ballot != ballot_) return {};
      promisedBy_.insert(m.from);
      if (m.acceptedBallot && (!bestAcceptedBallot_ || *m.acceptedBallot > *bestAcceptedBallot_) &&
          m.view.epoch == view_.epoch + 1) {
        bestAcceptedBallot_ = m.acceptedBallot;
        bestAcceptedView_ = m.view;
      }
      return maybeAdvance(now, false);
    case MessageType::kAccepted:
      if (phase_ != Phase::kAccepting || m.ballot != ballot_) return {};
      acceptedBy_.insert(m.from);
      return maybeAdvance(now, false);
    case MessageType::kNack:
      if (phase_ != Phase::kIdle && ballot_ < m.ballot) {
        phase_ = Phase::kIdle;  // another proposer is ahead: back off for a phase, then retry if still needed
        phaseDeadline_ = now + options_.phaseTimeout;
      }
      return {};
    case MessageType::kCommit:
      break;
  }
  return {};
}

}  // namespace meridian::bootstrap::membership
