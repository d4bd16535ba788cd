// Local multi-process launching.
#include "core/local_launch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/check.h"
#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/scrape_targets.h"
#include "core/secret.h"

extern char** environ;

namespace meridian {

Result<LoopbackListener> listenOnFreeLoopbackPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0 || ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return internalError("cannot listen on a free loopback port: {}", errnoText(errno));
  }
  return LoopbackListener{std::move(fd), static_cast<int>(ntohs(a.sin_port))};
}

namespace {

// Copies complete lines from a rank's pipe to stdout with its prefix; returns false at EOF.
bool pumpLines(int fd, const std::string& prefix, std::string& partial) {
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!partial.empty()) std::printf("%s%s\n", prefix.c_str(), partial.c_str());
    partial.clear();
    std::fflush(stdout);
    return false;
  }
  partial.append(buf, static_cast<std::size_t>(n));
  std::size_t start = 0;
  for (std::size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::printf("%s%.*s\n", prefix.c_str(), static_cast<int>(nl - start), partial.data() + start);
  }
  partial.erase(0, start);
  if (partial.size() > 65536) {  // a very long line: print what there is
    std::printf("%s%s\n", prefix.c_str(), partial.c_str());
    partial.clear();
  }
  std::fflush(stdout);
  return true;
}

}  // namespace

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

std::vector<int> rankCpus(const std::vector<int>& allowed, int rank, int ranks) {
  MERIDIAN_CHECK_MSG(!allowed.empty() && ranks >= 1 && rank >= 0 && rank < ranks,
                     "rankCpus: rank {} of {} over {} CPUs", rank, ranks, allowed.size());
  const auto c = static_cast<std::int64_t>(allowed.size());
  const std::int64_t lo = rank * c / ranks;
  const std::int64_t hi = std::max(lo + 1, (rank + 1) * c / ranks);
  return {allowed.begin() + lo, allowed.begin() + hi};
}

