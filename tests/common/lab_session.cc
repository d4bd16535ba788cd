#include "tests/common/lab_session.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lab/netns.h"

namespace meridian::testing {

EmulatorLateness emulatorLateness(const std::string& labName) {
  auto r = runShell(labCommand(labName, "status --json"));
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  if (r.code != 0 || j.is_discarded() || !j.contains("emulator")) return {};
  return {j["emulator"].value("late_sum_us", 0.0), j["emulator"].value("packets_out", 0.0)};
}

double linkFigure(const std::string& labName, const std::string& plane, const std::string& src, const std::string& dst,
                  const std::string& field) {
  auto r = runShell(labCommand(labName, "status --json"));
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  if (r.code != 0 || j.is_discarded() || !j.contains("links")) return -1;
  for (const auto& l : j["links"]) {
    if (l.value("plane", "") == plane && l.value("src", "") == src && l.value("dst", "") == dst) {
      return l.value(field, -1.0);
    }
  }
  return -1;
}

bool processEnded(int pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string pidText, comm, state;
  // comm is in parentheses and has no spaces for the processes tests start.
  return !(stat >> pidText >> comm >> state) || state == "Z" || state == "X";
}

double meanLateMs(const EmulatorLateness& before, const EmulatorLateness& after) {
  const double packets = after.packets - before.packets;
  return packets > 0 ? (after.sumUs - before.sumUs) / packets / 1000 : 0;
}

CommandResult runShell(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string labCommand(const std::string& name, const std::string& args) {
  return fmt::format("{} --lab {} {}", MERIDIAN_LAB_BIN, name, args);
}

std::string labUnavailableReason() {
  if (Status s = lab::requireRoot(); !s.isOk()) return s.message();
  if (Status s = lab::requireTun(); !s.isOk()) return s.message();
  return {};
}

LabSession::LabSession(std::string name, std::string topologyFile, std::string upArgs)
    : name_(std::move(name)), topology_(std::move(topologyFile)), upArgs_(std::move(upArgs)) {}

CommandResult LabSession::up() {
  runShell(labCommand(name_, "down"));  // what a crashed earlier run left
  CommandResult r = runShell(labCommand(name_, "up " + topology_ + " " + upArgs_));
  isUp_ = r.code == 0;
  return r;
}

LabSession::~LabSession() {
  if (isUp_) runShell(labCommand(name_, "down"));
}

}  // namespace meridian::testing
