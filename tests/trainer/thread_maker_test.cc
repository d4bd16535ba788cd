// ThreadMaker: threads made for a thread whose priority was lowered keep the nice value the
// maker was created at (communicators built on them must not run at the compute thread's).
#include "trainer/thread_maker.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>

namespace meridian::trainer {
namespace {

int ownNice() {
  errno = 0;
  const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  return errno == 0 ? n : -100;
}

TEST(ThreadMakerTest, ThreadsItMakesKeepTheNiceValueItWasMadeAtNotTheCallers) {
  const int start = ownNice();
  ASSERT_NE(start, -100);
  if (start >= 19) GTEST_SKIP() << "this test already runs at nice " << start << ": nothing lower to set";
  // A thread of its own plays the compute thread: this one's priority stays as it was.
  int callerAfter = -100, plain = -100, made = -100, ran = 0;
  std::thread compute([&] {
    ThreadMaker maker;  // made before the priority drops, as the run's is
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), start + 1) != 0) return;
    callerAfter = ownNice();
    std::thread([&] { plain = ownNice(); }).join();  // inherits the lowered priority
    maker.make([&] { made = ownNice(); }).join();
    maker.run([&] { ++ran; });
    maker.run([&] { ++ran; });
  });
  compute.join();
  ASSERT_EQ(callerAfter, start + 1) << "could not lower the calling thread's priority";
  EXPECT_EQ(plain, start + 1);
  EXPECT_EQ(made, start);
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace meridian::trainer
