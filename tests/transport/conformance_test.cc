// The transport conformance suite: what every kind of path must do, run over each kind a
// channel of the TCP device can hold, between two devices in one process on loopback:
//   tcp            one TCP path
//   tcp;ofi_rxm    one fabric path on libfabric's tcp;ofi_rxm provider (the TCP path beside
//                  it on standby, MERIDIAN_FABRIC_TCP=standby: it carries no data while the
//                  fabric path is up)
//   shm            the same on libfabric's shm provider
//   mixed-*        one TCP path and one fabric path, striped
//   meridian-shm   Meridian's own shared-memory path (transport/shm/path.h), the TCP path on
//                  standby beside it (as between two ranks of one host)
// Real libfabric providers, real sockets; nothing mocked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/common/poll.h"
#include "tests/transport/test_pattern.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {
namespace {

using meridian::testing::pollUntil;

constexpr auto kTimeout = std::chrono::seconds(60);
constexpr std::size_t kChunk = 256 * 1024;
constexpr std::size_t kFabricPath = 1;  // the fabric (or shared-memory) path's index: after the one TCP path

struct Kind {
  const char* name;
  const char* provider;  // "" : no fabric
  bool fabricOnly;       // the TCP path on standby (DeviceOptions::Fabric::tcp)
  bool sharedMemory = false;  // a shared-memory path instead of a fabric one
};

std::string kindName(const ::testing::TestParamInfo<Kind>& info) {
  std::string n = info.param.name;
  std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return n;
}

// Opens a channel between devices made with `a` and `b`; returns both ends.
std::pair<ChannelPtr, ChannelPtr> openPair(TcpDevice& a, TcpDevice& b, std::uint64_t session) {
  const auto deadline = Clock::now() + kTimeout;
  Result<ChannelPtr> ba = internalError("not run");
  std::thread acceptor([&] { ba = b.openChannel({session, 1, 0, false, a.endpoint()}, deadline); });
  auto ab = a.openChannel({session, 0, 1, true, b.endpoint()}, deadline);
  acceptor.join();
  EXPECT_TRUE(ab.isOk()) << ab.status().toString();
  EXPECT_TRUE(ba.isOk()) << ba.status().toString();
  return {ab.isOk() ? ab.value() : nullptr, ba.isOk() ? ba.value() : nullptr};
}

class ConformanceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    static int pairs = 0;
    ++pairs;
    const Kind& k = GetParam();
    DeviceOptions o;
    o.localAddresses = {"127.0.0.1"};
    o.tcp.streamsPerPath = 1;
    o.chunkBytes = kChunk;
    o.pathStallMs = 3000;
    o.secret = "conformance-secret";
    o.relaySlot = false;
    o.directRead = false;
    o.fabric.mode = *k.provider != '\0' ? "on" : "off";
    o.fabric.provider = k.provider;
    o.fabric.tcp = k.fabricOnly ? "standby" : "data";
    o.shm = k.sharedMemory ? "auto" : "off";
    for (int side = 0; side < 2; ++side) {
      o.name = fmt::format("cf{}{}", pairs, side == 0 ? 'a' : 'b');
      auto dev = TcpDevice::create(o);
      ASSERT_TRUE(dev.isOk()) << dev.status().toString();
      dev_[side] = std::move(dev.value());
      // What a communicator's joinGroup settles for two ranks of one host.
      if (k.sharedMemory) dev_[side]->planDirectRead(kSession, 1 - side, {0, false, /*sameHost=*/true});
    }
    std::tie(ch_[0], ch_[1]) = openPair(*dev_[0], *dev_[1], kSession);
    ASSERT_TRUE(ch_[0] && ch_[1]);
    if (fabric() || GetParam().sharedMemory) {
      // The fabric path comes up once each side has the other's rail name (the shared-memory
      // path once paired).
      ASSERT_TRUE(pollUntil([&] { return ch_[0]->pathStats().size() == 2 && ch_[0]->pathStats()[kFabricPath].alive &&
                                         ch_[1]->pathStats()[kFabricPath].alive; },
                            kTimeout))
          << "the fabric path never came up";
    } else {
      ASSERT_EQ(ch_[0]->pathStats().size(), 1u) << "MERIDIAN_FABRIC off: TCP paths only";
    }
  }

  // Both channels close (goodbyes go out while both ends are alive), then the devices go.
  // (libfabric 1.17's shm: a send to an shm endpoint of this process that closed crashes.)
  void TearDown() override {
    for (int side = 0; side < 2; ++side) {
      if (dev_[side] && ch_[side]) (void)dev_[side]->closeChannel(kSession, 1 - side);
    }
    ch_[0] = ch_[1] = nullptr;
    dev_[1].reset();
    dev_[0].reset();
  }

  bool fabric() const { return *GetParam().provider != '\0'; }

  std::vector<std::uint64_t> chunksSent(int side) const {
    std::vector<std::uint64_t> v;
    for (const auto& s : ch_[side]->pathStats()) v.push_back(s.chunksSent);
    return v;
  }

  // Sends `bytes` from side `from` into a receive of `capacity` bytes at the other side.
  void transfer(int from, std::size_t bytes, std::size_t capacity, std::uint64_t tag, Status* recvStatus = nullptr,
                std::size_t* received = nullptr) {
    const auto data = pattern(bytes, static_cast<std::uint32_t>(bytes + tag));
    std::vector<std::uint8_t> got(capacity + 16, 0xee);
    auto r = ch_[1 - from]->irecv(got.data(), capacity, tag);
    auto s = ch_[from]->isend(data.data(), data.size(), tag);
    ASSERT_TRUE(r.isOk() && s.isOk());
    const auto deadline = Clock::now() + kTimeout;
    const Status rs = (*r)->wait(deadline);
    (void)(*s)->wait(deadline);
    ASSERT_TRUE((*r)->done()) << bytes << " bytes never arrived";
    if (recvStatus != nullptr) *recvStatus = rs;
    if (received != nullptr) *received = (*r)->bytes();
    if (!rs.isOk()) return;
    ASSERT_TRUE((*s)->status().isOk()) << (*s)->status().toString();
    ASSERT_EQ((*r)->bytes(), bytes);
    ASSERT_TRUE(std::equal(data.begin(), data.end(), got.begin())) << bytes << " bytes arrived damaged";
    ASSERT_EQ(got[capacity], 0xee) << "wrote past the receive";
  }

  static constexpr std::uint64_t kSession = 0xc0f0;
  std::unique_ptr<TcpDevice> dev_[2];
  ChannelPtr ch_[2];
};

