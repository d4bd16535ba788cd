// The membership agreement (bootstrap/membership.h) with scripted failures: ranks killed
// (their messages dropped both ways), the coordinator among them, two at once, the
// coordinator dying after a view was chosen but before anyone heard, a partition, a false
// suspicion, joins; and the wire codec with every malformed field refused.
#include "bootstrap/membership.h"

#include <deque>
#include <map>
#include <set>

#include <gtest/gtest.h>

namespace meridian::bootstrap::membership {
namespace {

using std::chrono::milliseconds;

View viewOf(std::uint64_t epoch, std::vector<int> members) { return View{epoch, std::move(members)}; }

// Agents on a scripted network: messages are delivered in order; a dead rank neither sends
// nor receives; a cut pair drops both ways. Time moves only when the test says so.
class Net {
 public:
  explicit Net(int n) {
    std::vector<int> all;
    for (int r = 0; r < n; ++r) all.push_back(r);
    for (int r = 0; r < n; ++r) agents.emplace(r, Agent(r, viewOf(0, all), options()));
  }
  static Agent::Options options() { return {milliseconds(100), milliseconds(300)}; }

  void kill(int r) { dead.insert(r); }
  void cut(int a, int b) { cuts.insert({std::min(a, b), std::max(a, b)}); }
  void heal() { cuts.clear(); }
  bool blocked(int from, int to) const {
    return dead.count(from) || dead.count(to) || cuts.count({std::min(from, to), std::max(from, to)}) ||
           agents.count(to) == 0;
  }
  // Every living rank suspects `r` (the failure detector's verdict).
  void everyoneSuspects(int r) {
    for (auto& [id, a] : agents) {
      if (!dead.count(id)) a.suspect(r);
    }
  }
  void post(int from, std::vector<Outgoing> out) {
    for (auto& o : out) {
      if (dropFrom.count(from) && o.message.type == dropType) continue;
      if (!blocked(from, o.to)) queue.push_back(std::move(o));
      else ++dropped;
    }
  }
  void deliverAll() {
    for (int guard = 0; !queue.empty() && guard < 100000; ++guard) {
      Outgoing o = std::move(queue.front());
      queue.pop_front();
      if (blocked(o.message.from, o.to)) continue;
      ++delivered[o.message.type];
      post(o.to, agents.at(o.to).onMessage(o.message, now));
    }
  }
  // Advance the clock in 10 ms steps for `ms`, ticking every living rank and delivering.
  void run(int ms) {
    for (int t = 0; t < ms; t += 10) {
      now += milliseconds(10);
      for (auto& [id, a] : agents) {
        if (!dead.count(id)) post(id, a.onTick(now));
      }
      deliverAll();
    }
  }
  const View& viewOfRank(int r) const { return agents.at(r).view(); }
  void expectAllLivingAt(const View& v) const {
    for (const auto& [id, a] : agents) {
      if (dead.count(id)) continue;
      if (v.contains(id)) {
        EXPECT_EQ(a.view(), v) << "rank " << id << " is at " << a.view().toString() << ", not " << v.toString();
        EXPECT_FALSE(a.evicted());
      }
    }
  }

