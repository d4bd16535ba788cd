// The multipath protocol over the in-memory backend: loss, reordering, stalls and path death
// on command, with the test owning the clock and every step, so failover, resend and
// matching are checked without sockets or timing (each case was timing-dependent over TCP).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "transport/device.h"
#include "transport/memory/memory_device.h"
#include "transport/registration_cache.h"
#include "tests/transport/test_pattern.h"

namespace meridian::transport::memory {
namespace {

constexpr std::uint64_t kSession = 0x3e3;
constexpr std::size_t kChunk = 4096;
const TimePoint kSoon = TimePoint::max();

struct Pair {
  std::unique_ptr<Network> net = std::make_unique<Network>();
  std::unique_ptr<MemoryDevice> a, b;
  ChannelPtr ab, ba;  // a's channel to b (a is rank 0 and initiates), b's to a
};

Pair connect(int paths, bool adaptive = true, int stallMs = 100) {
  Pair p;
  DeviceOptions o;
  o.kind = DeviceKind::kMemory;
  o.localAddresses.clear();
  for (int i = 0; i < paths; ++i) o.localAddresses.push_back("m" + std::to_string(i));
  o.chunkBytes = kChunk;
  o.pathStallMs = stallMs;
  o.adaptive = adaptive;
  // Path counters are process-wide series keyed by device name: one name per pair.
  static int pairs = 0;
  ++pairs;
  o.name = "ma" + std::to_string(pairs);
  p.a = p.net->createDevice(o).value();
  o.name = "mb" + std::to_string(pairs);
  p.b = p.net->createDevice(o).value();
  p.ab = p.a->openChannel({kSession, 0, 1, true, p.b->endpoint()}, kSoon).value();
  p.ba = p.b->openChannel({kSession, 1, 0, false, p.a->endpoint()}, kSoon).value();
  return p;
}

// Steps until both requests are done; fails the test if they never are.
void runUntilDone(Network& net, const RequestPtr& a, const RequestPtr& b) {
  ASSERT_TRUE(net.runUntil([&] { return a->done() && b->done(); }, 10000)) << "the transfer never finished";
}

TEST(MemoryChannelTest, StripesAMessageOverEveryPath) {
  Pair p = connect(3);
  const auto data = pattern(64 * kChunk + 123, 1);
  std::vector<std::uint8_t> got(data.size());
  auto r = p.ba->irecv(got.data(), got.size(), 5).value();
  auto s = p.ab->isend(data.data(), data.size(), 5).value();
  runUntilDone(*p.net, s, r);
  ASSERT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_EQ(r->bytes(), data.size());
  EXPECT_EQ(got, data);
  for (const auto& ps : p.ab->pathStats()) EXPECT_GT(ps.chunksSent, 0u) << ps.localAddress << " carried nothing";
}

TEST(MemoryChannelTest, ResendsALostChunkOnAnotherPathOnceItsPathStalls) {
  Pair p = connect(2, true, /*stallMs=*/100);
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.dropData = 1}).isOk());
  const auto data = pattern(16 * kChunk, 2);
  std::vector<std::uint8_t> got(data.size());
  auto r = p.ba->irecv(got.data(), got.size(), 1).value();
  auto s = p.ab->isend(data.data(), data.size(), 1).value();
  // Without time passing, the lost chunk is never acknowledged and the message waits.
  p.net->runUntil([] { return false; }, 50);
  EXPECT_FALSE(r->done()) << "one chunk was lost: the message cannot be complete yet";
  EXPECT_EQ(p.net->droppedFrames(), 1u);
  // Past the stall limit the path's unacknowledged chunks go out again on the other path.
  p.net->advanceUs(2'000'000);
  runUntilDone(*p.net, s, r);
  ASSERT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_EQ(got, data);
  const auto stats = p.ab->pathStats();
  EXPECT_TRUE(stats[0].stalled) << "path 0 lost a chunk and should count as stalled";
  EXPECT_GE(stats[0].chunksResent, 1u);
}

