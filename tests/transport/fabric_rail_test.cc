// Rails over the libfabric providers this machine really has: tcp;ofi_rxm on loopback and
// shm. Both run with the strictest registration mode they accept, so the registration,
// descriptor and key code that verbs and EFA need runs here too. Nothing is mocked.
#include <gtest/gtest.h>

#include <sys/uio.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/common/poll.h"
#include "tests/transport/test_pattern.h"
#include "transport/fabric/rail.h"

namespace meridian::transport::fabric {
namespace {

using meridian::testing::pollUntil;
using std::chrono::seconds;

struct Recorder : RailOpHandler {
  std::vector<std::pair<RailOp*, RailCompletion>> done;
  void onComplete(RailOp& op, const RailCompletion& c) override { done.emplace_back(&op, c); }
  const RailCompletion* of(const RailOp& op) const {
    for (const auto& [o, c] : done) {
      if (o == &op) return &c;
    }
    return nullptr;
  }
};

struct Setting {
  const char* provider;
  const char* source;
};

class RailTest : public ::testing::TestWithParam<Setting> {
 protected:
  void SetUp() override {
    RailOptions o;
    o.provider = GetParam().provider;
    o.sourceAddress = GetParam().source;
    auto a = Rail::open(o);
    ASSERT_TRUE(a.isOk()) << a.status().toString();
    auto b = Rail::open(o);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    a_ = std::move(a.value());
    b_ = std::move(b.value());
    auto peer = a_->addPeer(b_->name());
    ASSERT_TRUE(peer.isOk()) << peer.status().toString();
    bFromA_ = peer.value();
  }

  // Progresses both rails until `r` holds `count` completions (10 s at most).
  bool pump(std::size_t count) {
    return pollUntil(
        [&] {
          a_->progress();
          b_->progress();
          return rec_.done.size() >= count;
        },
        seconds(10), std::chrono::milliseconds(0));
  }

  // Posts a send from a to b, progressing while the provider says "again" (it connects on
  // demand: the first send to a peer waits for that).
  Status send(std::uint64_t tag, std::span<const iovec> iov, std::span<void* const> desc, RailOp& op) {
    Status st;
    pollUntil(
        [&] {
          st = a_->postSend(bFromA_, tag, iov, desc, op);
          if (st.code() != StatusCode::kAgain) return true;
          a_->progress();
          b_->progress();
          return false;
        },
        seconds(10), std::chrono::milliseconds(0));
    return st;
  }

