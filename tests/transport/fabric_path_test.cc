// The multipath protocol over fabric paths: two ranks in one process, each with a rail per
// plane on a real libfabric provider (tcp;ofi_rxm on loopback, shm), the real engine on
// both sides, driven round by round by the test as a device's progress thread would; every
// test runs with sealed frames (encrypt, authenticate) and without. A tap (a third rail
// that both ranks address instead of each other on plane 0) plays the attacker on the path.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/metrics.h"
#include "tests/common/poll.h"
#include "tests/transport/test_pattern.h"
#include "transport/fabric/path.h"

namespace meridian::transport::fabric {
namespace {

using meridian::testing::pollUntil;

constexpr std::size_t kChunk = 64 * 1024;

struct Side {
  std::vector<std::unique_ptr<Rail>> rails;  // one per plane
  EngineChannel ch;
  std::vector<std::unique_ptr<FabricPath>> paths;
  Counter integrityFailures;
};

struct Param {
  const char* provider;
  WireSecurity security;
};

// The key of rank r's frames on plane p (the peer opens them with the same one).
DirectionKey testKey(int r, std::size_t p) {
  DirectionKey k;
  const auto bytes = pattern(k.key.size() + k.iv.size(), static_cast<std::uint32_t>(1000 + 10 * r + p));
  std::copy_n(bytes.begin(), k.key.size(), k.key.begin());
  std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(k.key.size()), k.iv.size(), k.iv.begin());
  return k;
}

// The attacker on plane 0: ranks address it instead of each other, and it forwards each
// frame by its tag (0x100 + p: rank 0 to rank 1, 0x200 + p: rank 1 to rank 0), after doing
// to frames from rank 0 what the test asks.
class Tap final : public RailOpHandler {
 public:
  enum class Attack { kNone, kFlipPayloadByte, kReplayFrame, kRenumberFrame, kFlipHeaderByte, kWrapNumber };

  Tap(const char* provider, std::size_t frameBytes, std::size_t prefixBytes)
      : frameBytes_(frameBytes), prefixBytes_(prefixBytes) {
    RailOptions o;
    o.provider = provider;
    if (o.provider != "shm") o.sourceAddress = "127.0.0.1";
    auto rail = Rail::open(o);
    if (!rail.isOk()) {
      status_ = rail.status();
      return;
    }
    rail_ = std::move(rail.value());
    arena_.resize((kSlots + 1) * frameBytes_);  // the last frame: a forged copy's
    spare_ = arena_.data() + kSlots * frameBytes_;
    auto m = rail_->registerMemory(arena_.data(), arena_.size());
    if (!m.isOk()) {
      status_ = m.status();
      return;
    }
    memory_ = m.value();
    for (std::size_t i = 0; i < kSlots; ++i) {
      slots_[i].buffer = arena_.data() + i * frameBytes_;
      for (auto* op : {&slots_[i].recv, &slots_[i].send, &slots_[i].again}) {
        op->handler = this;
        op->cookie = i;
      }
    }
  }
  ~Tap() override {
    if (rail_ && memory_.handle != 0) (void)rail_->releaseMemory(memory_.handle);
  }
  const Status& status() const { return status_; }
  Rail& rail() { return *rail_; }

  // Addresses rank 0's and rank 1's plane-0 rails and starts listening.
  Status attach(std::span<const std::uint8_t> rank0, std::span<const std::uint8_t> rank1) {
    auto a = rail_->addPeer(rank0);
    if (!a.isOk()) return a.status();
    auto b = rail_->addPeer(rank1);
    if (!b.isOk()) return b.status();
    peer_[0] = a.value();
    peer_[1] = b.value();
    for (std::size_t i = 0; i < kSlots; ++i) {
      if (Status st = postRecv(i); !st.isOk()) return st;
    }
    return Status();
  }
  // The attack on the `nth` (from 1) data frame from rank 0.
  void arm(Attack attack, int nth) {
    attack_ = attack;
    nth_ = nth;
  }
  int attacks() const { return attacks_; }
  int dataFramesFromRank0() const { return dataFrames_; }

