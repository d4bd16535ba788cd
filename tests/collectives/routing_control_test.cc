// The routing control thread's firewall: a broken invariant on "mer-route" (a MERIDIAN_CHECK
// in the planner) stops routing and fails the plan sync, so the next collective reports it;
// the process lives on. Rank 0's control runs over a real loopback channel; the test plays
// rank 1 by sending it a link-state row, which completes the table and starts a re-plan.
#include <gtest/gtest.h>

#include <thread>

#include "collectives/plan_sync.h"
#include "collectives/routing_control.h"
#include "core/check.h"
#include "routing/link_state.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::collectives {
namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

struct Link {
  std::unique_ptr<transport::tcp::TcpDevice> a, b;
  transport::ChannelPtr ab, ba;  // rank 0's channel to rank 1, and rank 1's to rank 0
};

Link connectRanks() {
  Link l;
  transport::DeviceOptions o;
  o.localAddresses = {"127.0.0.1"};
  o.tcp.streamsPerPath = 1;
  o.secret = "routing-control-test";
  o.name = "rc0";
  auto a = transport::tcp::TcpDevice::create(o);
  o.name = "rc1";
  auto b = transport::tcp::TcpDevice::create(o);
  EXPECT_TRUE(a.isOk() && b.isOk()) << a.status().toString() << " / " << b.status().toString();
  if (!a.isOk() || !b.isOk()) return l;
  l.a = std::move(a).value();
  l.b = std::move(b).value();
  const TimePoint deadline = Clock::now() + kTimeout;
  transport::ChannelSpec specA{0x7e57, 0, 1, true, l.b->endpoint()};
  transport::ChannelSpec specB{0x7e57, 1, 0, false, l.a->endpoint()};
  Result<transport::ChannelPtr> ba = internalError("not run");
  std::thread acceptor([&] { ba = l.b->openChannel(specB, deadline); });
  auto ab = l.a->openChannel(specA, deadline);
  acceptor.join();
  EXPECT_TRUE(ab.isOk() && ba.isOk()) << ab.status().toString() << " / " << ba.status().toString();
  if (ab.isOk()) l.ab = std::move(ab).value();
  if (ba.isOk()) l.ba = std::move(ba).value();
  return l;
}

TEST(RoutingControlTest, AFailedCheckOnTheRoutingThreadBreaksTheNextCollectiveNotTheProcess) {
  Link link = connectRanks();
  ASSERT_TRUE(link.ab && link.ba);
  const std::vector<transport::ChannelPtr> channels{nullptr, link.ab};
  PlanSync sync(0, 2, channels, 1);
  RoutingControlOptions options;
  options.linkStateInterval = std::chrono::milliseconds(20);
  options.replanInterval = std::chrono::milliseconds(0);
  options.adaptive = true;
  int planned = 0;
  options.planner = [&planned](const routing::NetworkView& view) -> routing::PlanTable {
    ++planned;
    MERIDIAN_CHECK_MSG(view.ranks == 0, "injected planner failure ({} ranks)", view.ranks);
    return {};
  };
  RoutingControl control(0, 2, channels, nullptr, &sync, options);
  control.start();

  // Rank 1's row: an RTT to rank 0, which completes the table (rank 0 re-plans then).
  routing::LinkRow row;
  row.rank = 1;
  row.atUs = 1;
  routing::LinkFigures f;
  f.peer = 0;
  f.minRttUs = 100;
  f.srttUs = 120;
  row.links.push_back(f);
  const std::vector<std::uint8_t> bytes = routing::encodeLinkRow(row);
  auto sent = link.ba->isend(bytes.data(), bytes.size(), kLinkStateTag);
  ASSERT_TRUE(sent.isOk()) << sent.status().toString();

  const TimePoint deadline = Clock::now() + kTimeout;
  while (control.health().isOk() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const Status why = control.health();
  ASSERT_FALSE(why.isOk()) << "the injected planner never ran";
  EXPECT_EQ(why.code(), StatusCode::kInternal);
  EXPECT_NE(why.message().find("routing control (rank 0) stopped"), std::string::npos) << why.toString();
  EXPECT_NE(why.message().find("injected planner failure (2 ranks)"), std::string::npos) << why.toString();

  // The next collective reports it, and every one after it.
  for (std::uint64_t seq = 0; seq < 2; ++seq) {
    auto next = sync.atCollective(seq, Clock::now() + kTimeout, 0);
    ASSERT_FALSE(next.isOk()) << "collective " << seq;
    EXPECT_EQ(next.status().toString(), why.toString());
  }
  // Routing stopped: the loop planned once and does not run again.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  control.stop();
  EXPECT_EQ(planned, 1);
}

TEST(RoutingControlTest, PlanSyncKeepsTheFirstFailureAndIgnoresOk) {
  PlanSync sync(0, 1, {nullptr}, 1);
  sync.fail(Status::ok());
  EXPECT_TRUE(sync.atCollective(0, Clock::now(), 0).isOk());
  sync.fail(internalError("first"));
  sync.fail(internalError("second"));
  auto r = sync.atCollective(1, Clock::now(), 0);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().message(), "first");
}

}  // namespace
}  // namespace meridian::collectives
