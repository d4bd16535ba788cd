// Local multi-process launching.
#include "core/local_launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/secret.h"

extern char** environ;

namespace meridian {

int pickFreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error(fmt::format("cannot find a free loopback port: {}", std::strerror(errno)));
  }
  return ntohs(a.sin_port);
}

int launchLocalRanks(const LocalLaunchOptions& options) {
  if (options.ranks < 1) throw std::invalid_argument("--ranks must be at least 1");
  if (options.argv.empty()) throw std::invalid_argument("nothing to launch");
  const std::string store = fmt::format("127.0.0.1:{}", pickFreeLoopbackPort());
  // Ranks launched here are all ours: without a job secret, give them a fresh random one.
  std::string secret;
  if (!knobIsSet(knobs::kSecret) && !knobIsSet(knobs::kSecretFile)) {
    std::uint8_t raw[32];
    randomBytes(raw);
    for (std::uint8_t b : raw) secret += fmt::format("{:02x}", b);
  }
  std::map<pid_t, int> children;  // pid -> rank
  for (int r = 0; r < options.ranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
      ::setenv("MERIDIAN_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MERIDIAN_WORLD_SIZE", std::to_string(options.ranks).c_str(), 1);
      ::setenv("MERIDIAN_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MERIDIAN_LOCAL_WORLD_SIZE", std::to_string(options.ranks).c_str(), 1);
      ::setenv("MERIDIAN_STORE", store.c_str(), 1);
      if (!secret.empty()) ::setenv("MERIDIAN_SECRET", secret.c_str(), 1);
      for (const auto& [k, v] : options.extraEnv) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : options.argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execve(args[0], args.data(), environ);
      std::fprintf(stderr, "meridian: cannot exec %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    children[pid] = r;
  }
  int worst = 0;
  bool terminating = false;
  auto firstFailure = std::chrono::steady_clock::time_point::max();
  while (!children.empty()) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && children.count(pid) != 0) {
      int rank = children[pid];
      children.erase(pid);
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        if (!terminating) MLOG_ERROR(kCore, "rank {} exited with status {}", rank, code);
        if (firstFailure == std::chrono::steady_clock::time_point::max()) {
          firstFailure = std::chrono::steady_clock::now();
        }
      }
      worst = std::max(worst, code);
      continue;
    }
    if (pid < 0 && errno == ECHILD) break;
    if (!terminating && std::chrono::steady_clock::now() - firstFailure > options.failureGrace) {
      terminating = true;
      for (const auto& [p, rank] : children) {
        MLOG_ERROR(kCore, "stopping rank {} (pid {}) after another rank failed", rank, p);
        ::kill(p, SIGTERM);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return worst;
}

}  // namespace meridian