TEST_P(ConformanceTest, MessagesFromZeroBytesTo64MiBArriveByteExactBothWays) {
  const auto before = chunksSent(0);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, kChunk + 1, std::size_t{(1 << 20) + 3},
                        std::size_t{9 << 20}, std::size_t{64} << 20}) {
    for (int from = 0; from < 2; ++from) {
      SCOPED_TRACE(fmt::format("{} bytes from side {}", n, from));
      ASSERT_NO_FATAL_FAILURE(transfer(from, n, n, 3));
    }
  }
  const auto after = chunksSent(0);
  if (!fabric() && !GetParam().sharedMemory) return;
  const std::uint64_t onTcp = after[0] - before[0], onFabric = after[kFabricPath] - before[kFabricPath];
  EXPECT_GT(onFabric, 0u) << "the fabric path carried nothing";
  if (GetParam().fabricOnly) {
    EXPECT_EQ(onTcp, 0u) << "the TCP path, on standby, carried chunks while the fabric path was up";
  } else {
    EXPECT_GT(onTcp, 0u) << "a mixed channel striped nothing over its TCP path";
  }
}

TEST_P(ConformanceTest, ManyInFlightMatchInPostingOrderPerTag) {
  constexpr int kMessages = 300;
  std::vector<std::vector<std::uint8_t>> sent(kMessages), got(kMessages);
  std::vector<RequestPtr> reqs;
  for (int i = 0; i < kMessages; ++i) {
    sent[i] = pattern(1 + static_cast<std::size_t>(i * 7919) % (3 * kChunk), static_cast<std::uint32_t>(i));
    got[i].assign(3 * kChunk, 0);
  }
  // Receives of tag 1 before the sends, of tag 0 after: message i goes with tag i % 2.
  for (int i = 1; i < kMessages; i += 2) reqs.push_back(ch_[1]->irecv(got[i].data(), got[i].size(), 1).value());
  for (int i = 0; i < kMessages; ++i) {
    reqs.push_back(ch_[0]->isend(sent[i].data(), sent[i].size(), static_cast<std::uint64_t>(i % 2)).value());
  }
  for (int i = 0; i < kMessages; i += 2) reqs.push_back(ch_[1]->irecv(got[i].data(), got[i].size(), 0).value());
  const auto deadline = Clock::now() + kTimeout;
  for (auto& r : reqs) ASSERT_TRUE(r->wait(deadline).isOk()) << r->status().toString();
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(0, std::memcmp(got[i].data(), sent[i].data(), sent[i].size())) << "message " << i << " out of order";
  }
}

