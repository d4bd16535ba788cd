// Helpers for tests that drive a real meridian-lab (label `lab`): run a shell command and
// capture its output, read the emulator's figures, tell when a process has ended, and a lab
// brought up under a test-only name that is always taken down again.
#pragma once

#include <string>

namespace meridian::testing {

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `command` with /bin/sh, stderr merged into the output.
CommandResult runShell(const std::string& command);

// "<meridian-lab> --lab <name> <args>", ready for runShell.
std::string labCommand(const std::string& name, const std::string& args);

// The reason the lab cannot run here (not root, no /dev/net/tun), or empty.
std::string labUnavailableReason();

// The emulator's own error so far, from `status --json`: the sum of how late its packets
// left and how many left (zeros when the status cannot be read). The difference of two
// readings gives the mean lateness per packet in between: the lab's error bar there.
struct EmulatorLateness {
  double sumUs = 0;
  double packets = 0;
};
EmulatorLateness emulatorLateness(const std::string& labName);
// Mean lateness per packet in ms between two readings (0 when no packet left).
double meanLateMs(const EmulatorLateness& before, const EmulatorLateness& after);

// One link's figure from `status --json`: `field` ("bytes", "backlog_bytes", "queue_drops",
// ...) of the link on `plane` from region `src` to `dst`; -1 when the status cannot be read
// or has no such link.
double linkFigure(const std::string& labName, const std::string& plane, const std::string& src, const std::string& dst,
                  const std::string& field);

// True when process `pid` has ended: it is gone, or a zombie its parent has not reaped yet.
bool processEnded(int pid);

// Brings a lab up from `topologyFile` (extra `up` arguments allowed) and takes it down on
// destruction; `up()` reports failure with the tool's output.
class LabSession {
 public:
  LabSession(std::string name, std::string topologyFile, std::string upArgs = "");
  ~LabSession();
  LabSession(const LabSession&) = delete;
  LabSession& operator=(const LabSession&) = delete;

  CommandResult up();
  CommandResult run(const std::string& args) const { return runShell(labCommand(name_, args)); }
  const std::string& name() const { return name_; }

 private:
  std::string name_, topology_, upArgs_;
  bool isUp_ = false;
};

}  // namespace meridian::testing