Result<int> launchLocalRanks(const LocalLaunchOptions& options) {
  if (options.ranks < 1) return invalidArgument("--ranks must be at least 1 (not {})", options.ranks);
  if (options.argv.empty()) return invalidArgument("nothing to launch");
  const bool prefixed = !options.outputPrefixes.empty();
  if (prefixed && options.outputPrefixes.size() != static_cast<std::size_t>(options.ranks)) {
    return invalidArgument("{} output prefixes for {} ranks (want one per rank)", options.outputPrefixes.size(),
                           options.ranks);
  }
  std::string store = options.store;
  int storeListenFd = store.empty() ? -1 : options.storeListenFd;
  LoopbackListener ownListener;  // closed here once every rank is started: rank 0 holds it then
  if (store.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(ownListener, listenOnFreeLoopbackPort());
    store = fmt::format("127.0.0.1:{}", ownListener.port);
    storeListenFd = ownListener.fd.get();
  }
  // Ranks launched here are all ours: without a job secret, give them a fresh random one.
  std::string secret;
  if (!knobIsSet(knobs::kSecret) && !knobIsSet(knobs::kSecretFile)) secret = randomHex(32);
  // Where the ranks will serve metrics (MERIDIAN_METRICS_ADDR's host, its port or the base
  // port, plus the local rank), for Prometheus to find them.
  std::unique_ptr<ScrapeTargetsFile> scrapeTargets;
  if (!options.separateHosts) {
    if (auto base = metricsBaseAddress(); base.has_value()) {
      std::vector<ScrapeTarget> targets;
      for (int r = 0; r < options.ranks; ++r) {
        ScrapeTarget t{fmt::format("{}:{}", base->first, base->second + r), {{"rank", std::to_string(r)}}};
        if (options.rankEnv)
          for (const auto& [k, v] : options.rankEnv(r))
            if (k == "MERIDIAN_REGION") t.labels.emplace_back("region", v);
        targets.push_back(std::move(t));
      }
      scrapeTargets = std::make_unique<ScrapeTargetsFile>(fmt::format("local-{}", ::getpid()), targets);
    }
  }
  // Every rank's CPUs, worked out before any fork (the child only applies them).
  std::vector<std::vector<int>> bindings;
  if (options.bindCpus) {
    const std::vector<int> cpus = allowedCpus();
    for (int r = 0; r < options.ranks; ++r) bindings.push_back(rankCpus(cpus, r, options.ranks));
  }
  const pid_t launcher = ::getpid();
  std::map<pid_t, int> children;  // pid -> rank
  std::vector<pollfd> outputs;     // read ends of the ranks' output pipes
  std::vector<std::string> partials;
  std::vector<int> outputRank;
  std::size_t openOutputs = 0;
  // A rank that cannot be started: the ones already running are stopped and reaped, and the
  // launch fails with `why`.
  auto abandon = [&](Status why) -> Status {
    for (const auto& [p, rank] : children) (void)::kill(p, SIGTERM);  // ESRCH: it has exited already
    for (const auto& [p, rank] : children) (void)::waitpid(p, nullptr, 0);
    for (const auto& o : outputs) (void)::close(o.fd);  // read ends: nothing to flush
    return why;
  };
  // Starts rank r (again, as a joiner of the running job, when `joining`).
  auto start = [&](int r, bool joining) -> Status {
    std::vector<std::pair<std::string, std::string>> env;
    if (options.rankEnv) env = options.rankEnv(r);
    int out[2] = {-1, -1};
    if (prefixed && ::pipe2(out, O_CLOEXEC) != 0) return internalError("pipe: {}", std::strerror(errno));
    pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      if (prefixed) {
        (void)::close(out[0]);  // never used
        (void)::close(out[1]);
      }
      return internalError("fork of rank {}: {}", r, std::strerror(err));
    }
    if (pid == 0) {
      // Set-up a rank cannot do without ends it before exec, as a failed exec does.
      auto childFail = [r](const char* what) {
        std::fprintf(stderr, "meridian: rank %d: %s: %s\n", r, what, std::strerror(errno));
        ::_exit(127);
      };
      // A rank never outlives its launcher: killed (by anything, even SIGKILL), it takes the
      // ranks with it. Checked once more in case it died before the request was in place.
      if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) childFail("prctl(PR_SET_PDEATHSIG)");
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);
      if (prefixed && (::dup2(out[1], STDOUT_FILENO) < 0 || ::dup2(out[1], STDERR_FILENO) < 0)) childFail("dup2");
      if (options.bindCpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (const int c : bindings[static_cast<std::size_t>(r)]) CPU_SET(c, &set);
        if (::sched_setaffinity(0, sizeof(set), &set) != 0)
          std::fprintf(stderr, "meridian: rank %d: cannot bind to its CPUs (%s); running unbound\n", r,
                       std::strerror(errno));
      }
      auto put = [&](const std::string& name, const std::string& value) {
        if (::setenv(name.c_str(), value.c_str(), 1) != 0) childFail("setenv");
      };
      put("MERIDIAN_RANK", std::to_string(r));
      put("MERIDIAN_WORLD_SIZE", std::to_string(options.ranks));
      put("MERIDIAN_LOCAL_RANK", std::to_string(options.separateHosts ? 0 : r));
      put("MERIDIAN_LOCAL_WORLD_SIZE", std::to_string(options.separateHosts ? 1 : options.ranks));
      put("MERIDIAN_STORE", store);
      if (r == 0 && storeListenFd >= 0 && !joining) {
        const int inherited = ::dup(storeListenFd);  // without close-on-exec: it outlives the exec
        if (inherited < 0) childFail("dup of the store socket");
        put(knobs::kStoreFd.name, std::to_string(inherited));
      } else if (::unsetenv(knobs::kStoreFd.name) != 0) {
        childFail("unsetenv");
      }
      if (!secret.empty()) put("MERIDIAN_SECRET", secret);
      for (const auto& [k, v] : options.extraEnv) put(k, v);
      for (const auto& [k, v] : env) put(k, v);
      if (joining) put("MERIDIAN_JOIN", "on");
      if (options.childSetup) {
        std::string err = options.childSetup(r);
        if (!err.empty()) {
          std::fprintf(stderr, "meridian: rank %d: %s\n", r, err.c_str());
          ::_exit(127);
        }
      }
      std::vector<char*> args;
      for (const auto& a : options.argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "meridian: cannot exec %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    if (prefixed) {
      (void)::close(out[1]);  // the rank's write end: nothing was written through it here
      outputs.push_back({out[0], POLLIN, 0});
      partials.emplace_back();
      outputRank.push_back(r);
      ++openOutputs;
    }
    children[pid] = r;
    return Status();
  };
  for (int r = 0; r < options.ranks; ++r) {
    if (Status st = start(r, false); !st.isOk()) return abandon(st);
  }
  ownListener.fd.reset();  // a socket rank 0 now holds: nothing was accepted on it here
  int worst = 0;
  int lostRanks = 0;     // elastic: ranks that failed while the others went on
  int elasticWorst = 0;  // and the worst of their codes
  bool terminating = false;
  auto firstFailure = std::chrono::steady_clock::time_point::max();
  std::set<int> down;  // ranks taken down on purpose, to start again once released
  // Output still open after every rank exited belongs to something a rank left running in
  // the background: read it for a little while, then stop waiting for it.
  constexpr auto kDrainAfterExit = std::chrono::seconds(2);
  auto allExited = std::chrono::steady_clock::time_point::max();
  while (!children.empty() || openOutputs > 0) {
    if (children.empty() && allExited == std::chrono::steady_clock::time_point::max()) {
      allExited = std::chrono::steady_clock::now();
    }
    if (children.empty() && std::chrono::steady_clock::now() - allExited > kDrainAfterExit) {
      for (auto& o : outputs) {
        if (o.fd >= 0) (void)::close(o.fd);  // read ends: nothing to flush
        o.fd = -1;
      }
      break;
    }
    if (openOutputs > 0) {
      if (::poll(outputs.data(), outputs.size(), 20) > 0) {
        for (std::size_t i = 0; i < outputs.size(); ++i) {
          if (outputs[i].fd < 0 || outputs[i].revents == 0) continue;
          const std::string& prefix = options.outputPrefixes[static_cast<std::size_t>(outputRank[i])];
          if (!pumpLines(outputs[i].fd, prefix, partials[i])) {
            (void)::close(outputs[i].fd);  // at EOF: nothing to flush
            outputs[i].fd = -1;
            --openOutputs;
          }
        }
      }
    }
    int status = 0;
    pid_t pid = children.empty() ? 0 : ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && children.count(pid) != 0) {
      int rank = children[pid];
      children.erase(pid);
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (options.takenDown && options.released && options.takenDown(rank)) {
        MLOG_INFO(kCore, "rank {} exited with status {} after it was taken down; it starts again as a joiner once "
                  "released", rank, code);
        down.insert(rank);
        continue;
      }
      if (code != 0 && options.elastic) {
        MLOG_WARN(kCore, "rank {} exited with status {}; the others go on without it (elastic)", rank, code);
        ++lostRanks;
        elasticWorst = std::max(elasticWorst, code);
        continue;
      }
      if (code != 0) {
        if (!terminating) MLOG_ERROR(kCore, "rank {} exited with status {}", rank, code);
        if (firstFailure == std::chrono::steady_clock::time_point::max()) {
          firstFailure = std::chrono::steady_clock::now();
        }
      }
      worst = std::max(worst, code);
      continue;
    }
    if (pid < 0 && errno == ECHILD) children.clear();
    // A released rank starts again while the job runs; once every rank has ended, nobody is
    // left for it to join.
    for (auto it = down.begin(); it != down.end() && !children.empty() && !terminating;) {
      const int rank = *it;
      if (!options.released(rank)) {
        ++it;
        continue;
      }
      it = down.erase(it);
      if (Status st = start(rank, true); !st.isOk()) {
        MLOG_WARN(kCore, "rank {} cannot start again: {}; the others go on without it", rank, st.message());
        ++lostRanks;
        elasticWorst = std::max(elasticWorst, 127);
      } else {
        MLOG_INFO(kCore, "rank {} released: started again as a joiner (MERIDIAN_JOIN=on)", rank);
      }
    }
    if (!terminating && !children.empty() && std::chrono::steady_clock::now() - firstFailure > options.failureGrace) {
      terminating = true;
      for (const auto& [p, rank] : children) {
        MLOG_ERROR(kCore, "stopping rank {} (pid {}) after another rank failed", rank, p);
        if (::kill(p, SIGTERM) != 0 && errno != ESRCH) {  // ESRCH: it exited meanwhile; waitpid reaps it
          MLOG_WARN(kCore, "cannot stop rank {} (pid {}): {}", rank, p, std::strerror(errno));
        }
      }
    }
    if (openOutputs == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Elastic: a rank ends well only once the job reached its end, so one that did says the job
  // survived the ranks it lost (their places may have been taken by joiners started elsewhere).
  if (options.elastic && lostRanks > 0 && lostRanks == options.ranks) return elasticWorst;
  return worst;
}

int hostCores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

bool localRanksOutnumberCores() {
  // A malformed MERIDIAN_LOCAL_WORLD_SIZE counts as "no": the launch detection reports it.
  static const bool value = [] {
    const Result<std::int64_t> local = readKnobInt(knobs::kLocalWorldSize);
    return local.isOk() && local.value() > hostCores();
  }();
  return value;
}

std::vector<std::string> relaunchArgv(int argc, char** argv, const std::vector<std::string>& drop) {
  std::vector<std::string> out{"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool skip = false;
    for (const std::string& d : drop) {
      if (arg == d) {
        ++i;  // and its value
        skip = true;
      } else if (arg.rfind(d + "=", 0) == 0) {
        skip = true;
      }
    }
    if (!skip) out.push_back(arg);
  }
  return out;
}

}  // namespace meridian
