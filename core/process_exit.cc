#include "core/process_exit.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace meridian {

Result<ProcessExitFd> ProcessExitFd::open(pid_t pid) {
  if (pid <= 0) return invalidArgument("no process {} to watch", pid);
#if defined(SYS_pidfd_open)
  UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (fd.get() < 0) return internalError("pidfd_open({}): {}", pid, errnoText(errno));
  ProcessExitFd watch;
  watch.fd_ = std::move(fd);
  watch.pid_ = pid;
  return watch;
#else
  return internalError("pidfd_open({}): this system has no pidfds", pid);
#endif
}

}  // namespace meridian