  void progress() {
    if (!rail_) return;
    rail_->progress();
    // Sends the provider refused for now go again.
    for (std::size_t i = 0; i < kSlots; ++i) {
      Slot& s = slots_[i];
      for (int k = 0; k < 2; ++k) {
        if (s.waiting[k]) forward(i, k);
      }
    }
  }

  void onComplete(RailOp& op, const RailCompletion& c) override {
    Slot& s = slots_[op.cookie];
    if (!c.status.isOk()) {
      if (!c.canceled) status_ = c.status;
      return;
    }
    if (&op == &s.recv) {
      const int from = (c.tag >> 8) == 1 ? 0 : 1;
      s.to = 1 - from;
      s.tag = c.tag;
      s.bytes = c.bytes;
      s.copies = 1;
      if (from == 0 && c.bytes > prefixBytes_ && ++dataFrames_ == nth_) tamper(s);
      for (int k = 0; k < s.copies; ++k) {
        s.waiting[k] = true;
        forward(op.cookie, k);
      }
      return;
    }
    if (--s.inFlight == 0 && !s.waiting[0] && !s.waiting[1]) (void)postRecv(op.cookie);
  }

 private:
  static constexpr std::size_t kSlots = 32;
  struct Slot {
    std::uint8_t* buffer = nullptr;
    RailOp recv, send, again;
    std::uint64_t tag = 0;
    std::size_t bytes = 0;
    int to = 0;
    int copies = 1;
    int inFlight = 0;
    bool waiting[2] = {false, false};
  };

  void tamper(Slot& s) {
    ++attacks_;
    switch (attack_) {
      case Attack::kNone: break;
      case Attack::kFlipPayloadByte: s.buffer[s.bytes - 1] ^= 0x40; break;
      case Attack::kFlipHeaderByte: s.buffer[prefixBytes_ - kAeadTagBytes * 2 - 1] ^= 0x01; break;
      case Attack::kRenumberFrame: s.buffer[0] ^= 0x01; break;
      case Attack::kReplayFrame: s.copies = 2; break;
      case Attack::kWrapNumber:  // the replay comes back as number + 2^63: the same records
        std::memcpy(spare_, s.buffer, s.bytes);
        spare_[7] ^= 0x80;
        s.copies = 2;
        break;
    }
  }
  Status postRecv(std::size_t i) {
    Status st = rail_->postRecv(0, ~0ull, slots_[i].buffer, frameBytes_, memory_.desc, slots_[i].recv);
    if (!st.isOk() && status_.isOk()) status_ = st;
    return st;
  }
  void forward(std::size_t i, int k) {
    Slot& s = slots_[i];
    const iovec iov[1] = {{s.buffer, s.bytes}};
    void* const desc[1] = {memory_.desc};
    const iovec spare[1] = {{spare_, s.bytes}};
    Status st = rail_->postSend(peer_[s.to], s.tag, k == 1 && attack_ == Attack::kWrapNumber ? spare : iov, desc,
                                k == 0 ? s.send : s.again);
    if (st.code() == StatusCode::kAgain) return;
    s.waiting[k] = false;
    if (!st.isOk()) {
      status_ = st;
      return;
    }
    ++s.inFlight;
  }

  std::size_t frameBytes_, prefixBytes_;
  Status status_;
  std::unique_ptr<Rail> rail_;
  std::vector<std::uint8_t> arena_;
  std::uint8_t* spare_ = nullptr;
  RailMemory memory_;
  RailPeer peer_[2] = {0, 0};
  Slot slots_[kSlots];
  Attack attack_ = Attack::kNone;
  int nth_ = 0;
  int attacks_ = 0;
  int dataFrames_ = 0;
};

class FabricPathTest : public ::testing::TestWithParam<Param> {
 protected:
  const char* provider() const { return GetParam().provider; }
  WireSecurity security() const { return GetParam().security; }
  bool sealing() const { return security() != WireSecurity::kOff; }