TEST_P(ConformanceTest, AReceiveLargerThanTheSendGetsTheSentBytes) {
  std::size_t received = 0;
  Status st;
  ASSERT_NO_FATAL_FAILURE(transfer(0, (1 << 20) + 5, 4 << 20, 5, &st, &received));
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(received, (1u << 20) + 5);
}

TEST_P(ConformanceTest, ASendLargerThanTheReceiveFailsThatReceiveAndTheChannelGoesOn) {
  Status st;
  ASSERT_NO_FATAL_FAILURE(transfer(0, 2 << 20, 1 << 20, 6, &st));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  ASSERT_NO_FATAL_FAILURE(transfer(0, 3 << 20, 3 << 20, 6));
  ASSERT_NO_FATAL_FAILURE(transfer(1, 1000, 1000, 6));
}

TEST_P(ConformanceTest, ClosingInFlightEndsThePeersRequestsWithinTheDeadline) {
  const auto data = pattern(32 << 20, 8);
  std::vector<std::uint8_t> got(data.size());
  auto r = ch_[1]->irecv(got.data(), got.size(), 8).value();
  auto s = ch_[0]->isend(data.data(), data.size(), 8).value();
  // Close as soon as the first bytes moved: the transfer is in flight.
  ASSERT_TRUE(pollUntil([&] { return ch_[1]->pathStats()[0].bytesReceived > 0 ||
                                     ch_[1]->pathStats().back().bytesReceived > 0 || r->done(); },
                        kTimeout));
  ASSERT_TRUE(dev_[0]->closeChannel(kSession, 1).isOk());
  const auto deadline = Clock::now() + kTimeout;
  (void)s->wait(deadline);
  (void)r->wait(deadline);
  EXPECT_TRUE(s->done() && r->done()) << "a request outlived the close";
  if (r->status().isOk()) {
    EXPECT_EQ(got, data) << "the message completed before the close: it must be whole";
  } else {
    EXPECT_TRUE(ch_[1]->health().code() != StatusCode::kOk) << "the peer's channel should be broken";
  }
}

// The fabric path dies mid-message: every byte still arrives, on the TCP path (weighted down
// or not: it is the one path left).
class FabricPathCutTest : public ConformanceTest {};

TEST_P(FabricPathCutTest, AFabricPathCutMidMessageLosesNothing) {
  const auto data = pattern(48 << 20, 9);
  std::vector<std::uint8_t> got(data.size());
  auto r = ch_[1]->irecv(got.data(), got.size(), 9).value();
  auto s = ch_[0]->isend(data.data(), data.size(), 9).value();
  ASSERT_TRUE(pollUntil([&] { return ch_[1]->pathStats()[kFabricPath].bytesReceived > 0 || r->done(); }, kTimeout));
  ASSERT_TRUE(dev_[0]->cutPath(kSession, 1, static_cast<int>(kFabricPath)).isOk());
  const auto deadline = Clock::now() + kTimeout;
  ASSERT_TRUE(s->wait(deadline).isOk()) << s->status().toString();
  ASSERT_TRUE(r->wait(deadline).isOk()) << r->status().toString();
  EXPECT_EQ(got, data);
  EXPECT_FALSE(ch_[0]->pathStats()[kFabricPath].alive);
  const auto before = chunksSent(0);
  ASSERT_NO_FATAL_FAILURE(transfer(0, 5 << 20, 5 << 20, 10));
  // With the fabric path gone, the TCP path carries the data, standby or not.
  EXPECT_GT(chunksSent(0)[0], before[0]) << "the TCP path did not take the data over";
}

// ---- fabric settings and peers that do not fit: one clear line, TCP goes on where it can

DeviceOptions fabricOptions(const std::string& mode, const std::string& provider, const std::string& domain = "") {
  static int devices = 0;
  DeviceOptions o;
  o.localAddresses = {"127.0.0.1"};
  o.tcp.streamsPerPath = 1;
  o.secret = "conformance-secret";
  o.name = fmt::format("fd{}", ++devices);
  o.fabric.mode = mode;
  o.fabric.provider = provider;
  o.fabric.domain = domain;
  return o;
}