  std::map<int, Agent> agents;
  std::set<int> dead;
  std::set<std::pair<int, int>> cuts;
  std::deque<Outgoing> queue;
  std::map<MessageType, int> delivered;
  int dropped = 0;
  std::set<int> dropFrom;  // these ranks' messages of dropType vanish (a death mid-send)
  MessageType dropType = MessageType::kCommit;
  TimePoint now{};
};

TEST(MembershipTest, NothingHappensWithoutAFailureOrAJoin) {
  Net net(4);
  net.run(2000);
  EXPECT_TRUE(net.delivered.empty());
  net.expectAllLivingAt(viewOf(0, {0, 1, 2, 3}));
}

TEST(MembershipTest, ALostRankIsLeftOutByOneAgreedChange) {
  Net net(5);
  net.kill(3);
  net.everyoneSuspects(3);
  net.run(50);  // the coordinator (rank 0) proposes at once: one round trip of each phase
  net.expectAllLivingAt(viewOf(1, {0, 1, 2, 4}));
  for (int r : {0, 1, 2, 4}) EXPECT_EQ(net.agents.at(r).changes(), 1u);
  EXPECT_EQ(net.delivered[MessageType::kPrepare], 3);  // to the members it does not suspect
  EXPECT_EQ(net.delivered[MessageType::kCommit], 3);
  net.run(2000);  // and nothing more after it
  net.expectAllLivingAt(viewOf(1, {0, 1, 2, 4}));
}

TEST(MembershipTest, TheCoordinatorsDeathHandsTheChangeToTheNextRank) {
  Net net(5);
  net.kill(0);
  net.everyoneSuspects(0);
  net.run(50);
  net.expectAllLivingAt(viewOf(1, {1, 2, 3, 4}));
}

TEST(MembershipTest, TwoLostAtOnceTheCoordinatorAmongThemIsOneChange) {
  Net net(5);
  net.kill(0);
  net.kill(2);
  net.everyoneSuspects(0);
  net.everyoneSuspects(2);
  net.run(50);
  net.expectAllLivingAt(viewOf(1, {1, 3, 4}));
  for (int r : {1, 3, 4}) EXPECT_EQ(net.agents.at(r).changes(), 1u);
}

TEST(MembershipTest, ACoordinatorThatDiesAfterAViewWasChosenLeavesThatViewChosen) {
  Net net(5);
  net.kill(4);
  net.everyoneSuspects(4);
  // Rank 0's commits never leave: it dies the moment its view {0,1,2,3} was accepted.
  net.dropFrom.insert(0);
  net.run(10);
  EXPECT_EQ(net.viewOfRank(0), viewOf(1, {0, 1, 2, 3}));  // chosen, and only 0 knows
  for (int r : {1, 2, 3}) EXPECT_EQ(net.viewOfRank(r).epoch, 0u);
  net.kill(0);
  net.everyoneSuspects(0);
  // Rank 1 proposes; its promises carry the accepted view, which it must commit (not its own
  // {1,2,3} for epoch 1); then the next change removes rank 0.
  net.run(100);
  for (int r : {1, 2, 3}) {
    EXPECT_EQ(net.viewOfRank(r), viewOf(2, {1, 2, 3})) << "rank " << r;
    EXPECT_EQ(net.agents.at(r).changes(), 2u) << "rank " << r << " skipped the chosen epoch-1 view";
  }
}

TEST(MembershipTest, AMinorityCannotDecideAndLearnsItIsOutWhenThePartitionHeals) {
  Net net(5);
  for (int a : {0, 1}) {
    for (int b : {2, 3, 4}) net.cut(a, b);
  }
  for (int a : {0, 1}) {
    for (int b : {2, 3, 4}) {
      net.agents.at(a).suspect(b);
      net.agents.at(b).suspect(a);
    }
  }
  net.run(3000);  // the minority keeps trying: 2 of 5 is no majority
  EXPECT_EQ(net.viewOfRank(0).epoch, 0u);
  EXPECT_EQ(net.viewOfRank(1).epoch, 0u);
  net.expectAllLivingAt(viewOf(1, {2, 3, 4}));
  net.heal();
  net.run(1000);  // the minority's next prepare reaches the majority, which answers with its view
  EXPECT_TRUE(net.agents.at(0).evicted());
  EXPECT_TRUE(net.agents.at(1).evicted());
  net.expectAllLivingAt(viewOf(1, {2, 3, 4}));
}

TEST(MembershipTest, OneRanksSuspicionOfALivePeerLeavesOutThatPeerAndNoOtherAfterTheStagger) {
  // Rank 2 cannot reach rank 0 (a cut link), the others can: a collective needs every pair,
  // so one of the two must go. Rank 2 is the only one with a change pending; it waits its
  // turn in the order (1 x takeover: rank 1 is before it) and then proposes.
  Net net(4);
  net.cut(0, 2);
  net.agents.at(2).suspect(0);
  net.run(250);
  EXPECT_EQ(net.viewOfRank(2).epoch, 0u) << "rank 2 proposed before its turn";
  net.run(400);
  net.expectAllLivingAt(viewOf(1, {1, 2, 3}));
  EXPECT_TRUE(net.agents.at(0).evicted() || net.viewOfRank(0).epoch == 0u);
}

TEST(MembershipTest, AJoinerIsAdmittedAndLearnsTheViewWithIt) {
  Net net(3);
  net.agents.emplace(3, Agent(3, View{}, Net::options()));
  for (int r = 0; r < 3; ++r) net.agents.at(r).admit(3);
  net.run(50);
  net.expectAllLivingAt(viewOf(1, {0, 1, 2, 3}));
  EXPECT_EQ(net.viewOfRank(3), viewOf(1, {0, 1, 2, 3}));
  // The joiner takes part in the next change like any member.
  net.kill(1);
  net.everyoneSuspects(1);
  net.run(50);
  net.expectAllLivingAt(viewOf(2, {0, 2, 3}));
}

TEST(MembershipTest, ALostPhaseIsRetriedWithAHigherBallot) {
  Net net(3);
  net.kill(2);
  net.everyoneSuspects(2);
  net.cut(0, 1);  // rank 0's prepare is lost: no majority, the phase runs out
  net.run(150);
  EXPECT_EQ(net.viewOfRank(0).epoch, 0u);
  net.heal();
  net.run(300);
  net.expectAllLivingAt(viewOf(1, {0, 1}));
}

TEST(MembershipCodecTest, RoundTripsEveryField) {
  Message m;
  m.type = MessageType::kPromise;
  m.from = 7;
  m.epoch = 12;
  m.ballot = {5, 3};
  m.acceptedBallot = Ballot{4, 2};
  m.view = viewOf(13, {0, 3, 7, 65535});
  auto back = decodeMessage(encodeMessage(m));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value(), m);
  m.acceptedBallot.reset();
  m.type = MessageType::kNack;
  m.view = {};
  back = decodeMessage(encodeMessage(m));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value(), m);
}