  // Two ranks with `planes` fabric paths between them; with `tapped`, plane 0 runs through
  // a tap.
  void connect(std::size_t planes, std::int64_t stallUs = 3'000'000, bool tapped = false) {
    static int pairs = 0;
    ++pairs;
    for (int r = 0; r < 2; ++r) {
      for (std::size_t p = 0; p < planes; ++p) {
        RailOptions o;
        o.provider = provider();
        if (o.provider != "shm") o.sourceAddress = "127.0.0.1";
        auto rail = Rail::open(o);
        ASSERT_TRUE(rail.isOk()) << rail.status().toString();
        side_[r].rails.push_back(std::move(rail.value()));
      }
    }
    if (tapped) {
      const std::size_t prefix = sealing() ? kSealedFramePrefixBytes : kFrameHeaderBytes;
      tap_ = std::make_unique<Tap>(provider(), prefix + kChunk, prefix);
      ASSERT_TRUE(tap_->status().isOk()) << tap_->status().toString();
      ASSERT_TRUE(tap_->attach(side_[0].rails[0]->name(), side_[1].rails[0]->name()).isOk());
    }
    for (int r = 0; r < 2; ++r) {
      Side& me = side_[r];
      Side& peer = side_[1 - r];
      MultipathConfig cfg;
      cfg.chunkBytes = kChunk;
      cfg.pathStallUs = stallUs;
      cfg.deviceName = "fabric" + std::to_string(pairs) + "-" + std::to_string(r);
      std::vector<PathEndpoints> ends;
      for (std::size_t p = 0; p < planes; ++p) {
        ends.push_back({me.rails[p]->describeName(me.rails[p]->name()), peer.rails[p]->describeName(peer.rails[p]->name())});
      }
      me.ch = makeMultipathChannel(1 - r, ends, cfg, [] {}, nullptr);
      for (std::size_t p = 0; p < planes; ++p) {
        auto addr = me.rails[p]->addPeer(tapped && p == 0 ? tap_->rail().name() : peer.rails[p]->name());
        ASSERT_TRUE(addr.isOk()) << addr.status().toString();
        // Frames from rank r on plane p carry tag 0x100*(r+1) + p.
        const std::uint64_t out = 0x100u * static_cast<std::uint64_t>(r + 1) + p;
        const std::uint64_t in = 0x100u * static_cast<std::uint64_t>(2 - r) + p;
        FabricPathConfig pc;
        pc.chunkBytes = kChunk;
        pc.sendSlots = 4;
        pc.recvSlots = 4;
        pc.security = security();
        pc.sendKey = testKey(r, p);
        pc.recvKey = testKey(1 - r, p);
        pc.integrityFailures = &me.integrityFailures;
        auto path = FabricPath::create(*me.rails[p], addr.value(), out, in, *me.ch.engine, p, pc);
        ASSERT_TRUE(path.isOk()) << path.status().toString();
        me.paths.push_back(std::move(path.value()));
      }
    }
  }

  void TearDown() override {
    for (auto& s : side_) {
      s.paths.clear();
      s.ch = {};
      s.rails.clear();
    }
    tap_.reset();
  }

  // One round of both ranks' progress, as a device's progress thread runs it.
  void step() {
    const std::int64_t now = nowUs();
    for (auto& s : side_) {
      ChannelEngine& e = *s.ch.engine;
      if (e.failed()) continue;
      e.drainPosted();
      e.checkStalls(now);
      e.schedule(now);
      for (auto& p : s.paths) {
        if (p) p->pump(now);
      }
      for (auto& r : s.rails) {
        if (r) r->progress();
      }
    }
    if (tap_) tap_->progress();
  }

