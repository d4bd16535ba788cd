// Shared-memory segments (transport/shm/segment.h): what a peer checks before it maps one,
// offers from the wire, names that go away, and leftovers of dead processes removed.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "transport/shm/segment.h"

namespace meridian::transport::shm {
namespace {

constexpr std::size_t kBytes = 64 * 1024;

std::string pathOf(const SegmentOffer& o) { return "/dev/shm" + o.name; }

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(ShmSegmentTest, APeerMapsTheSameBytesAndTheNameGoesWhenUnlinked) {
  auto seg = ShmSegment::create("0123abcd", kBytes);
  ASSERT_TRUE(seg.isOk()) << seg.status().toString();
  const SegmentOffer offer = seg->offer();
  EXPECT_EQ(offer.name.rfind("/meridian-0123abcd-", 0), 0u) << offer.name;
  EXPECT_EQ(offer.ownerPid, ::getpid());
  struct stat st {};
  ASSERT_EQ(::stat(pathOf(offer).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "a segment others could open";
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), seg->bytes());

  auto back = decodeSegmentOffer(encodeSegmentOffer(offer), 1 << 30);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  auto peer = ShmSegment::open(back.value());
  ASSERT_TRUE(peer.isOk()) << peer.status().toString();
  seg->data()[kSegmentHeaderBytes + 7] = 42;
  EXPECT_EQ(peer->data()[kSegmentHeaderBytes + 7], 42) << "the two mappings are not the same memory";

  seg->unlink();
  EXPECT_FALSE(exists(pathOf(offer)));
  EXPECT_EQ(peer->data()[kSegmentHeaderBytes + 7], 42) << "the mapping went with the name";
  EXPECT_FALSE(ShmSegment::open(offer).isOk()) << "an unlinked name opened";
}

TEST(ShmSegmentTest, TheCreatorsDestructorRemovesTheName) {
  std::string path;
  {
    auto seg = ShmSegment::create("beef", kBytes);
    ASSERT_TRUE(seg.isOk()) << seg.status().toString();
    path = pathOf(seg->offer());
    ASSERT_TRUE(exists(path));
  }
  EXPECT_FALSE(exists(path)) << "a segment outlived its creator's object";
}

TEST(ShmSegmentTest, APeerRefusesAWrongTokenSizePidModeOrOwner) {
  auto seg = ShmSegment::create("cafe", kBytes);
  ASSERT_TRUE(seg.isOk()) << seg.status().toString();
  auto refused = [&](SegmentOffer o, const std::string& needle) {
    auto r = ShmSegment::open(o);
    ASSERT_FALSE(r.isOk()) << "opened despite: " << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kPeerError);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  SegmentOffer o = seg->offer();
  o.token[3] ^= 1;
  refused(o, "token");
  o = seg->offer();
  o.bytes += 4096;
  refused(o, "bytes, announced");
  o = seg->offer();
  o.ownerPid += 1;
  refused(o, "pid");
  const std::string path = pathOf(seg->offer());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  refused(seg->offer(), "mode 644");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  if (::geteuid() != 0) {
    GTEST_SKIP() << "giving the segment to another user (to see it refused) needs root";
  }
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  refused(seg->offer(), "belongs to uid 65534");
}

TEST(ShmSegmentTest, OffersFromTheWireAreBoundedAndNameOnlyMeridianSegments) {
  const std::string token(32, 'a');
  auto ok = decodeSegmentOffer("v1 /meridian-ab-cd 65536 42 " + token, 1 << 20);
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ(ok->bytes, 65536u);
  EXPECT_EQ(ok->ownerPid, 42);
  for (const std::string& bad : {
           "v2 /meridian-ab-cd 65536 42 " + token,              // version
           "v1 /etc/passwd 65536 42 " + token,                  // not ours
           "v1 /meridian-ab/../../x 65536 42 " + token,         // a path
           "v1 meridian-ab 65536 42 " + token,                  // no leading slash
           "v1 /meridian-ab 99999999999 42 " + token,           // over the bound
           "v1 /meridian-ab 100 42 " + token,                   // under a header
           "v1 /meridian-ab 65536 -1 " + token,                 // pid
           "v1 /meridian-ab 65536 42 " + token.substr(2),       // short token
           "v1 /meridian-ab 65536 42 " + token + " extra",      // a sixth field
           std::string("v1 /meridian-ab 65536 42"),             // four fields
           std::string(1000, 'v'),                              // long
           std::string(),
       }) {
    auto r = decodeSegmentOffer(bad, 1 << 20);
    EXPECT_FALSE(r.isOk()) << "accepted: " << bad;
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), StatusCode::kPeerError);
    }
  }
}

TEST(ShmSegmentTest, ABadTagIsRefusedBeforeAnythingIsCreated) {
  for (const char* tag : {"", "ABC", "ab/cd", "0123456789abcdef0123456789abcdef0"}) {
    auto r = ShmSegment::create(tag, kBytes);
    ASSERT_FALSE(r.isOk()) << tag;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

// A process that dies holding a named segment (killed before its peers mapped it) leaves
// the name; the next start removes it, and leaves a live process's segment alone.
TEST(ShmSegmentTest, LeftoversOfDeadProcessesAreRemovedAndLiveOnesKept) {
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto seg = ShmSegment::create("dead", kBytes);
    std::string path = seg.isOk() ? pathOf(seg->offer()) : std::string();
    (void)!::write(pipeFds[1], path.data(), path.size());
    ::_exit(seg.isOk() ? 0 : 1);  // no destructor: the name stays, as after a kill -9
  }
  ::close(pipeFds[1]);
  char buf[256] = {};
  const ssize_t n = ::read(pipeFds[0], buf, sizeof(buf) - 1);
  ::close(pipeFds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not create its segment";
  const std::string leftover(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  ASSERT_TRUE(exists(leftover)) << leftover;

  auto live = ShmSegment::create("a11ce", kBytes);
  ASSERT_TRUE(live.isOk()) << live.status().toString();
  EXPECT_GE(removeStaleSegments(), 1);
  EXPECT_FALSE(exists(leftover)) << "a dead process's segment stayed";
  EXPECT_TRUE(exists(pathOf(live->offer()))) << "a live process's segment was removed";
}

}  // namespace
}  // namespace meridian::transport::shm
