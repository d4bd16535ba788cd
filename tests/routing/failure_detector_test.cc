// The failure detector: silence past the timeout, a failed channel, each loss reported once.
#include "routing/failure_detector.h"

#include <gtest/gtest.h>

namespace meridian::routing {
namespace {

using std::chrono::milliseconds;

TEST(FailureDetectorTest, APeerThatFallsSilentIsLostOneTimeoutAfterItWasLastHeardAndOnlyOnce) {
  const TimePoint t0{};
  FailureDetector d(0, 4, milliseconds(3000), t0);
  for (int ms = 0; ms <= 5000; ms += 100) {
    const TimePoint now = t0 + milliseconds(ms);
    d.heard(1, now);
    d.heard(3, now);
    if (ms <= 900) d.heard(2, now);  // rank 2 falls silent after 0.9 s
    const auto lost = d.tick(now);
    if (ms < 3900) {
      EXPECT_TRUE(lost.empty()) << "at " << ms << " ms";
    } else if (ms == 3900) {
      ASSERT_EQ(lost.size(), 1u);
      EXPECT_EQ(lost[0].peer, 2);
      EXPECT_NE(lost[0].why.find("nothing heard from it for 3.0 s"), std::string::npos) << lost[0].why;
    } else {
      EXPECT_TRUE(lost.empty()) << "rank 2 reported again at " << ms << " ms";
    }
  }
  EXPECT_TRUE(d.lost(2));
  EXPECT_FALSE(d.lost(1));
  EXPECT_FALSE(d.lost(3));
  EXPECT_EQ(d.lostCount(), 1);
  // A lost peer stays lost: hearing from it again is a rejoin, not the detector's business.
  d.heard(2, t0 + milliseconds(5100));
  EXPECT_TRUE(d.lost(2));
}

TEST(FailureDetectorTest, EveryPeerGetsAWholeTimeoutFromTheStartAndLateNewsDoesNotMoveTimeBack) {
  const TimePoint t0 = TimePoint{} + milliseconds(10000);
  FailureDetector d(1, 3, milliseconds(1000), t0);
  EXPECT_TRUE(d.tick(t0 + milliseconds(999)).empty());
  d.heard(0, t0 + milliseconds(900));
  d.heard(0, t0 + milliseconds(100));  // an older sign of life arriving late
  const auto lost = d.tick(t0 + milliseconds(1000));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].peer, 2);
  EXPECT_TRUE(d.tick(t0 + milliseconds(1899)).empty());
  ASSERT_EQ(d.tick(t0 + milliseconds(1900)).size(), 1u);  // 0: last heard at 0.9 s
}

TEST(FailureDetectorTest, AFailedChannelIsALossAtTheNextTickWithItsReason) {
  const TimePoint t0{};
  FailureDetector d(0, 3, milliseconds(5000), t0);
  d.failed(2, "peer error: connection reset by peer");
  d.failed(2, "a second reason is not kept");
  d.heard(2, t0 + milliseconds(10));  // bytes that were already on their way
  const auto lost = d.tick(t0 + milliseconds(50));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].peer, 2);
  EXPECT_EQ(lost[0].why, "its channel failed: peer error: connection reset by peer");
  EXPECT_TRUE(d.tick(t0 + milliseconds(100)).empty());
  // Itself and ranks out of range are ignored.
  d.failed(0, "self");
  d.failed(7, "stranger");
  d.heard(-1, t0);
  EXPECT_TRUE(d.tick(t0 + milliseconds(200)).empty());
  EXPECT_EQ(d.lostCount(), 1);
}

TEST(FailureDetectorTest, APeerThatLeftOnPurposeIsNeverReportedLost) {
  const TimePoint t0{};
  FailureDetector d(0, 3, milliseconds(1000), t0);
  d.left(1);
  EXPECT_TRUE(d.gone(1));
  EXPECT_FALSE(d.lost(1));
  const auto lost = d.tick(t0 + milliseconds(5000));  // long silent: only 2 is lost
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].peer, 2);
  EXPECT_EQ(d.lostCount(), 1);
}

}  // namespace
}  // namespace meridian::routing