  std::unique_ptr<Rail> a_, b_;
  RailPeer bFromA_ = 0;
  Recorder rec_;
};

TEST_P(RailTest, OpensWithTheStrictestRegistrationModeAndNamesItself) {
  const RailInfo& i = a_->info();
  EXPECT_EQ(i.provider, GetParam().provider);
  EXPECT_GE(i.tagBits, kMinTagBits);
  EXPECT_GE(i.iovLimit, 2u) << "a frame goes as header + payload";
  EXPECT_FALSE(a_->name().empty());
  EXPECT_NE(a_->name(), b_->name());
  EXPECT_NE(a_->describe().find(i.provider), std::string::npos) << a_->describe();
  EXPECT_TRUE(a_->failure().isOk());
  if (std::string(GetParam().source) == "127.0.0.1") {
    EXPECT_NE(a_->describeName(a_->name()).find("127.0.0.1"), std::string::npos) << a_->describeName(a_->name());
  }
  std::printf("[ fabric   ] %s\n", a_->describe().c_str());
}

TEST_P(RailTest, MovesHeaderAndPayloadOfEverySizeByteExact) {
  const std::vector<std::size_t> sizes{0, 1, 63, 64, 65, 4095, 4096, 4097, 65536, 1 << 20, 8 << 20};
  const std::size_t biggest = sizes.back();
  std::vector<std::uint8_t> header(64), in(64 + biggest);
  auto hdrMem = a_->registerMemory(header.data(), header.size());
  auto inMem = b_->registerMemory(in.data(), in.size());
  ASSERT_TRUE(hdrMem.isOk() && inMem.isOk());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t n = sizes[k];
    auto payload = pattern(std::max<std::size_t>(n, 1), static_cast<std::uint32_t>(k));
    std::memset(header.data(), static_cast<int>(k), header.size());
    auto payMem = a_->registerMemory(payload.data(), payload.size());
    ASSERT_TRUE(payMem.isOk()) << payMem.status().toString();
    RailOp recvOp{{}, &rec_, 1}, sendOp{{}, &rec_, 2};
    rec_.done.clear();
    const std::uint64_t tag = 0x100 + k;
    ASSERT_TRUE(b_->postRecv(tag, 0, in.data(), in.size(), inMem->desc, recvOp).isOk());
    const iovec iov[2] = {{header.data(), header.size()}, {payload.data(), n}};
    void* const desc[2] = {hdrMem->desc, payMem->desc};
    ASSERT_TRUE(send(tag, iov, desc, sendOp).isOk()) << n << " bytes";
    ASSERT_TRUE(pump(2)) << "message of " << n << " bytes never completed";
    const RailCompletion* r = rec_.of(recvOp);
    const RailCompletion* s = rec_.of(sendOp);
    ASSERT_NE(r, nullptr);
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(r->status.isOk()) << r->status.toString();
    EXPECT_TRUE(s->status.isOk()) << s->status.toString();
    EXPECT_EQ(r->tag, tag);
    ASSERT_EQ(r->bytes, 64 + n);
    EXPECT_EQ(0, std::memcmp(in.data(), header.data(), 64));
    EXPECT_EQ(0, std::memcmp(in.data() + 64, payload.data(), n)) << n << " bytes";
    ASSERT_TRUE(a_->releaseMemory(payMem->handle).isOk());
  }
  EXPECT_TRUE(a_->failure().isOk() && b_->failure().isOk());
}

TEST_P(RailTest, ReceivesMatchByTagNotByArrival) {
  auto x = pattern(3000, 1), y = pattern(5000, 2);
  std::vector<std::uint8_t> gotX(8192), gotY(8192);
  auto mx = a_->registerMemory(x.data(), x.size()), my = a_->registerMemory(y.data(), y.size());
  auto gx = b_->registerMemory(gotX.data(), gotX.size()), gy = b_->registerMemory(gotY.data(), gotY.size());
  ASSERT_TRUE(mx.isOk() && my.isOk() && gx.isOk() && gy.isOk());
  RailOp rx{{}, &rec_, 1}, ry{{}, &rec_, 2}, sx{{}, &rec_, 3}, sy{{}, &rec_, 4};
  // Tag bits 8 and up name the connection; the low byte is ignored by the receive of x.
  ASSERT_TRUE(b_->postRecv(0x7700, 0xff, gotX.data(), gotX.size(), gx->desc, rx).isOk());
  ASSERT_TRUE(b_->postRecv(0x8800, 0, gotY.data(), gotY.size(), gy->desc, ry).isOk());
  const iovec iy[1] = {{y.data(), y.size()}}, ix[1] = {{x.data(), x.size()}};
  void* const dy[1] = {my->desc};
  void* const dx[1] = {mx->desc};
  ASSERT_TRUE(send(0x8800, iy, dy, sy).isOk());
  ASSERT_TRUE(send(0x7742, ix, dx, sx).isOk());
  ASSERT_TRUE(pump(4));
  ASSERT_NE(rec_.of(rx), nullptr);
  ASSERT_NE(rec_.of(ry), nullptr);
  EXPECT_EQ(rec_.of(rx)->tag, 0x7742u);
  EXPECT_EQ(rec_.of(rx)->bytes, x.size());
  EXPECT_EQ(rec_.of(ry)->bytes, y.size());
  EXPECT_EQ(0, std::memcmp(gotX.data(), x.data(), x.size()));
  EXPECT_EQ(0, std::memcmp(gotY.data(), y.data(), y.size()));
}

TEST_P(RailTest, ARangeInsideARegisteredOneCostsNoRegistration) {
  std::vector<std::uint8_t> buf(1 << 20);
  const std::uint64_t before = a_->registrations();
  auto whole = a_->registerMemory(buf.data(), buf.size());
  ASSERT_TRUE(whole.isOk()) << whole.status().toString();
  auto part = a_->registerMemory(buf.data() + 4096, 4096);
  ASSERT_TRUE(part.isOk());
  EXPECT_EQ(a_->registrations(), before + 1);
  EXPECT_EQ(part->handle, whole->handle);
  EXPECT_EQ(part->desc, whole->desc);
  ASSERT_TRUE(a_->releaseMemory(part->handle).isOk());
  ASSERT_TRUE(a_->releaseMemory(whole->handle).isOk());
  EXPECT_FALSE(a_->releaseMemory(whole->handle).isOk()) << "released twice";
  // The keys of two live registrations differ (1.17's providers refuse a repeated key).
  auto r1 = a_->registerMemory(buf.data(), 4096);
  auto r2 = a_->registerMemory(buf.data() + 8192, 4096);
  ASSERT_TRUE(r1.isOk()) << r1.status().toString();
  ASSERT_TRUE(r2.isOk()) << r2.status().toString();
  EXPECT_NE(r1->handle, r2->handle);
  EXPECT_EQ(a_->registrations(), before + 3);
  EXPECT_FALSE(a_->registerMemory(buf.data(), 0).isOk()) << "an empty range";
}

TEST_P(RailTest, AReceiveTooSmallFailsThatReceiveNotTheRail) {
  // shm copies a message past its inline size (4 KiB) with process_vm_readv, and libfabric
  // 1.17's shm loops on that copy for ever when the receive is too small (seen here: the
  // same zero-length process_vm_readv, thousands a second). Fabric paths never get there:
  // their receives always hold the largest frame (fabric/path.h). Within the inline size shm
  // fails the receive as it should, and that is what is checked for it.
  const bool shm = std::string(GetParam().provider) == "shm";
  auto big = pattern(shm ? 3000 : 16384, 3);
  std::vector<std::uint8_t> small(shm ? 1024 : 4096);
  auto mb = a_->registerMemory(big.data(), big.size());
  auto ms = b_->registerMemory(small.data(), small.size());
  ASSERT_TRUE(mb.isOk() && ms.isOk());
  RailOp r{{}, &rec_, 1}, s{{}, &rec_, 2};
  ASSERT_TRUE(b_->postRecv(9, 0, small.data(), small.size(), ms->desc, r).isOk());
  const iovec iov[1] = {{big.data(), big.size()}};
  void* const desc[1] = {mb->desc};
  ASSERT_TRUE(send(9, iov, desc, s).isOk());
  ASSERT_TRUE(pollUntil(
      [&] {
        a_->progress();
        b_->progress();
        return rec_.of(r) != nullptr;
      },
      seconds(10), std::chrono::milliseconds(0)));
  EXPECT_FALSE(rec_.of(r)->status.isOk()) << big.size() << " bytes fit into " << small.size() << "?";
  EXPECT_EQ(rec_.of(r)->status.code(), StatusCode::kPathError);
  std::printf("[ fabric   ] %s\n", rec_.of(r)->status.message().c_str());
  EXPECT_TRUE(b_->failure().isOk()) << b_->failure().toString();
}

TEST_P(RailTest, CancelTakesAPostedReceiveBack) {
  std::vector<std::uint8_t> buf(4096);
  auto m = b_->registerMemory(buf.data(), buf.size());
  ASSERT_TRUE(m.isOk());
  RailOp r{{}, &rec_, 1};
  ASSERT_TRUE(b_->postRecv(0x55, 0, buf.data(), buf.size(), m->desc, r).isOk());
  ASSERT_TRUE(b_->cancel(r).isOk());
  ASSERT_TRUE(pump(1));
  ASSERT_NE(rec_.of(r), nullptr);
  EXPECT_TRUE(rec_.of(r)->canceled);
  EXPECT_FALSE(rec_.of(r)->status.isOk());
  EXPECT_TRUE(b_->failure().isOk());
}

TEST_P(RailTest, RefusesPeerNamesItCannotTake) {
  EXPECT_EQ(a_->addPeer({}).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::uint8_t> huge(kMaxRailNameBytes + 1, 'a');
  EXPECT_EQ(a_->addPeer(huge).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::uint8_t> garbage(a_->name().size(), 0xee);
  auto g = a_->addPeer(garbage);
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << "0xee bytes taken as a " << GetParam().provider << " address";
  EXPECT_NE(g.status().message().find(a_->info().provider), std::string::npos) << g.status().message();
  std::vector<std::uint8_t> cut(a_->name().begin(), a_->name().end() - 1);
  EXPECT_EQ(a_->addPeer(cut).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Providers, RailTest,
                         ::testing::Values(Setting{"tcp;ofi_rxm", "127.0.0.1"}, Setting{"shm", ""}),
                         [](const ::testing::TestParamInfo<Setting>& p) {
                           return std::string(p.param.provider) == "shm" ? std::string("shm") : std::string("tcp_rxm");
                         });

TEST(RailOpenTest, NamesTheCauseOfEveryBadSetting) {
  auto unknown = Rail::open({"nosuch", "", ""});
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("no provider 'nosuch'"), std::string::npos) << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("shm"), std::string::npos) << "lists what there is";

  auto malformed = Rail::open({"tcp ofi_rxm", "", ""});
  EXPECT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(malformed.status().message().find("not a provider name"), std::string::npos) << malformed.status().message();

  auto domain = Rail::open({"tcp;ofi_rxm", "nosuchnic0", "127.0.0.1"});
  ASSERT_FALSE(domain.isOk());
  EXPECT_NE(domain.status().message().find("no domain 'nosuchnic0'"), std::string::npos) << domain.status().message();
  EXPECT_NE(domain.status().message().find("lo"), std::string::npos) << "lists the domains there are";

  // An address no interface here has: nothing can listen there.
  auto away = Rail::open({"tcp;ofi_rxm", "", "198.18.250.1"});
  EXPECT_FALSE(away.isOk()) << "listened on an address this host does not have";
}

TEST(RailOpenTest, ListsTheProvidersThatRunHere) {
  const auto p = Rail::providers();
  EXPECT_NE(std::find(p.begin(), p.end(), "tcp;ofi_rxm"), p.end());
  EXPECT_NE(std::find(p.begin(), p.end(), "shm"), p.end());
}

}  // namespace
}  // namespace meridian::transport::fabric
