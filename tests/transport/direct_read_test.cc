// Same-host direct reads: the offer codec and its bounds, who may read whom (a forked
// process), and channels whose large messages travel by address (two devices in one
// process reading each other through their own pid), including a peer that sends by
// address to a channel that never agreed to read it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <thread>

#include "core/metrics.h"
#include "transport/frame.h"
#include "transport/tcp/direct_read.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {
namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

std::span<const std::uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

TEST(DirectReadOfferTest, RoundTripsThisProcesssOffer) {
  const DirectReadOffer mine = localDirectReadOffer();
  EXPECT_EQ(mine.pid, ::getpid());
  EXPECT_EQ(mine.hostKey, localHostKey());
  auto back = decodeDirectReadOffer(bytesOf(encodeDirectReadOffer(mine)));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->hostKey, mine.hostKey);
  EXPECT_EQ(back->pid, mine.pid);
  EXPECT_EQ(back->cookieAddress, mine.cookieAddress);
  EXPECT_EQ(back->cookie, mine.cookie);
}

TEST(DirectReadOfferTest, RefusesMalformedOffers) {
  for (const std::string& bad : std::vector<std::string>{"", "v1", "v2 host 12 4096 7", "v1 host 12 4096", "v1 host 12 4096 7 extra",
                                "v1 host -3 4096 7", "v1 host 0 4096 7", "v1 host 12 0 7", "v1 host 12 0x10 7",
                                "v1 host 12 4096 seven", "v1  12 4096 7", "v1 " + std::string(200, 'h') + " 1 2 3"}) {
    auto r = decodeDirectReadOffer(bytesOf(bad));
    EXPECT_FALSE(r.isOk()) << "accepted '" << bad << "'";
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), StatusCode::kPeerError) << bad;
    }
  }
  EXPECT_FALSE(decodeDirectReadOffer(bytesOf(std::string(300, '1'))).isOk());
}

TEST(DirectReadOfferTest, ThisProcessDoesNotReadItselfAndOtherHostsAreNeverTried) {
  EXPECT_FALSE(canReadDirect(localDirectReadOffer()));
  DirectReadOffer other = localDirectReadOffer();
  other.hostKey += "-elsewhere";
  other.pid = 1;
  EXPECT_FALSE(canReadDirect(other));
}

TEST(DirectReadOfferTest, ReadsAnotherProcessOnThisHostOnlyWithItsCookie) {
  int toParent[2], toChild[2];
  ASSERT_EQ(::pipe(toParent), 0);
  ASSERT_EQ(::pipe(toChild), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(toChild[1]);
    ::close(toParent[0]);
    const std::string offer = encodeDirectReadOffer(localDirectReadOffer());
    ssize_t w = ::write(toParent[1], offer.data(), offer.size());
    char c;
    ssize_t r = ::read(toChild[0], &c, 1);  // stay alive (and mapped) until the parent is done
    ::_exit(w > 0 && r >= 0 ? 0 : 1);
  }
  ::close(toChild[0]);
  ::close(toParent[1]);
  char buf[512];
  ssize_t n = ::read(toParent[0], buf, sizeof(buf));
  ::close(toParent[0]);
  ASSERT_GT(n, 0);
  auto offer = decodeDirectReadOffer(std::span<const std::uint8_t>(reinterpret_cast<std::uint8_t*>(buf), static_cast<std::size_t>(n)));
  ASSERT_TRUE(offer.isOk()) << offer.status().toString();
  EXPECT_EQ(offer->pid, child);
  if (!canReadDirect(offer.value())) {
    ::close(toChild[1]);
    ::waitpid(child, nullptr, 0);
    GTEST_SKIP() << "this kernel does not let a process read its sibling (ptrace_scope or seccomp); "
                    "MERIDIAN_DIRECT_READ=auto then falls back to the sockets";
  }
  DirectReadOffer forged = offer.value();
  forged.cookie ^= 1;
  EXPECT_FALSE(canReadDirect(forged)) << "a wrong cookie must not pass";
  std::uint8_t out[8];
  Status st = readDirect(offer->pid, out, 8, sizeof(out));  // page zero is never mapped
  EXPECT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("direct read"), std::string::npos) << st.message();
  ::close(toChild[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

struct Pair {
  std::unique_ptr<TcpDevice> a, b;
  ChannelPtr ab, ba;
};

// Devices "dra" and "drb" (one path, two streams): `aReadsB` / `bReadsA` say which side reads
// the other's memory (here the same process, through its own pid).
Pair connect(bool aReadsB, bool bReadsA, bool aSendsByAddress, bool bSendsByAddress) {
  Pair p;
  DeviceOptions o;
  o.localAddresses = {"127.0.0.1"};
  o.streamsPerPath = 2;
  o.secret = "test-secret";
  o.name = "dra";
  auto a = TcpDevice::create(o);
  o.name = "drb";
  auto b = TcpDevice::create(o);
  EXPECT_TRUE(a.isOk() && b.isOk());
  p.a = std::move(a.value());
  p.b = std::move(b.value());
  const std::uint64_t session = 0xd12ec7;
  auto deadline = Clock::now() + kTimeout;
  Result<ChannelPtr> ba = internalError("not run");
  std::thread acceptor([&] {
    ChannelSpec spec{session, 1, 0, false, p.a->listenAddresses()};
    spec.readPeerPid = bReadsA ? ::getpid() : 0;
    spec.peerReadsDirect = bSendsByAddress;
    ba = p.b->openChannel(spec, deadline);
  });
  ChannelSpec spec{session, 0, 1, true, p.b->listenAddresses()};
  spec.readPeerPid = aReadsB ? ::getpid() : 0;
  spec.peerReadsDirect = aSendsByAddress;
  auto ab = p.a->openChannel(spec, deadline);
  acceptor.join();
  EXPECT_TRUE(ab.isOk()) << ab.status().toString();
  EXPECT_TRUE(ba.isOk()) << ba.status().toString();
  p.ab = ab.value();
  p.ba = ba.value();
  return p;
}

Counter& directReadBytes(const std::string& device) {
  return MetricsRegistry::global().counter("meridian_transport_direct_read_bytes_total", "", {{"device", device}});
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng());
  return v;
}

TEST(DirectReadChannelTest, LargeMessagesTravelByAddressSmallOnesInline) {
  Pair p = connect(true, true, true, true);
  Counter& readByB = directReadBytes("drb");
  Counter& readByA = directReadBytes("dra");
  const std::uint64_t before = readByB.value();
  const std::uint64_t beforeA = readByA.value();
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1000}, std::size_t{64 * 1024 + 1}, std::size_t{3u << 20}, std::size_t{(5u << 20) + 7}}) {
    auto data = pattern(bytes, static_cast<std::uint32_t>(bytes));
    std::vector<std::uint8_t> out(bytes + 16, 0xee);
    auto r = p.ba->irecv(out.data(), out.size(), 7);
    auto s = p.ab->isend(data.data(), data.size(), 7);
    ASSERT_TRUE(r.isOk() && s.isOk());
    auto deadline = Clock::now() + kTimeout;
    ASSERT_TRUE((*s)->wait(deadline).isOk()) << (*s)->status().toString();
    ASSERT_TRUE((*r)->wait(deadline).isOk()) << (*r)->status().toString();
    EXPECT_EQ((*r)->bytes(), bytes);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin())) << bytes << " bytes";
    EXPECT_EQ(out[bytes], 0xee) << "wrote past the message";
  }
  // Everything above the eager bound was read from the sender's memory, nothing else.
  EXPECT_EQ(readByB.value() - before, (64u * 1024 + 1) + (3u << 20) + (5u << 20) + 7);
  EXPECT_EQ(readByA.value(), beforeA);
  // The path still counts what it carried, as routing and the metrics expect.
  EXPECT_GE(p.ab->pathStats().at(0).bytesSent, (8u << 20));
}