TEST(MemoryChannelTest, FailsOverWhenAPathDiesWithChunksOnIt) {
  Pair p = connect(2);
  // Path 0 swallows everything (frames queue up), then dies: its chunks must move to path 1.
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.stalled = true}).isOk());
  const auto data = pattern(32 * kChunk + 7, 3);
  std::vector<std::uint8_t> got(data.size());
  auto r = p.ba->irecv(got.data(), got.size(), 9).value();
  auto s = p.ab->isend(data.data(), data.size(), 9).value();
  p.net->runUntil([] { return false; }, 20);
  EXPECT_FALSE(r->done());
  ASSERT_TRUE(p.a->cutPath(kSession, 1, 0).isOk());
  runUntilDone(*p.net, s, r);
  ASSERT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_EQ(got, data);
  EXPECT_FALSE(p.ab->pathStats()[0].alive);
  EXPECT_FALSE(p.ba->pathStats()[0].alive) << "a cut path is dead at both ends";
  EXPECT_TRUE(p.ab->health().isOk()) << "one path left: the channel lives on";
}

TEST(MemoryChannelTest, DropsDuplicatesWhenAStalledPathDeliversLate) {
  Pair p = connect(2, true, 100);
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.stalled = true}).isOk());
  const auto first = pattern(8 * kChunk, 4), second = pattern(8 * kChunk, 5);
  std::vector<std::uint8_t> got1(first.size()), got2(second.size());
  auto r1 = p.ba->irecv(got1.data(), got1.size(), 3).value();
  auto s1 = p.ab->isend(first.data(), first.size(), 3).value();
  p.net->runUntil([] { return false; }, 20);
  p.net->advanceUs(2'000'000);  // path 0 counts as stalled: its chunks go again on path 1
  runUntilDone(*p.net, s1, r1);
  ASSERT_TRUE(r1->status().isOk());
  EXPECT_EQ(got1, first);
  // Path 0 comes back and delivers the first copies: they are duplicates and must not land
  // in the next message's buffer.
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{}).isOk());
  auto r2 = p.ba->irecv(got2.data(), got2.size(), 3).value();
  auto s2 = p.ab->isend(second.data(), second.size(), 3).value();
  runUntilDone(*p.net, s2, r2);
  ASSERT_TRUE(r2->status().isOk()) << r2->status().toString();
  EXPECT_EQ(got2, second);
  EXPECT_EQ(got1, first) << "a late duplicate overwrote a finished receive";
}

TEST(MemoryChannelTest, MatchesReorderedMessagesInPostingOrderPerTag) {
  Pair p = connect(3);
  for (std::size_t path = 0; path < 3; ++path) {
    ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, path, PathFaults{.reorder = true}).isOk());
  }
  // Eager and chunked messages on two tags, interleaved; sizes differ so a mismatch shows.
  const std::vector<std::size_t> sizes{100, 5 * kChunk + 1, 0, 70 * 1024, 3, 9 * kChunk};
  std::vector<std::vector<std::uint8_t>> sent, got;
  std::vector<RequestPtr> recvs, sends;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(pattern(sizes[i], static_cast<std::uint32_t>(10 + i)));
    got.emplace_back(sizes[i] + 16);
  }
  // Receives posted in reverse tag order; within a tag, in message order.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i % 2 == 1) recvs.push_back(p.ba->irecv(got[i].data(), got[i].size(), 2).value());
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i % 2 == 0) recvs.push_back(p.ba->irecv(got[i].data(), got[i].size(), 1).value());
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sends.push_back(p.ab->isend(sent[i].data(), sent[i].size(), i % 2 == 0 ? 1 : 2).value());
  }
  ASSERT_TRUE(p.net->runUntil([&] {
    return std::all_of(recvs.begin(), recvs.end(), [](const auto& r) { return r->done(); }) &&
           std::all_of(sends.begin(), sends.end(), [](const auto& s) { return s->done(); });
  }));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto& r = recvs[i % 2 == 1 ? i / 2 : sizes.size() / 2 + i / 2];
    ASSERT_TRUE(r->status().isOk()) << "message " << i << ": " << r->status().toString();
    EXPECT_EQ(r->bytes(), sizes[i]) << "message " << i << " matched another's receive";
    EXPECT_TRUE(std::equal(sent[i].begin(), sent[i].end(), got[i].begin())) << "message " << i;
  }
}