TEST(MembershipCodecTest, RefusesEveryMalformedField) {
  Message good;
  good.type = MessageType::kCommit;
  good.from = 1;
  good.view = viewOf(2, {1, 2, 3});
  const std::vector<std::uint8_t> base = encodeMessage(good);
  ASSERT_TRUE(decodeMessage(base).isOk());
  auto with = [&](std::size_t at, std::uint8_t v) {
    auto b = base;
    b[at] = v;
    return b;
  };
  EXPECT_FALSE(decodeMessage(std::vector<std::uint8_t>(51, 0)).isOk());  // shorter than a header
  EXPECT_FALSE(decodeMessage(with(0, 0)).isOk());                         // type 0
  EXPECT_FALSE(decodeMessage(with(0, 7)).isOk());                         // type past kCommit
  EXPECT_FALSE(decodeMessage(with(1, 2)).isOk());                         // unknown flag
  EXPECT_FALSE(decodeMessage(with(2, 1)).isOk());                         // reserved
  EXPECT_FALSE(decodeMessage(with(7, 0x80)).isOk());                      // from < 0
  EXPECT_FALSE(decodeMessage(with(6, 0x01)).isOk());                      // from = 65537
  EXPECT_FALSE(decodeMessage(with(28, 1)).isOk());                        // accepted round without flag
  EXPECT_FALSE(decodeMessage(with(48, 4)).isOk());                        // 4 members in 3's bytes
  EXPECT_FALSE(decodeMessage(with(48, 0xff)).isOk());
  EXPECT_FALSE(decodeMessage(with(52, 2)).isOk());                        // members not sorted
  EXPECT_FALSE(decodeMessage(with(60, 2)).isOk());                        // a duplicate
  EXPECT_FALSE(decodeMessage(with(55, 0x80)).isOk());                     // a member out of range
  auto longer = base;
  longer.push_back(0);
  EXPECT_FALSE(decodeMessage(longer).isOk());
  EXPECT_FALSE(decodeMessage(std::vector<std::uint8_t>(kMaxMessageBytes + 1, 0)).isOk());
}

}  // namespace
}  // namespace meridian::bootstrap::membership