TEST(DirectReadChannelTest, AMessageSentBeforeItsReceiveIsReadIntoABufferAndDelivered) {
  Pair p = connect(true, true, true, true);
  auto data = pattern(2u << 20, 3);
  auto s = p.ab->isend(data.data(), data.size(), 9);
  ASSERT_TRUE(s.isOk());
  auto deadline = Clock::now() + kTimeout;
  ASSERT_TRUE((*s)->wait(deadline).isOk()) << "an unexpected message is read (and acknowledged) at once";
  std::fill(data.begin(), data.end(), 0);  // the sender owns its buffer again
  std::vector<std::uint8_t> out(2u << 20);
  auto r = p.ba->irecv(out.data(), out.size(), 9);
  ASSERT_TRUE(r.isOk());
  ASSERT_TRUE((*r)->wait(deadline).isOk());
  EXPECT_EQ(out, pattern(2u << 20, 3));
}

TEST(DirectReadChannelTest, AnAddressSentToAChannelThatDoesNotReadFailsCleanly) {
  // a sends by address, but b never agreed to read a's memory.
  Pair p = connect(false, false, true, false);
  auto data = pattern(1u << 20, 5);
  std::vector<std::uint8_t> out(1u << 20);
  auto r = p.ba->irecv(out.data(), out.size(), 1);
  auto s = p.ab->isend(data.data(), data.size(), 1);
  ASSERT_TRUE(r.isOk() && s.isOk());
  auto deadline = Clock::now() + kTimeout;
  Status rs = (*r)->wait(deadline);
  EXPECT_FALSE(rs.isOk());
  EXPECT_NE(rs.code(), StatusCode::kTimeout);
  EXPECT_FALSE((*s)->wait(deadline).isOk());
  EXPECT_FALSE(p.ba->health().isOk());
}

TEST(DirectReadFrameTest, TheReferenceFrameDecodesAndItsBoundsHold) {
  FrameHeader h;
  h.type = FrameType::kDataRef;
  h.seq = 4;
  h.totalBytes = 1u << 20;
  h.offset = 512u << 10;
  h.length = 512u << 10;
  auto back = decodeFrameHeader(encodeFrameHeader(h));
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(back->type, FrameType::kDataRef);
  EXPECT_EQ(back->length, h.length);
  h.length = (512u << 10) + 1;  // past the end of its message
  EXPECT_FALSE(decodeFrameHeader(encodeFrameHeader(h)).isOk());
  auto bytes = encodeFrameHeader(FrameHeader{});
  bytes[3] = 5;
  EXPECT_FALSE(decodeFrameHeader(bytes).isOk());
}

}  // namespace
}  // namespace meridian::transport::tcp