TEST(MemoryChannelTest, StaticStripingSplitsBytesEvenly) {
  Pair p = connect(2, /*adaptive=*/false);
  const auto data = pattern(64 * kChunk, 6);
  std::vector<std::uint8_t> got(data.size());
  auto r = p.ba->irecv(got.data(), got.size(), 4).value();
  auto s = p.ab->isend(data.data(), data.size(), 4).value();
  runUntilDone(*p.net, s, r);
  ASSERT_TRUE(r->status().isOk());
  const auto stats = p.ab->pathStats();
  EXPECT_EQ(stats[0].chunksSent, 32u);
  EXPECT_EQ(stats[1].chunksSent, 32u);
}

// Sends `count` messages of `bytes` one after another over `p` and returns the chunks each
// path carried for the last of them.
std::vector<std::uint64_t> sendMessages(Pair& p, int count, std::size_t bytes, std::uint64_t tag) {
  std::vector<std::uint64_t> before;
  const auto data = pattern(bytes, static_cast<std::uint32_t>(tag));
  std::vector<std::uint8_t> got(bytes);
  for (int i = 0; i < count; ++i) {
    before.clear();
    for (const auto& ps : p.ab->pathStats()) before.push_back(ps.chunksSent);
    auto r = p.ba->irecv(got.data(), got.size(), tag).value();
    auto s = p.ab->isend(data.data(), data.size(), tag).value();
    EXPECT_TRUE(p.net->runUntil([&] { return r->done() && s->done(); })) << "message " << i;
    EXPECT_TRUE(r->status().isOk()) << r->status().toString();
  }
  EXPECT_EQ(got, data);
  std::vector<std::uint64_t> last;
  const auto stats = p.ab->pathStats();
  for (std::size_t i = 0; i < stats.size(); ++i) last.push_back(stats[i].chunksSent - before[i]);
  return last;
}

// The tail of a message on a path that stopped acknowledging (a plane swamped by
// cross-traffic, its TCP backing off) while the other path has nothing to do: it moves
// after a third of the stall limit, not the whole limit.
TEST(MemoryChannelTest, MovesATailStuckOnOnePathSoonerWhileAnotherIsIdle) {
  Pair p = connect(2, true, /*stallMs=*/3000);
  p.net->setStepUs(1000);  // 32 KiB a step each: 32 MB/s, measured by the first messages
  for (std::size_t path = 0; path < 2; ++path) {
    ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, path, PathFaults{.bytesPerStep = 32 * 1024}).isOk());
  }
  sendMessages(p, 4, 1 << 20, 21);
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.stalled = true}).isOk());
  const auto data = pattern(16 * kChunk, 22);
  std::vector<std::uint8_t> got(data.size());
  auto r = p.ba->irecv(got.data(), got.size(), 22).value();
  auto s = p.ab->isend(data.data(), data.size(), 22).value();
  // 900 steps of 1 ms: path 1 is done with its share long before; path 0 holds the rest.
  EXPECT_FALSE(p.net->runUntil([&] { return r->done(); }, 900)) << "path 0 is stalled: the message cannot be in yet";
  EXPECT_FALSE(p.ab->pathStats()[0].stalled) << "0.9 s is under a third of the 3 s limit";
  // Past a third of the limit (1 s) the tail goes again on the idle path.
  ASSERT_TRUE(p.net->runUntil([&] { return r->done() && s->done(); }, 300)) << "the tail never moved";
  ASSERT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_EQ(got, data);
  EXPECT_TRUE(p.ab->pathStats()[0].stalled);
  EXPECT_GE(p.ab->pathStats()[0].chunksResent, 1u);
}