  bool runUntil(const std::function<bool()>& done) {
    return pollUntil(
        [&] {
          step();
          return done();
        },
        std::chrono::seconds(30), std::chrono::milliseconds(0));
  }

  // Sends `data` from rank `from` with `tag` into `got` at the other rank; true when both
  // requests ended.
  bool transfer(int from, const std::vector<std::uint8_t>& data, std::vector<std::uint8_t>& got, std::uint64_t tag,
                Status* sendStatus = nullptr, Status* recvStatus = nullptr) {
    auto r = side_[1 - from].ch.channel->irecv(got.data(), got.size(), tag);
    auto s = side_[from].ch.channel->isend(data.data(), data.size(), tag);
    if (!r.isOk() || !s.isOk()) return false;
    const bool ok = runUntil([&] { return r.value()->done() && s.value()->done(); });
    if (sendStatus != nullptr) *sendStatus = s.value()->status();
    if (recvStatus != nullptr) *recvStatus = r.value()->status();
    return ok;
  }

  Side side_[2];
  std::unique_ptr<Tap> tap_;
};

TEST_P(FabricPathTest, MessagesOfEverySizeArriveByteExactBothWays) {
  ASSERT_NO_FATAL_FAILURE(connect(2));
  const std::size_t sizes[] = {0, 1, 4095, kChunk, kChunk + 1, (1 << 20) + 3, 8 << 20};
  std::uint32_t seed = 1;
  for (std::size_t n : sizes) {
    for (int from = 0; from < 2; ++from) {
      const auto data = pattern(n, seed++);
      std::vector<std::uint8_t> got(n);
      Status s, r;
      ASSERT_TRUE(transfer(from, data, got, 7, &s, &r)) << n << " bytes from rank " << from << " never arrived";
      ASSERT_TRUE(s.isOk()) << s.toString();
      ASSERT_TRUE(r.isOk()) << r.toString();
      EXPECT_EQ(got, data) << n << " bytes from rank " << from;
    }
  }
  for (int r = 0; r < 2; ++r) {
    for (const auto& ps : side_[r].ch.channel->pathStats()) {
      EXPECT_GT(ps.chunksSent, 0u) << "rank " << r << ": path " << ps.localAddress << " carried nothing";
    }
  }
}

TEST_P(FabricPathTest, RegisteredMemoryGoesOutInPlaceAndTheRestIsCopied) {
  ASSERT_NO_FATAL_FAILURE(connect(2));
  auto inPlace = [&] {
    std::uint64_t b = 0;
    for (const auto& p : side_[0].paths) b += p->sentInPlaceBytes();
    return b;
  };
  // Beyond eager: the engine sends from the caller's buffer.
  const auto data = pattern((2 << 20) + 5, 11);
  std::vector<std::uint8_t> got(data.size());
  ASSERT_TRUE(transfer(0, data, got, 3)) << "the unregistered message never arrived";
  EXPECT_EQ(got, data);
  EXPECT_EQ(inPlace(), 0u) << "memory nobody registered went out in place";

  std::vector<RailMemory> regs;
  for (auto& rail : side_[0].rails) {
    auto m = rail->registerMemory(data.data(), data.size());
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    regs.push_back(m.value());
  }
  if (security() == WireSecurity::kEncrypt) {
    // Encrypting is the copy: registered memory goes through a slot like any other.
    std::fill(got.begin(), got.end(), 0);
    ASSERT_TRUE(transfer(0, data, got, 3)) << "the registered message never arrived";
    EXPECT_EQ(got, data);
    EXPECT_EQ(inPlace(), 0u) << "an encrypted chunk went out in place (in clear)";
    for (std::size_t i = 0; i < regs.size(); ++i) ASSERT_TRUE(side_[0].rails[i]->releaseMemory(regs[i].handle).isOk());
    return;
  }
  if (side_[0].rails[0]->info().iovLimit < 2) {
    GTEST_SKIP() << provider() << " gathers no two pieces in one send (iov_limit "
                 << side_[0].rails[0]->info().iovLimit << "): every chunk is copied";
  }
  std::fill(got.begin(), got.end(), 0);
  ASSERT_TRUE(transfer(0, data, got, 3)) << "the registered message never arrived";
  EXPECT_EQ(got, data) << "a chunk sent in place arrived wrong";
  EXPECT_EQ(inPlace(), data.size()) << "every chunk of registered memory goes out in place";
  // A sub-range of the registration is covered too; released, the memory is copied again.
  const std::uint64_t before = inPlace();
  std::vector<std::uint8_t> part(1 << 20);
  auto r = side_[1].ch.channel->irecv(part.data(), part.size(), 4);
  auto snd = side_[0].ch.channel->isend(data.data() + 4096, part.size(), 4);
  ASSERT_TRUE(r.isOk() && snd.isOk());
  ASSERT_TRUE(runUntil([&] { return r.value()->done() && snd.value()->done(); }));
  EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + 4096));
  EXPECT_EQ(inPlace() - before, part.size());
  for (std::size_t i = 0; i < regs.size(); ++i) ASSERT_TRUE(side_[0].rails[i]->releaseMemory(regs[i].handle).isOk());
  const std::uint64_t released = inPlace();
  ASSERT_TRUE(transfer(0, data, got, 3));
  EXPECT_EQ(got, data);
  EXPECT_EQ(inPlace(), released) << "released memory went out in place";
}