TEST(FabricDeviceTest, OnWithAnUnknownProviderFailsNamingItAndTheProvidersThereAre) {
  auto dev = TcpDevice::create(fabricOptions("on", "nosuchfabric"));
  ASSERT_FALSE(dev.isOk());
  EXPECT_EQ(dev.status().code(), StatusCode::kInvalidArgument) << dev.status().toString();
  EXPECT_NE(dev.status().message().find("nosuchfabric"), std::string::npos) << dev.status().message();
  EXPECT_NE(dev.status().message().find("tcp;ofi_rxm"), std::string::npos) << "should list what is there: "
                                                                           << dev.status().message();
}

TEST(FabricDeviceTest, OnWithAnUnknownDomainFailsNamingIt) {
  auto dev = TcpDevice::create(fabricOptions("on", "tcp;ofi_rxm", "nosuchnic0"));
  ASSERT_FALSE(dev.isOk());
  EXPECT_NE(dev.status().message().find("nosuchnic0"), std::string::npos) << dev.status().message();
}

TEST(FabricDeviceTest, AModeOutsideAutoOnOffIsRefused) {
  auto dev = TcpDevice::create(fabricOptions("maybe", ""));
  ASSERT_FALSE(dev.isOk());
  EXPECT_NE(dev.status().message().find("MERIDIAN_FABRIC"), std::string::npos) << dev.status().message();
}

// auto uses RDMA providers only: a named tcp;ofi_rxm is left alone, and channels are TCP only.
TEST(FabricDeviceTest, AutoLeavesANonRdmaProviderAloneAndRunsTcpOnly) {
  auto a = TcpDevice::create(fabricOptions("auto", "tcp;ofi_rxm"));
  auto b = TcpDevice::create(fabricOptions("auto", "tcp;ofi_rxm"));
  ASSERT_TRUE(a.isOk() && b.isOk());
  auto [ab, ba] = openPair(**a, **b, 0xa0);
  ASSERT_TRUE(ab && ba);
  EXPECT_EQ(ab->pathStats().size(), 1u) << "a fabric path without an RDMA provider under MERIDIAN_FABRIC=auto";
}

// One side's rail is shm, the other's tcp;ofi_rxm: each refuses the other's name, the fabric
// path stays down, and the channel carries everything on TCP.
TEST(FabricDeviceTest, ARailNameThePeerCannotTakeLeavesTheFabricPathDownAndTcpCarriesOn) {
  auto a = TcpDevice::create(fabricOptions("on", "shm"));
  auto b = TcpDevice::create(fabricOptions("on", "tcp;ofi_rxm"));
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk()) << b.status().toString();
  auto [ab, ba] = openPair(**a, **b, 0xa1);
  ASSERT_TRUE(ab && ba);
  ASSERT_EQ(ab->pathStats().size(), 2u);
  const auto data = pattern(3 << 20, 11);
  std::vector<std::uint8_t> got(data.size());
  auto r = ba->irecv(got.data(), got.size(), 1).value();
  auto s = ab->isend(data.data(), data.size(), 1).value();
  ASSERT_TRUE(r->wait(Clock::now() + kTimeout).isOk()) << r->status().toString();
  ASSERT_TRUE(s->wait(Clock::now() + kTimeout).isOk());
  EXPECT_EQ(got, data);
  for (const auto& c : {ab, ba}) {
    EXPECT_FALSE(c->pathStats()[kFabricPath].alive) << "a fabric path came up with a name its rail cannot take";
    EXPECT_EQ(c->pathStats()[kFabricPath].chunksSent, 0u);
  }
  (void)(*a)->closeChannel(0xa1, 1);
  (void)(*b)->closeChannel(0xa1, 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ConformanceTest,
                         ::testing::Values(Kind{"tcp", "", false}, Kind{"tcp;ofi_rxm", "tcp;ofi_rxm", true},
                                           Kind{"shm", "shm", true}, Kind{"mixed-tcp;ofi_rxm", "tcp;ofi_rxm", false},
                                           Kind{"mixed-shm", "shm", false}, Kind{"meridian-shm", "", true, true}),
                         kindName);
INSTANTIATE_TEST_SUITE_P(FabricKinds, FabricPathCutTest,
                         ::testing::Values(Kind{"tcp;ofi_rxm", "tcp;ofi_rxm", true}, Kind{"shm", "shm", true},
                                           Kind{"mixed-tcp;ofi_rxm", "tcp;ofi_rxm", false},
                                           Kind{"mixed-shm", "shm", false}, Kind{"meridian-shm", "", true, true}),
                         kindName);

}  // namespace
}  // namespace meridian::transport::tcp