TEST(MemoryChannelTest, PutsChunksWhereTheMeasuredRateIs) {
  Pair p = connect(2);
  p.net->setStepUs(1000);  // 64 KiB a step = 64 MB/s, 8 KiB = 8 MB/s
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.bytesPerStep = 64 * 1024}).isOk());
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 1, PathFaults{.bytesPerStep = 8 * 1024}).isOk());
  const auto last = sendMessages(p, 8, 1 << 20, 11);
  EXPECT_GE(last[0], 4 * last[1]) << "the fast path carried " << last[0] << " chunks, the slow one " << last[1];
  const auto stats = p.ab->pathStats();
  EXPECT_GT(stats[0].rateBytesPerSec, 3 * stats[1].rateBytesPerSec);
}

TEST(MemoryChannelTest, RoutingWeightsShiftChunksBetweenEqualPaths) {
  Pair p = connect(2);
  p.net->setStepUs(1000);
  for (std::size_t path = 0; path < 2; ++path) {
    ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, path, PathFaults{.bytesPerStep = 32 * 1024}).isOk());
  }
  const double toPath1[] = {0.125, 1.0};
  p.ab->setPathWeights(toPath1);
  auto last = sendMessages(p, 6, 1 << 20, 12);
  EXPECT_GE(last[1], 3 * last[0]) << "weighted 8:1 toward path 1: " << last[0] << " vs " << last[1];
  // Back to neutral: path 0 wins its share back within a few messages.
  const double neutral[] = {1.0, 1.0};
  p.ab->setPathWeights(neutral);
  last = sendMessages(p, 6, 1 << 20, 13);
  const double share0 = static_cast<double>(last[0]) / static_cast<double>(last[0] + last[1]);
  EXPECT_GT(share0, 0.35) << "path 0 carried " << last[0] << " of " << last[0] + last[1] << " chunks";
}

// Weight 0 is routing saying the path is down (its probes go unanswered): it carries nothing
// while another path is usable, and is used again, not left to hang the send, when none is.
TEST(MemoryChannelTest, ADownWeightedPathCarriesNothingUnlessItIsTheLastOne) {
  Pair p = connect(2);
  const double path0Down[] = {0.0, 1.0};
  p.ab->setPathWeights(path0Down);
  EXPECT_EQ(p.ab->pathStats()[0].weight, 0.0);
  auto last = sendMessages(p, 3, 64 * kChunk, 16);
  EXPECT_EQ(last[0], 0u) << "a down path carried chunks";
  EXPECT_EQ(last[1], 64u);
  ASSERT_TRUE(p.a->cutPath(kSession, 1, 1).isOk());
  last = sendMessages(p, 2, 64 * kChunk, 17);
  EXPECT_EQ(last[0], 64u) << "the only path left must carry the message, down or not";
  const double raised[] = {1.0, 1.0};
  p.ab->setPathWeights(raised);
  EXPECT_EQ(p.ab->pathStats()[0].weight, 1.0);
}

TEST(MemoryChannelTest, APathWhoseRateRecoversWinsItsShareBack) {
  Pair p = connect(2);
  p.net->setStepUs(1000);
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 0, PathFaults{.bytesPerStep = 32 * 1024}).isOk());
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 1, PathFaults{.bytesPerStep = 2 * 1024}).isOk());  // congested
  auto last = sendMessages(p, 6, 1 << 20, 14);
  EXPECT_GE(last[0], 4 * last[1]);
  ASSERT_TRUE(p.net->setFaults(kSession, 0, 1, 1, PathFaults{.bytesPerStep = 32 * 1024}).isOk());  // clear again
  last = sendMessages(p, 10, 1 << 20, 15);
  const double share1 = static_cast<double>(last[1]) / static_cast<double>(last[0] + last[1]);
  EXPECT_GT(share1, 0.3) << "the recovered path carried " << last[1] << " of " << last[0] + last[1] << " chunks";
}