TEST_P(FabricPathTest, ManyInFlightArriveInPostingOrderPerTag) {
  ASSERT_NO_FATAL_FAILURE(connect(2));
  constexpr int kTags = 4, kPerTag = 12;
  std::vector<std::vector<std::uint8_t>> sent, got;
  std::vector<RequestPtr> reqs;
  for (int i = 0; i < kTags * kPerTag; ++i) {
    const std::size_t n = 1000 + static_cast<std::size_t>(i) * 7919 % (3 * kChunk);
    sent.push_back(pattern(n, 100 + static_cast<std::uint32_t>(i)));
    got.emplace_back(n);
  }
  for (int i = 0; i < kTags * kPerTag; ++i) {
    auto r = side_[1].ch.channel->irecv(got[i].data(), got[i].size(), static_cast<std::uint64_t>(i % kTags));
    ASSERT_TRUE(r.isOk());
    reqs.push_back(r.value());
  }
  for (int i = 0; i < kTags * kPerTag; ++i) {
    auto s = side_[0].ch.channel->isend(sent[i].data(), sent[i].size(), static_cast<std::uint64_t>(i % kTags));
    ASSERT_TRUE(s.isOk());
    reqs.push_back(s.value());
  }
  ASSERT_TRUE(runUntil([&] {
    return std::all_of(reqs.begin(), reqs.end(), [](const RequestPtr& r) { return r->done(); });
  }));
  for (const auto& r : reqs) EXPECT_TRUE(r->status().isOk()) << r->status().toString();
  for (int i = 0; i < kTags * kPerTag; ++i) EXPECT_EQ(got[i], sent[i]) << "message " << i;
}

TEST_P(FabricPathTest, AReceiveLargerThanTheSendGetsTheSentBytesAndASmallerOneFails) {
  ASSERT_NO_FATAL_FAILURE(connect(1));
  const auto data = pattern(3 * kChunk + 5, 9);
  std::vector<std::uint8_t> roomy(data.size() + 4096);
  auto r = side_[1].ch.channel->irecv(roomy.data(), roomy.size(), 3);
  auto s = side_[0].ch.channel->isend(data.data(), data.size(), 3);
  ASSERT_TRUE(r.isOk() && s.isOk());
  ASSERT_TRUE(runUntil([&] { return r.value()->done() && s.value()->done(); }));
  EXPECT_EQ(r.value()->bytes(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), roomy.begin()));

  std::vector<std::uint8_t> tight(data.size() - 1);
  Status sendStatus, recvStatus;
  transfer(0, data, tight, 4, &sendStatus, &recvStatus);
  EXPECT_EQ(recvStatus.code(), StatusCode::kInvalidArgument) << recvStatus.toString();
}

