// A process's exit as a file descriptor, for an event loop to wait on beside its sockets.
#pragma once

#include <sys/types.h>

#include "core/fd.h"
#include "core/status.h"

namespace meridian {

// A pidfd (Linux 5.3+): readable from the moment the process exits (a zombie nobody reaped
// counts as exited), so a loop in epoll learns of a peer's death without polling for it.
class ProcessExitFd {
 public:
  ProcessExitFd() = default;
  // Fails where the kernel has no pidfds, or the process is already gone (ESRCH).
  static Result<ProcessExitFd> open(pid_t pid);
  int fd() const { return fd_.get(); }
  pid_t pid() const { return pid_; }
  bool valid() const { return fd_.get() >= 0; }

 private:
  UniqueFd fd_;
  pid_t pid_ = 0;
};

}  // namespace meridian