TEST(MemoryChannelTest, LosingEveryPathFailsOutstandingRequestsWithAPeerError) {
  Pair p = connect(2);
  std::vector<std::uint8_t> buf(kChunk);
  auto r = p.ba->irecv(buf.data(), buf.size(), 8).value();
  ASSERT_TRUE(p.a->cutPath(kSession, 1, 0).isOk());
  EXPECT_TRUE(p.ba->health().isOk());
  ASSERT_TRUE(p.a->cutPath(kSession, 1, 1).isOk());
  ASSERT_TRUE(r->done());
  EXPECT_EQ(r->status().code(), StatusCode::kPeerError) << r->status().toString();
  EXPECT_EQ(p.ba->health().code(), StatusCode::kPeerError);
  EXPECT_EQ(p.ab->isend(buf.data(), buf.size(), 8).status().code(), StatusCode::kPeerError);
}

TEST(MemoryChannelTest, ClosingDeliversEagerSendsFirstAndEndsThePeerQuietly) {
  Pair p = connect(1);
  const auto small = pattern(200, 7);
  std::vector<std::uint8_t> got(small.size());
  auto r = p.ba->irecv(got.data(), got.size(), 6).value();
  auto s = p.ab->isend(small.data(), small.size(), 6).value();
  EXPECT_TRUE(s->done()) << "small sends complete at once (eager)";
  ASSERT_TRUE(p.a->closeChannel(kSession, 1).isOk());
  ASSERT_TRUE(r->done()) << "the close delivered the eager send first";
  EXPECT_TRUE(r->status().isOk()) << r->status().toString();
  EXPECT_EQ(got, small);
  EXPECT_EQ(p.ab->isend(small.data(), small.size(), 6).status().code(), StatusCode::kCommError);
  EXPECT_FALSE(p.ba->health().isOk()) << "the peer's channel ends with its last path";
  EXPECT_EQ(p.a->closeChannel(kSession, 1).code(), StatusCode::kInvalidArgument) << "closed twice";
}

TEST(MemoryDeviceTest, AcceptsWhicheverPeerOpenedThroughTheInterface) {
  DeviceOptions o;
  o.kind = DeviceKind::kMemory;
  o.localAddresses = {"x", "y"};
  auto listener = Device::create(o);
  auto dialer = Device::create(o);
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  ASSERT_TRUE(dialer.isOk());
  EXPECT_EQ((*listener)->kind(), DeviceKind::kMemory);
  EXPECT_EQ((*listener)->acceptChannel(77).status().code(), StatusCode::kAgain);
  auto out = (*dialer)->openChannel({77, 42, 0, true, (*listener)->endpoint()}, kSoon);
  ASSERT_TRUE(out.isOk()) << out.status().toString();
  auto in = (*listener)->acceptChannel(77);
  ASSERT_TRUE(in.isOk()) << in.status().toString();
  EXPECT_EQ(in->first, 42);
  EXPECT_EQ(in->second->pathStats().size(), 2u);
  // Waiting on the request drives the shared network from this thread.
  std::vector<std::uint8_t> data = pattern(3 * 64 * 1024, 8), got(data.size());
  auto r = in->second->irecv(got.data(), got.size(), 0).value();
  auto s = out.value()->isend(data.data(), data.size(), 0).value();
  ASSERT_TRUE(r->wait(Clock::now() + std::chrono::seconds(30)).isOk());
  ASSERT_TRUE(s->wait(Clock::now() + std::chrono::seconds(30)).isOk());
  EXPECT_EQ(got, data);
  EXPECT_FALSE((*dialer)->openChannel({77, 42, 42, true, (*listener)->endpoint()}, kSoon).isOk()) << "to oneself";
  EXPECT_FALSE((*dialer)->openChannel({77, 1, 0, true, {1, 2, 3}}, kSoon).isOk()) << "garbage endpoint";
  EXPECT_EQ((*dialer)->openRelay({77, 42, 0, 5, (*listener)->endpoint(), 0}, kSoon).code(),
            StatusCode::kInvalidArgument);
}

