#include "core/process_exit.h"

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include <gtest/gtest.h>

namespace meridian {
namespace {

// Without blocking: is the watch readable (the process exited)?
bool exited(const ProcessExitFd& watch) {
  pollfd p{watch.fd(), POLLIN, 0};
  return watch.valid() && ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

// A child that waits to be killed; reaped by the test.
pid_t startSleeper() {
  const pid_t child = ::fork();
  if (child == 0) {
    while (true) ::pause();
  }
  return child;
}

TEST(ProcessExitFdTest, BecomesReadableInEpollWhenTheProcessIsKilledBeforeItIsReaped) {
  const pid_t child = startSleeper();
  ASSERT_GT(child, 0);
  Result<ProcessExitFd> watch = ProcessExitFd::open(child);
  ASSERT_TRUE(watch.isOk()) << watch.status().toString();
  EXPECT_EQ(watch->pid(), child);
  EXPECT_FALSE(exited(*watch));

  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  ASSERT_GE(ep.get(), 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = watch->fd();
  ASSERT_EQ(::epoll_ctl(ep.get(), EPOLL_CTL_ADD, watch->fd(), &ev), 0);
  epoll_event got{};
  EXPECT_EQ(::epoll_wait(ep.get(), &got, 1, 0), 0) << "readable while the process lives";

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Not reaped yet: a zombie counts as exited. The wait ends on the event, not on a timer.
  ASSERT_EQ(::epoll_wait(ep.get(), &got, 1, 60'000), 1);
  EXPECT_EQ(got.data.fd, watch->fd());
  EXPECT_TRUE(exited(*watch));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(ProcessExitFdTest, NoProcessIsAClearError) {
  const pid_t child = startSleeper();
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const Result<ProcessExitFd> gone = ProcessExitFd::open(child);  // reaped: the pid is free
  ASSERT_FALSE(gone.isOk());
  EXPECT_NE(gone.status().message().find(std::to_string(child)), std::string::npos) << gone.status().toString();
  EXPECT_FALSE(ProcessExitFd::open(0).isOk());
  EXPECT_FALSE(exited(ProcessExitFd()));
}

}  // namespace
}  // namespace meridian