// Plane 0 at the receiver goes away in the middle of a message: the sender's chunks on it
// go unacknowledged (or fail), the path stalls or fails, and everything moves to plane 1.
// tcp;ofi_rxm: the receiver's endpoint closes (its connections reset). shm: only the path
// goes (its receives are taken back): closing an shm endpoint unmaps the region another
// endpoint of the same process still reads (libfabric 1.17 then crashes in its progress),
// which no two ranks in two processes share.
TEST_P(FabricPathTest, APathWhoseEndpointClosesMidMessageLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(connect(2, /*stallUs=*/300'000));
  const auto data = pattern(16 << 20, 11);
  std::vector<std::uint8_t> got(data.size());
  auto r = side_[1].ch.channel->irecv(got.data(), got.size(), 5);
  auto s = side_[0].ch.channel->isend(data.data(), data.size(), 5);
  ASSERT_TRUE(r.isOk() && s.isOk());
  ASSERT_TRUE(runUntil([&] { return side_[1].ch.channel->pathStats()[0].bytesReceived > 0; }));
  ASSERT_FALSE(r.value()->done()) << "the message finished before the cut: nothing tested";
  side_[1].paths[0]->fail(pathError("endpoint closed"));
  side_[1].paths[0].reset();
  if (std::string(provider()) != "shm") side_[1].rails[0].reset();
  ASSERT_TRUE(runUntil([&] { return r.value()->done() && s.value()->done(); }));
  ASSERT_TRUE(r.value()->status().isOk()) << r.value()->status().toString();
  ASSERT_TRUE(s.value()->status().isOk()) << s.value()->status().toString();
  EXPECT_EQ(got, data);
  const auto stats = side_[0].ch.channel->pathStats();
  EXPECT_TRUE(stats[0].stalled || !stats[0].alive) << "the sender still trusts the cut path";
  EXPECT_GT(stats[1].chunksSent, 0u);
  EXPECT_TRUE(side_[0].ch.channel->health().isOk());
}

// An attacker on plane 0 changes, replays or renumbers one of rank 0's data frames: sealed,
// the receiver catches it (the path fails, saying "integrity", and the failure is counted)
// and the message still arrives byte-exact over plane 1; without sealing the change goes
// through unseen (which proves the tap reaches the data).
class TappedFabricPathTest : public FabricPathTest {
 protected:
  void attack(Tap::Attack what) {
    // The stall limit: well above what a loaded machine takes to set up the provider's
    // connections through the tap (1.9 s seen under the full suite), so that no chunk moves
    // to plane 1 before the tampered frame; after it, the sender learns of the dropped path
    // only from that limit (a fabric path has no end of stream to close).
    ASSERT_NO_FATAL_FAILURE(connect(2, /*stallUs=*/4'000'000, /*tapped=*/true));
    // First a message both ways untouched, so every connection under the tap is up and no
    // chunk stalls on the way (which would send it again on plane 1 and finish the message
    // before the tampered frame arrives).
    for (int from = 0; from < 2; ++from) {
      const auto warm = pattern(4 * kChunk, 20);
      std::vector<std::uint8_t> got(warm.size());
      ASSERT_TRUE(transfer(from, warm, got, 6));
      ASSERT_EQ(got, warm);
    }
    ASSERT_GT(tap_->dataFramesFromRank0(), 0) << "plane 0 does not run through the tap";
    tap_->arm(what, tap_->dataFramesFromRank0() + 3);
    const auto data = pattern(4 << 20, 21);
    std::vector<std::uint8_t> got(data.size());
    Status s, r;
    ASSERT_TRUE(transfer(0, data, got, 6, &s, &r)) << "the message never arrived";
    ASSERT_TRUE(tap_->status().isOk()) << tap_->status().toString();
    ASSERT_EQ(tap_->attacks(), 1) << "the tap saw " << tap_->dataFramesFromRank0() << " data frames: nothing tested";
    if (!sealing()) {
      ASSERT_TRUE(r.isOk()) << r.toString();
      EXPECT_NE(got, data) << "the changed byte did not reach the receiver: the tap tests nothing";
      EXPECT_EQ(side_[1].integrityFailures.value(), 0u);
      return;
    }
    ASSERT_TRUE(s.isOk()) << s.toString();
    ASSERT_TRUE(r.isOk()) << r.toString();
    EXPECT_EQ(got, data) << "a tampered frame was taken in";
    EXPECT_EQ(side_[1].integrityFailures.value(), 1u) << "the receiver did not count the tampered frame";
    EXPECT_FALSE(side_[1].ch.channel->pathStats()[0].alive) << "the tapped path still carries data";
    EXPECT_TRUE(side_[1].ch.channel->pathStats()[1].alive);
    EXPECT_TRUE(side_[0].ch.channel->health().isOk());
    // The channel goes on over plane 1.
    const auto more = pattern(1 << 20, 22);
    std::vector<std::uint8_t> again(more.size());
    ASSERT_TRUE(transfer(0, more, again, 6));
    EXPECT_EQ(again, more);
  }
};

TEST_P(TappedFabricPathTest, AChangedPayloadByteIsCaught) { attack(Tap::Attack::kFlipPayloadByte); }

TEST_P(TappedFabricPathTest, AReplayedFrameIsCaught) {
  if (!sealing()) GTEST_SKIP() << "without sealing frames carry no number or tag to attack";
  attack(Tap::Attack::kReplayFrame);
}

TEST_P(TappedFabricPathTest, ARenumberedFrameIsCaught) {
  if (!sealing()) GTEST_SKIP() << "without sealing frames carry no number or tag to attack";
  attack(Tap::Attack::kRenumberFrame);
}

TEST_P(TappedFabricPathTest, AChangedHeaderIsCaught) {
  if (!sealing()) GTEST_SKIP() << "without sealing frames carry no number or tag to attack";
  attack(Tap::Attack::kFlipHeaderByte);
}

TEST_P(TappedFabricPathTest, AReplayWhoseNumberWrapsIsCaught) {
  if (!sealing()) GTEST_SKIP() << "without sealing frames carry no number or tag to attack";
  attack(Tap::Attack::kWrapNumber);
}

std::string paramName(const ::testing::TestParamInfo<Param>& p) {
  const std::string provider = std::string(p.param.provider) == "shm" ? "shm" : "tcp_rxm";
  return provider + "_" + std::string(wireSecurityName(p.param.security));
}

// tcp;ofi_rxm in every mode; shm sealed (and in clear, untapped).
const Param kTcpParams[] = {{"tcp;ofi_rxm", WireSecurity::kEncrypt},
                            {"tcp;ofi_rxm", WireSecurity::kAuthenticate},
                            {"tcp;ofi_rxm", WireSecurity::kOff}};
INSTANTIATE_TEST_SUITE_P(Providers, FabricPathTest,
                         ::testing::Values(kTcpParams[0], kTcpParams[1], kTcpParams[2], Param{"shm", WireSecurity::kEncrypt},
                                           Param{"shm", WireSecurity::kOff}),
                         paramName);
INSTANTIATE_TEST_SUITE_P(Providers, TappedFabricPathTest,
                         ::testing::Values(kTcpParams[0], kTcpParams[1], kTcpParams[2], Param{"shm", WireSecurity::kEncrypt}),
                         paramName);

}  // namespace
}  // namespace meridian::transport::fabric
