// Same-host direct reads: the offer codec and its bounds, who may read whom (a forked
// process) and the DATA-REF frame's bounds. Channels that move messages by address are
// tested with the other channel tests (tcp_channel_test.cc, DirectRead*).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "transport/frame.h"
#include "transport/shm/segment.h"
#include "transport/tcp/direct_read.h"

namespace meridian::transport::tcp {
namespace {

std::span<const std::uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

TEST(DirectReadOfferTest, RoundTripsThisProcesssOffer) {
  const DirectReadOffer mine = localDirectReadOffer();
  EXPECT_EQ(mine.pid, ::getpid());
  EXPECT_EQ(mine.hostKey, shm::localHostKey());
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
