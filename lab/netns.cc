#include "lab/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace meridian::lab {

namespace {

constexpr const char* kNetnsDir = "/run/netns";

Result<UniqueFd> openNamespace(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return invalidArgument("bad namespace name '{}'", name);
  UniqueFd fd(::open(fmt::format("{}/{}", kNetnsDir, name).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return invalidArgument("network namespace '{}' is not there: {}", name, errnoText(errno));
  return fd;
}

}  // namespace

Status requireRoot() {
  if (::geteuid() != 0) {
    return invalidArgument("meridian-lab needs root (it creates network namespaces and TUN devices): run it as root");
  }
  return Status::ok();
}

Status requireTun(const std::string& device) {
  struct stat st {};
  if (::stat(device.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) {
    return invalidArgument("{} is missing: the lab needs the TUN driver (modprobe tun, or a kernel with it)", device);
  }
  return Status::ok();
}

Status runCommand(const std::vector<std::string>& argv) {
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) return internalError("pipe: {}", errnoText(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    (void)::close(err[0]);  // a pipe nothing went through
    (void)::close(err[1]);
    return internalError("fork: {}", errnoText(e));
  }
  if (pid == 0) {
    // The command's stderr is the pipe (its output is the error message), stdout /dev/null.
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (::dup2(err[1], STDERR_FILENO) < 0 || devnull < 0 || ::dup2(devnull, STDOUT_FILENO) < 0) ::_exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s", args[0], std::strerror(errno));
    ::_exit(127);
  }
  (void)::close(err[1]);  // the child's end: nothing was written through it here
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(err[0], buf, sizeof(buf));
    if (n > 0) {
      if (out.size() < 4096) out.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  (void)::close(err[0]);  // read to EOF
  int status = 0;
  pid_t waited = -1;
  while ((waited = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited < 0) return internalError("waitpid for {}: {}", argv.front(), errnoText(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok();
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  return internalError("'{}' failed: {}", cmd, out.empty() ? "no message" : out);
}

bool namespaceExists(const std::string& name) {
  struct stat st {};
  return ::stat(fmt::format("{}/{}", kNetnsDir, name).c_str(), &st) == 0;
}

Status createNamespace(const std::string& name) {
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "netns", "add", name}));
  return runCommand({"ip", "-n", name, "link", "set", "lo", "up"});
}

Status deleteNamespace(const std::string& name) {
  if (!namespaceExists(name)) return Status::ok();
  return runCommand({"ip", "netns", "delete", name});
}

Result<NamespaceGuard> NamespaceGuard::enter(const std::string& name) {
  UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!original.valid()) return internalError("cannot open this thread's network namespace: {}", errnoText(errno));
  MERIDIAN_ASSIGN_OR_RETURN(UniqueFd target, openNamespace(name));
  if (::setns(target.get(), CLONE_NEWNET) != 0) {
    return internalError("cannot enter network namespace '{}': {}", name, errnoText(errno));
  }
  return NamespaceGuard(std::move(original));
}

NamespaceGuard::~NamespaceGuard() {
  if (original_.valid() && ::setns(original_.get(), CLONE_NEWNET) != 0) {
    // Staying in the wrong namespace would silently misplace every later socket.
    std::fprintf(stderr, "meridian-lab: cannot return to the original network namespace: %s\n", errnoText(errno).c_str());
    std::abort();
  }
}

Status enterNamespaceForGood(const std::string& name) {
  MERIDIAN_ASSIGN_OR_RETURN(UniqueFd target, openNamespace(name));
  if (::setns(target.get(), CLONE_NEWNET) != 0) {
    return internalError("cannot enter network namespace '{}': {}", name, errnoText(errno));
  }
  return Status::ok();
}

Result<UniqueFd> socketIn(const std::string& name, int domain, int type, int protocol) {
  MERIDIAN_ASSIGN_OR_RETURN(NamespaceGuard guard, NamespaceGuard::enter(name));
  UniqueFd fd(::socket(domain, type | SOCK_CLOEXEC, protocol));
  if (!fd.valid()) return internalError("socket in namespace '{}': {}", name, errnoText(errno));
  return fd;
}

Result<UniqueFd> createTun(const std::string& ns, const std::string& ifName, int mtu, const std::string& address) {
  if (ifName.empty() || ifName.size() >= IFNAMSIZ) return invalidArgument("bad interface name '{}'", ifName);
  UniqueFd fd;
  {
    // The TUN device is created in the namespace of the thread that asks for it.
    MERIDIAN_ASSIGN_OR_RETURN(NamespaceGuard guard, NamespaceGuard::enter(ns));
    fd.reset(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) return internalError("cannot open /dev/net/tun: {}", errnoText(errno));
    ifreq req{};
    req.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::memcpy(req.ifr_name, ifName.c_str(), ifName.size());
    if (::ioctl(fd.get(), TUNSETIFF, &req) != 0) {
      return internalError("cannot create TUN interface {} in namespace {}: {}", ifName, ns, errnoText(errno));
    }
  }
  MERIDIAN_RETURN_IF_ERROR(setSysctlIn(ns, fmt::format("net/ipv6/conf/{}/disable_ipv6", ifName), "1"));
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "-n", ns, "link", "set", "dev", ifName, "mtu", std::to_string(mtu)}));
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "-n", ns, "addr", "add", address + "/24", "dev", ifName}));
  // A longer transmit queue than TUN's default 500 packets: the emulator, not the
  // interface, is where packets should queue and drop.
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "-n", ns, "link", "set", "dev", ifName, "txqueuelen", "10000", "up"}));
  return fd;
}

sockaddr_in ipv4Address(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  return a;
}

Status setSysctlIn(const std::string& ns, const std::string& key, const std::string& value) {
  // /proc/sys/net shows the namespace of the thread that opens it.
  MERIDIAN_ASSIGN_OR_RETURN(NamespaceGuard guard, NamespaceGuard::enter(ns));
  std::string path = "/proc/sys/" + key;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return internalError("cannot open {} in namespace {}: {}", path, ns, errnoText(errno));
  if (::write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
    return internalError("cannot set {} to '{}' in namespace {}: {}", path, value, ns, errnoText(errno));
  }
  return Status::ok();
}

}  // namespace meridian::lab