TEST(MemoryDeviceTest, RegistersThroughItsCache) {
  Network net;
  DeviceOptions o;
  o.kind = DeviceKind::kMemory;
  auto dev = net.createDevice(o).value();
  EXPECT_TRUE(dev->caps().needsRegistration);
  std::vector<std::uint8_t> buf(1 << 16);
  auto whole = dev->registerMemory(buf.data(), buf.size());
  ASSERT_TRUE(whole.isOk());
  auto part = dev->registerMemory(buf.data() + 100, 1000);
  ASSERT_TRUE(part.isOk());
  EXPECT_EQ(part->key, whole->key) << "a sub-range reuses the registration";
  EXPECT_EQ(dev->registrations(), 1u);
  EXPECT_TRUE(dev->deregisterMemory(*part).isOk());
  EXPECT_TRUE(dev->deregisterMemory(*whole).isOk());
  EXPECT_EQ(dev->deregisterMemory(*whole).code(), StatusCode::kInvalidArgument) << "released twice";
  EXPECT_FALSE(dev->registerMemory(buf.data(), 0).isOk()) << "an empty range";
}

TEST(RegistrationCacheTest, HitsCoverSubRangesAndTheLastReleaseDeregisters) {
  std::vector<std::uint64_t> registered, deregistered;
  std::uint64_t next = 10;
  {
    RegistrationCache cache(
        [&](std::uintptr_t, std::size_t) -> Result<std::uint64_t> {
          registered.push_back(next);
          return next++;
        },
        [&](std::uint64_t key) { deregistered.push_back(key); });
    std::vector<std::uint8_t> buf(4096);
    auto a = cache.acquire(buf.data(), 4096).value();
    auto b = cache.acquire(buf.data() + 1, 100).value();
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(cache.registrations(), 1u);
    // A larger range at the same start is not covered: a new registration beside the old.
    std::vector<std::uint8_t> big(8192);
    auto c = cache.acquire(big.data(), 100).value();
    auto d = cache.acquire(big.data(), 8192).value();
    EXPECT_NE(c.key, d.key);
    EXPECT_EQ(cache.registrations(), 3u);
    const auto base = reinterpret_cast<std::uintptr_t>(buf.data());
    EXPECT_NE(cache.find(a.key, base + 4000, 96), nullptr);
    EXPECT_EQ(cache.find(a.key, base + 4000, 97), nullptr) << "past the end";
    EXPECT_EQ(cache.find(a.key, base - 1, 1), nullptr) << "before the start";
    EXPECT_EQ(cache.find(999, base, 1), nullptr) << "unknown key";
    ASSERT_NE(cache.covering(buf.data() + 10, 4086), nullptr);
    EXPECT_EQ(cache.covering(buf.data() + 10, 4086)->key, a.key);
    EXPECT_EQ(cache.covering(buf.data() + 10, 4087), nullptr) << "past the end";
    EXPECT_EQ(cache.covering(buf.data(), 0), nullptr) << "an empty range";
    EXPECT_EQ(cache.registrations(), 3u) << "covering registers nothing";
    EXPECT_TRUE(cache.release(a.key).isOk());
    EXPECT_TRUE(deregistered.empty()) << "b still uses it";
    EXPECT_TRUE(cache.release(b.key).isOk());
    EXPECT_EQ(deregistered, std::vector<std::uint64_t>{a.key});
    EXPECT_EQ(cache.covering(buf.data() + 10, 100), nullptr) << "covering took no share: released, it is gone";
    EXPECT_EQ(cache.release(a.key).code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(cache.acquire(reinterpret_cast<void*>(~std::uintptr_t{0} - 10), 100).isOk()) << "wraps";
  }
  EXPECT_EQ(deregistered.size(), 3u) << "the cache deregisters what is left when it goes";
}

}  // namespace
}  // namespace meridian::transport::memory
