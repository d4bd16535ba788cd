#include "lab/lab.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/file_util.h"
#include "core/secret.h"
#include "core/local_launch.h"
#include "core/scrape_targets.h"
#include "lab/emulator.h"
#include "lab/netns.h"

extern char** environ;

namespace meridian::lab {

namespace fs = std::filesystem;

namespace {

std::string stateDirOf(const std::string& name) { return fmt::format("{}/{}", kStateRoot, name); }

bool processAlive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// True when `pid` is a meridian-lab process (the pid may have been reused since).
bool isLabProcess(int pid) {
  std::ifstream f(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return cmd.find("meridian-lab") != std::string::npos;
}

// Sends SIGTERM, waits up to `grace`, then SIGKILL.
void stopProcess(int pid, std::chrono::milliseconds grace) {
  if (!processAlive(pid)) return;
  // kill: ESRCH when it exited meanwhile (processAlive says so next); waitpid: ECHILD when it
  // is not our child (a daemon of an earlier `up`), which then is not ours to reap.
  (void)::kill(pid, SIGTERM);
  auto until = std::chrono::steady_clock::now() + grace;
  while (processAlive(pid) && std::chrono::steady_clock::now() < until) {
    (void)::waitpid(pid, nullptr, WNOHANG);  // reaps it when it is our child
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (processAlive(pid)) {
    (void)::kill(pid, SIGKILL);
    (void)::waitpid(pid, nullptr, 0);
  }
}

// PIDs of the processes whose network namespace is `ns` (what `ip netns pids` does).
std::vector<int> pidsInNamespace(const std::string& ns) {
  std::vector<int> pids;
  struct stat target {};
  if (::stat(fmt::format("/run/netns/{}", ns).c_str(), &target) != 0) return pids;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return pids;
  while (dirent* e = ::readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    struct stat st {};
    if (::stat(fmt::format("/proc/{}/ns/net", e->d_name).c_str(), &st) != 0) continue;
    if (st.st_ino == target.st_ino && st.st_dev == target.st_dev) pids.push_back(std::atoi(e->d_name));
  }
  ::closedir(d);
  return pids;
}

nlohmann::json stateJson(const LabState& s, const std::string& topologyFile) {
  return {{"name", s.name},
          {"topology_file", topologyFile},
          {"time_scale", s.topology.timeScale},
          {"emulator_pid", s.emulatorPid},
          {"namespaces", s.namespaces},
          {"mgmt_index", s.mgmtIndex}};
}

// The management subnet index of every lab that has state on this host.
std::vector<int> mgmtIndicesInUse() {
  std::vector<int> used;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(kStateRoot, ec)) {
    std::ifstream f(entry.path() / "state.json");
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_discarded() && j.is_object()) used.push_back(j.value("mgmt_index", 0));
  }
  return used;
}

// The lowest subnet index no lab uses and no interface of that name exists for.
Result<int> pickMgmtIndex() {
  const std::vector<int> used = mgmtIndicesInUse();
  for (int i = 1; i < 255; ++i) {
    if (std::find(used.begin(), used.end(), i) != used.end()) continue;
    if (fs::exists("/sys/class/net/mrdmgmt" + std::to_string(i))) continue;
    bool leftover = false;  // a veth of a lab whose namespace the kernel is still removing
    std::error_code ec;
    for (const auto& dev : fs::directory_iterator("/sys/class/net", ec))
      leftover = leftover || dev.path().filename().string().rfind(fmt::format("mrdm{}v", i), 0) == 0;
    if (!leftover) return i;
  }
  return invalidArgument("no free management subnet (198.19.1-254.0/24): take some labs down");
}

Status createMgmtNetwork(const LabState& s) {
  const std::string bridge = s.mgmtBridge();
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "link", "add", bridge, "type", "bridge"}));
  MERIDIAN_RETURN_IF_ERROR(
      runCommand({"ip", "addr", "add", fmt::format("198.19.{}.1/24", s.mgmtIndex), "dev", bridge}));
  MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "link", "set", bridge, "up"}));
  for (int n = 0; n < static_cast<int>(s.namespaces.size()); ++n) {
    const std::string& ns = s.namespaces[static_cast<std::size_t>(n)];
    const std::string host = fmt::format("mrdm{}v{}", s.mgmtIndex, n);
    MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "link", "add", host, "type", "veth", "peer", "name", "mgmt", "netns", ns}));
    MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "link", "set", host, "master", bridge, "up"}));
    MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "-n", ns, "addr", "add", s.mgmtAddress(n) + "/24", "dev", "mgmt"}));
    MERIDIAN_RETURN_IF_ERROR(runCommand({"ip", "-n", ns, "link", "set", "mgmt", "up"}));
  }
  return Status::ok();
}

std::string scrapeJob(const std::string& labName) { return "lab-" + labName; }

Status saveState(const LabState& s, const std::string& topologyFile) {
  return writeFileAtomically(s.dir + "/state.json", stateJson(s, topologyFile).dump(2) + "\n");
}

Result<UniqueFd> listenControl(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return internalError("cannot remove the old control socket {}: {}", path, errnoText(errno));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return invalidArgument("control socket path too long: {}", path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd.get(), 16) != 0) {
    return internalError("cannot listen on {}: {}", path, std::strerror(errno));
  }
  if (::chmod(path.c_str(), 0600) != 0) return internalError("chmod {}: {}", path, errnoText(errno));
  return fd;
}

std::string envName(const std::string& plane) {
  std::string s = "MERIDIAN_LAB_ADDR_";
  for (char c : plane) s += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Removes whatever of the lab exists; collects problems rather than stopping at the first.
Status teardown(const std::string& dir, int emulatorPid, const std::vector<std::string>& namespaces, int mgmtIndex) {
  std::vector<std::string> problems;
  if (emulatorPid > 0 && processAlive(emulatorPid) && isLabProcess(emulatorPid)) {
    stopProcess(emulatorPid, std::chrono::milliseconds(3000));
  }
  // The management veths first, synchronously: the kernel removes those of a deleted
  // namespace only later, and the next lab would trip over their names.
  for (std::size_t n = 0; mgmtIndex > 0 && n < namespaces.size(); ++n) {
    const std::string veth = fmt::format("mrdm{}v{}", mgmtIndex, n);
    if (!fs::exists("/sys/class/net/" + veth)) continue;
    Status st = runCommand({"ip", "link", "del", veth});
    if (!st.isOk()) problems.push_back(st.message());
  }
  for (const auto& ns : namespaces) {
    for (int pid : pidsInNamespace(ns)) stopProcess(pid, std::chrono::milliseconds(2000));
    Status st = deleteNamespace(ns);
    if (!st.isOk()) problems.push_back(st.message());
  }
  if (mgmtIndex > 0 && fs::exists("/sys/class/net/mrdmgmt" + std::to_string(mgmtIndex))) {
    Status st = runCommand({"ip", "link", "del", "mrdmgmt" + std::to_string(mgmtIndex)});
    if (!st.isOk()) problems.push_back(st.message());
  }
  removeScrapeTargets(scrapeJob(fs::path(dir).filename().string()));
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) problems.push_back(fmt::format("cannot remove {}: {}", dir, ec.message()));
  if (problems.empty()) return Status::ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
  return internalError("{}", all);
}

}  // namespace

Status validateLabName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 16 && std::islower(static_cast<unsigned char>(name[0]));
  for (char c : name) ok = ok && (std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)));
  if (!ok) return invalidArgument("bad lab name '{}': 1-16 lower-case letters and digits, starting with a letter", name);
  return Status::ok();
}

Result<LabState> loadLab(const std::string& name) {
  MERIDIAN_RETURN_IF_ERROR(validateLabName(name));
  LabState s;
  s.name = name;
  s.dir = stateDirOf(name);
  std::ifstream f(s.dir + "/state.json");
  if (!f) return invalidArgument("no lab named '{}' is up (no {}/state.json): run meridian-lab up FILE", name, s.dir);
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return internalError("{}/state.json is damaged: run meridian-lab down", s.dir);
  MERIDIAN_ASSIGN_OR_RETURN(s.topology, loadTopology(s.dir + "/topology.yaml"));
  s.topology.timeScale = j.value("time_scale", s.topology.timeScale);
  s.emulatorPid = j.value("emulator_pid", 0);
  s.namespaces = j.value("namespaces", std::vector<std::string>{});
  s.mgmtIndex = j.value("mgmt_index", 0);
  return s;
}

Status labUp(const std::string& topologyFile, const UpOptions& options) {
  MERIDIAN_RETURN_IF_ERROR(validateLabName(options.name));
  MERIDIAN_RETURN_IF_ERROR(requireRoot());
  MERIDIAN_RETURN_IF_ERROR(requireTun());
  MERIDIAN_ASSIGN_OR_RETURN(Topology topo, loadTopology(topologyFile));
  if (options.timeScale) {
    if (!(*options.timeScale > 0 && *options.timeScale <= 10)) {
      return invalidArgument("--time-scale must be within (0, 10], not {}", *options.timeScale);
    }
    topo.timeScale = *options.timeScale;
  }
  LabState s;
  s.name = options.name;
  s.dir = stateDirOf(options.name);
  s.topology = topo;
  for (int n = 0; n < static_cast<int>(topo.nodes.size()); ++n) s.namespaces.push_back(s.namespaceOf(n));

  // One lab per name: a live one is refused, one left by a crash is cleaned first.
  if (fs::exists(s.dir + "/state.json")) {
    auto old = loadLab(options.name);
    if (old.isOk() && processAlive(old->emulatorPid) && isLabProcess(old->emulatorPid)) {
      return invalidArgument("lab '{}' is already up (emulator pid {}): run meridian-lab down first", options.name,
                             old->emulatorPid);
    }
    std::fprintf(stderr, "meridian-lab: removing what a previous run of lab '%s' left behind\n", options.name.c_str());
    MERIDIAN_RETURN_IF_ERROR(labDown(options.name));
  }
  for (const auto& ns : s.namespaces) {
    if (namespaceExists(ns)) {
      return invalidArgument("network namespace '{}' exists and is not this lab's: remove it or use --lab NAME", ns);
    }
  }
  std::error_code ec;
  fs::create_directories(s.dir, ec);
  if (ec) return internalError("cannot create {}: {}", s.dir, ec.message());
  if (::chmod(kStateRoot, 0755) != 0 || ::chmod(s.dir.c_str(), 0700) != 0) {
    return internalError("cannot set the modes of {} and {}: {}", kStateRoot, s.dir, errnoText(errno));
  }

  auto fail = [&](const Status& why) {
    Status t = teardown(s.dir, s.emulatorPid, s.namespaces, s.mgmtIndex);
    if (!t.isOk()) std::fprintf(stderr, "meridian-lab: cleaning up after the failure: %s\n", t.message().c_str());
    return why;
  };
  {
    auto index = pickMgmtIndex();
    if (!index.isOk()) return fail(index.status());
    s.mgmtIndex = *index;
  }
  // Record the plan before creating anything, so that `down` can always finish the job.
  {
    std::ifstream in(topologyFile);
    std::stringstream text;
    text << in.rdbuf();
    Status st = writeFileAtomically(s.dir + "/topology.yaml", text.str());
    if (!st.isOk()) return fail(st);
  }
  if (Status st = saveState(s, topologyFile); !st.isOk()) return fail(st);
  {
    AtomicWriteOptions ownerOnly;
    ownerOnly.mode = 0600;
    if (Status st = writeFileAtomically(s.secretFile(), randomHex(32) + "\n", ownerOnly); !st.isOk()) {
      return fail(st);
    }
  }

  std::vector<std::vector<UniqueFd>> tuns(topo.nodes.size());
  for (int n = 0; n < static_cast<int>(topo.nodes.size()); ++n) {
    const std::string& ns = s.namespaces[static_cast<std::size_t>(n)];
    if (Status st = createNamespace(ns); !st.isOk()) return fail(st);
    // Hosts tuned for long fat pipes, as cloud images for cross-region work are: TCP may
    // grow its windows to 64 MiB (a 230 ms round trip at 2 Gbit/s).
    for (const char* key : {"net/ipv4/tcp_rmem", "net/ipv4/tcp_wmem"}) {
      if (Status st = setSysctlIn(ns, key, "4096 131072 67108864"); !st.isOk()) return fail(st);
    }
    // ... and keep a connection's window across idle gaps (collectives idle between phases);
    // otherwise every op restarts slow start on a 200 ms path.
    if (Status st = setSysctlIn(ns, "net/ipv4/tcp_slow_start_after_idle", "0"); !st.isOk()) return fail(st);
    for (int p = 0; p < static_cast<int>(topo.planes.size()); ++p) {
      auto fd = createTun(ns, topo.planes[static_cast<std::size_t>(p)].name, topo.mtu, topo.address(p, n));
      if (!fd.isOk()) return fail(fd.status());
      tuns[static_cast<std::size_t>(n)].push_back(std::move(fd.value()));
    }
  }
  if (Status st = createMgmtNetwork(s); !st.isOk()) return fail(st);
  auto control = listenControl(s.controlSocket());
  if (!control.isOk()) return fail(control.status());

  if (options.foreground) {
    if (Status st = saveState(s, topologyFile); !st.isOk()) return fail(st);
    s.emulatorPid = ::getpid();
    if (Status st = saveState(s, topologyFile); !st.isOk()) return fail(st);
    std::printf("lab '%s' is up (%s); the emulator runs in the foreground until Ctrl-C\n", s.name.c_str(),
                topo.name.c_str());
    std::fflush(stdout);
    Emulator emu(topo, std::move(tuns), std::move(control.value()));
    Status st = emu.run(true);
    Status t = teardown(s.dir, 0, s.namespaces, s.mgmtIndex);
    return st.isOk() ? t : st;
  }

  // The emulator daemon: owns the TUN fds and the control socket from here on.
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return fail(internalError("pipe: {}", std::strerror(errno)));
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    (void)::close(ready[0]);  // a pipe nothing went through
    (void)::close(ready[1]);
    return fail(internalError("fork: {}", errnoText(e)));
  }
  if (pid == 0) {
    // The daemon's set-up: a step that fails ends it before it reports ready, and `up`
    // fails ("the emulator did not start").
    (void)::close(ready[0]);  // the parent's end
    if (::setsid() < 0 || ::chdir("/") != 0) ::_exit(1);
    int log = ::open((s.dir + "/emulator.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log < 0 || ::dup2(log, STDOUT_FILENO) < 0 || ::dup2(log, STDERR_FILENO) < 0) ::_exit(1);
    if (null < 0 || ::dup2(null, STDIN_FILENO) < 0) ::_exit(1);
    if (::signal(SIGHUP, SIG_IGN) == SIG_ERR) ::_exit(1);
    int code = 0;
    {
      Emulator emu(topo, std::move(tuns), std::move(control.value()));
      // "Ready" only once the emulator can forward: a failed set-up fails `up`.
      Status prepared = emu.prepare(true);
      char ok = prepared.isOk() ? 1 : 0;
      // A failed write reads as "not ready" on the other end, which then stops us.
      (void)::write(ready[1], &ok, 1);
      (void)::close(ready[1]);
      Status st = prepared.isOk() ? emu.run(true) : prepared;
      if (!st.isOk()) {
        std::fprintf(stderr, "emulator: %s\n", st.message().c_str());
        code = 1;
      }
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  (void)::close(ready[1]);  // the daemon's end
  s.emulatorPid = pid;
  // Recorded at once: if this process dies before the daemon reports, `down` can stop it.
  if (Status st = saveState(s, topologyFile); !st.isOk()) {
    (void)::close(ready[0]);  // read end
    return fail(st);
  }
  tuns.clear();  // the daemon holds them now
  control.value().reset();
  pollfd pfd{ready[0], POLLIN, 0};
  char ok = 0;
  bool started = ::poll(&pfd, 1, 10000) == 1 && ::read(ready[0], &ok, 1) == 1 && ok == 1;
  (void)::close(ready[0]);  // read end
  if (!started) return fail(internalError("the emulator did not start; see {}/emulator.log", s.dir));
  if (Status st = saveState(s, topologyFile); !st.isOk()) return fail(st);

  {
    std::vector<ScrapeTarget> targets;
    for (int n = 0; n < static_cast<int>(topo.nodes.size()); ++n) {
      const Node& node = topo.nodes[static_cast<std::size_t>(n)];
      targets.push_back({s.metricsAddress(n),
                         {{"lab", s.name}, {"node", node.name}, {"region", topo.regions[static_cast<std::size_t>(node.region)].name}}});
    }
    Status st = writeScrapeTargets(scrapeJob(s.name), targets);
    if (!st.isOk()) std::fprintf(stderr, "meridian-lab: Prometheus will not find the nodes: %s\n", st.message().c_str());
  }
  std::printf("lab '%s' is up: topology %s (%s), time scale %g, emulator pid %d\n", s.name.c_str(), topo.name.c_str(),
              topologyFile.c_str(), topo.timeScale, pid);
  std::printf("%-16s %-12s %-22s", "node", "region", "namespace");
  for (const auto& p : topo.planes) std::printf(" %-16s", p.name.c_str());
  std::printf(" %-16s\n", "metrics");
  for (int n = 0; n < static_cast<int>(topo.nodes.size()); ++n) {
    const Node& node = topo.nodes[static_cast<std::size_t>(n)];
    std::printf("%-16s %-12s %-22s", node.name.c_str(), topo.regions[static_cast<std::size_t>(node.region)].name.c_str(),
                s.namespaceOf(n).c_str());
    for (int p = 0; p < static_cast<int>(topo.planes.size()); ++p) std::printf(" %-16s", topo.address(p, n).c_str());
    std::printf(" %s\n", s.metricsAddress(n).c_str());
  }
  std::printf("next: meridian-lab run %s -- CMD | exec-all -- CMD | status | set | down\n",
              topo.nodes.front().name.c_str());
  return Status::ok();
}

Status labDown(const std::string& name) {
  MERIDIAN_RETURN_IF_ERROR(validateLabName(name));
  MERIDIAN_RETURN_IF_ERROR(requireRoot());
  const std::string dir = stateDirOf(name);
  std::ifstream f(dir + "/state.json");
  if (!f) {
    std::error_code ec;
    if (fs::exists(dir, ec)) fs::remove_all(dir, ec);
    return invalidArgument("no lab named '{}' is up", name);
  }
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return internalError("{}/state.json is damaged; remove {} by hand", dir, dir);
  return teardown(dir, j.value("emulator_pid", 0), j.value("namespaces", std::vector<std::string>{}),
                  j.value("mgmt_index", 0));
}

std::vector<std::pair<std::string, std::string>> nodeEnvironment(const LabState& lab, int node) {
  const Topology& t = lab.topology;
  const Node& n = t.nodes[static_cast<std::size_t>(node)];
  std::vector<std::pair<std::string, std::string>> env{
      {"MERIDIAN_REGION", t.regions[static_cast<std::size_t>(n.region)].name},
      {"MERIDIAN_LAB", lab.name},
      {"MERIDIAN_LAB_NODE", n.name},
      {"MERIDIAN_LAB_RANK", std::to_string(n.index)},
      {"MERIDIAN_LAB_NODES", std::to_string(t.nodes.size())}};
  std::string paths, planes;
  for (int p = 0; p < static_cast<int>(t.planes.size()); ++p) {
    const Plane& plane = t.planes[static_cast<std::size_t>(p)];
    env.emplace_back(envName(plane.name), t.address(p, node));
    if (plane.fabric) continue;
    paths += (paths.empty() ? "" : ",") + t.address(p, node);
    planes += (planes.empty() ? "" : ",") + plane.name;
  }
  if (std::getenv("MERIDIAN_PATHS") == nullptr) {
    env.emplace_back("MERIDIAN_PATHS", paths);
    env.emplace_back("MERIDIAN_PLANES", planes);
  }
  // The fabric plane: libfabric's tcp;ofi_rxm provider on that plane's interface (the domain
  // an IP provider lists is the interface's name), required rather than tried. What the
  // caller set wins, as for the paths.
  if (const int f = t.fabricPlane(); f >= 0) {
    const std::pair<const char*, std::string> fabric[] = {
        {"MERIDIAN_FABRIC", "on"},
        {"MERIDIAN_FABRIC_PROVIDER", "tcp;ofi_rxm"},
        {"MERIDIAN_FABRIC_DOMAIN", t.planes[static_cast<std::size_t>(f)].name}};
    for (const auto& [k, v] : fabric) {
      if (std::getenv(k) == nullptr) env.emplace_back(k, v);
    }
  }
  if (std::getenv("MERIDIAN_METRICS_ADDR") == nullptr && lab.mgmtIndex > 0)
    env.emplace_back("MERIDIAN_METRICS_ADDR", lab.metricsAddress(node));
  // The lab's own job secret (made at `up`, readable by root only), unless the caller set one.
  if (std::getenv("MERIDIAN_SECRET") == nullptr && std::getenv("MERIDIAN_SECRET_FILE") == nullptr &&
      ::access(lab.secretFile().c_str(), R_OK) == 0) {
    env.emplace_back("MERIDIAN_SECRET_FILE", lab.secretFile());
  }
  return env;
}

std::string LabState::metricsAddress(int node) const { return fmt::format("{}:{}", mgmtAddress(node), kMetricsBasePort); }

Status execInNode(const LabState& lab, const std::string& node, const std::vector<std::string>& argv) {
  if (argv.empty()) return invalidArgument("run: no command (meridian-lab run NODE -- CMD ...)");
  MERIDIAN_ASSIGN_OR_RETURN(int n, lab.topology.findNode(node));
  MERIDIAN_RETURN_IF_ERROR(enterNamespaceForGood(lab.namespaceOf(n)));
  for (const auto& [k, v] : nodeEnvironment(lab, n)) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  return invalidArgument("cannot run '{}' in {}: {}", argv[0], node, std::strerror(errno));
}

Result<int> execAll(const LabState& lab, const std::vector<std::string>& argv) {
  const Topology& t = lab.topology;
  LocalLaunchOptions o;
  o.ranks = static_cast<int>(t.nodes.size());
  o.argv = argv;
  o.separateHosts = true;
  UniqueFd storeListener;  // rank 0 inherits it (MERIDIAN_STORE_FD): the port is the job's from here on
  if (const char* store = std::getenv("MERIDIAN_STORE")) {
    o.store = store;
  } else {
    // A port of the first node's, so that two jobs in one lab do not meet, kept listening
    // until rank 0's store serves on the very socket.
    int port = 29400;
    if (auto fd = socketIn(lab.namespaceOf(0), AF_INET, SOCK_STREAM); fd.isOk()) {
      sockaddr_in a = ipv4Address(t.address(0, 0), 0);
      socklen_t len = sizeof(a);
      if (::bind(fd->get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd->get(), SOMAXCONN) == 0 &&
          ::getsockname(fd->get(), reinterpret_cast<sockaddr*>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
        storeListener = std::move(fd).value();
      }
    }
    o.store = fmt::format("{}:{}", t.address(0, 0), port);
    o.storeListenFd = storeListener.get();
  }
  o.rankEnv = [&lab](int rank) { return nodeEnvironment(lab, rank); };
  o.takenDown = [&lab](int rank) { return nodeTakenDown(lab, rank); };
  o.released = [&lab](int rank) { return nodeReleased(lab, rank); };
  o.childSetup = [&lab](int rank) {
    Status st = enterNamespaceForGood(lab.namespaceOf(rank));
    return st.isOk() ? std::string() : st.message();
  };
  std::size_t width = 0;
  for (const auto& n : t.nodes) width = std::max(width, n.name.size());
  for (const auto& n : t.nodes) o.outputPrefixes.push_back(fmt::format("[{:<{}}] ", n.name, width));
  return launchLocalRanks(o);
}

Result<nlohmann::json> setLink(const LabState& lab, const std::string& plane, const std::string& src,
                               const std::string& dst, const LinkChange& change, bool bothWays) {
  if (change.empty()) return invalidArgument("set: nothing to change (--delay, --rate, --loss, --jitter, --queue)");
  nlohmann::json c = nlohmann::json::object();
  if (change.delayUs) c["delay_us"] = *change.delayUs;
  if (change.jitterUs) c["jitter_us"] = *change.jitterUs;
  if (change.rateBitsPerSec) c["rate_bps"] = *change.rateBitsPerSec;
  if (change.queueBytes) c["queue_bytes"] = *change.queueBytes;
  if (change.loss) c["loss"] = *change.loss;
  if (change.cut) c["cut"] = *change.cut;
  return controlRequest(lab.controlSocket(),
                        {{"cmd", "set"}, {"plane", plane}, {"src", src}, {"dst", dst}, {"both", bothWays}, {"change", c}});
}

Result<nlohmann::json> restoreLink(const LabState& lab, const std::string& plane, const std::string& src,
                                   const std::string& dst, bool bothWays) {
  return controlRequest(lab.controlSocket(),
                        {{"cmd", "restore"}, {"plane", plane}, {"src", src}, {"dst", dst}, {"both", bothWays}});
}

Status isolateRegion(const LabState& lab, const std::string& region, bool isolate) {
  MERIDIAN_RETURN_IF_ERROR(lab.topology.findRegion(region).status());
  if (lab.topology.regions.size() < 2) {
    return invalidArgument("a topology of one region has nothing to {} {} from", isolate ? "isolate" : "reconnect", region);
  }
  LinkChange cut;
  cut.cut = true;
  for (const Plane& plane : lab.topology.planes) {
    for (const Region& other : lab.topology.regions) {
      if (other.name == region) continue;
      MERIDIAN_RETURN_IF_ERROR(isolate ? setLink(lab, plane.name, region, other.name, cut, true).status()
                                       : restoreLink(lab, plane.name, region, other.name, true).status());
    }
  }
  return Status();
}

namespace {

// kill/drain write `down/<node>`; restart adds `down/<node>.restart`; exec-all's launcher
// removes both when it starts the rank again.
std::string downMark(const LabState& lab, int node) {
  return fmt::format("{}/down/{}", lab.dir, lab.topology.nodes[static_cast<std::size_t>(node)].name);
}

}  // namespace

Result<std::string> nodeAction(const LabState& lab, const std::string& node, NodeAction action) {
  MERIDIAN_ASSIGN_OR_RETURN(const int n, lab.topology.findNode(node));
  const std::string mark = downMark(lab, n);
  std::error_code ec;
  if (action == NodeAction::kRestart) {
    if (!fs::exists(mark, ec)) return invalidArgument("node {} is not down (meridian-lab kill or drain it first)", node);
    MERIDIAN_RETURN_IF_ERROR(writeFileAtomically(mark + ".restart", "restart\n"));
    return fmt::format("{}: released; its rank under exec-all starts again as a joiner once its processes exited", node);
  }
  fs::create_directories(lab.dir + "/down", ec);
  if (ec) return internalError("cannot create {}/down: {}", lab.dir, ec.message());
  fs::remove(mark + ".restart", ec);  // a release nobody took up belongs to an earlier run
  MERIDIAN_RETURN_IF_ERROR(writeFileAtomically(mark, action == NodeAction::kKill ? "kill\n" : "drain\n"));
  const int sig = action == NodeAction::kKill ? SIGKILL : SIGTERM;
  int signalled = 0;
  for (const int pid : pidsInNamespace(lab.namespaceOf(n))) {
    if (pid == ::getpid() || pid == lab.emulatorPid) continue;
    if (::kill(pid, sig) == 0) ++signalled;  // ESRCH: it exited meanwhile
  }
  return fmt::format("{}: {} sent to {} process{}; marked down until `meridian-lab restart {}`", node,
                     action == NodeAction::kKill ? "SIGKILL" : "SIGTERM", signalled, signalled == 1 ? "" : "es", node);
}

bool nodeTakenDown(const LabState& lab, int node) {
  std::error_code ec;
  return fs::exists(downMark(lab, node), ec);
}

bool nodeReleased(const LabState& lab, int node) {
  const std::string mark = downMark(lab, node);
  std::error_code ec;
  if (!fs::exists(mark + ".restart", ec)) return false;
  fs::remove(mark, ec);
  fs::remove(mark + ".restart", ec);
  return true;
}

Result<std::string> statusText(const LabState& lab) {
  MERIDIAN_ASSIGN_OR_RETURN(nlohmann::json j, controlRequest(lab.controlSocket(), {{"cmd", "status"}}));
  const Topology& t = lab.topology;
  std::string out = fmt::format("lab '{}': topology {}, time scale {}, emulator pid {}, up {:.1f} s\n", lab.name,
                                t.name, t.timeScale, lab.emulatorPid, j.value("uptime_s", 0.0));
  const auto& links = j["links"];
  const std::size_t r = t.regions.size();
  std::size_t col = 10;
  for (const auto& reg : t.regions) col = std::max(col, reg.name.size() + 2);
  for (std::size_t p = 0; p < t.planes.size(); ++p) {
    out += fmt::format("\nplane {}: one-way delay [+-jitter] / rate (world time{})\n", t.planes[p].name,
                       t.timeScale != 1.0 ? fmt::format("; the emulator applies x{}", t.timeScale) : "");
    out += fmt::format("  {:<{}}", "from \\ to", col);
    for (const auto& reg : t.regions) out += fmt::format(" {:<24}", reg.name);
    out += "\n";
    for (std::size_t s = 0; s < r; ++s) {
      out += fmt::format("  {:<{}}", t.regions[s].name, col);
      for (std::size_t d = 0; d < r; ++d) {
        const auto& l = links[(p * r + s) * r + d];
        std::string cell;
        if (l.value("cut", false)) {
          cell = "CUT";
        } else {
          cell = formatDuration(l.value("delay_us", 0.0));
          if (l.value("jitter_us", 0.0) > 0) cell += "+-" + formatDuration(l.value("jitter_us", 0.0));
          cell += " / " + (l.value("rate_bps", 0.0) > 0 ? formatRate(l.value("rate_bps", 0.0)) : std::string("inf"));
          if (l.value("loss", 0.0) > 0) cell += fmt::format(" {:.2g}%", 100 * l.value("loss", 0.0));
        }
        out += fmt::format(" {:<24}", cell);
      }
      out += "\n";
    }
  }
  out += fmt::format("\n{:<8} {:<24} {:>10} {:>12} {:>11} {:>10} {:>10} {:>12}\n", "plane", "link", "packets", "bytes",
                     "queue drops", "loss drops", "backlog", "max backlog");
  for (const auto& l : links) {
    if (l.value("packets", 0) == 0 && l.value("queue_drops", 0) == 0 && l.value("loss_drops", 0) == 0) continue;
    out += fmt::format("{:<8} {:<24} {:>10} {:>12} {:>11} {:>10} {:>10} {:>12}\n", l.value("plane", ""),
                       l.value("src", "") + " -> " + l.value("dst", ""), l.value("packets", 0ull),
                       l.value("bytes", 0ull), l.value("queue_drops", 0ull), l.value("loss_drops", 0ull),
                       formatBytes(l.value("backlog_bytes", 0ull)), formatBytes(l.value("max_backlog_bytes", 0ull)));
  }
  const auto& e = j["emulator"];
  out += fmt::format("\nemulator: {} packets in, {} out, {} unroutable, {} over budget, {} write errors, {:.2f} s CPU\n",
                     e.value("packets_in", 0ull), e.value("packets_out", 0ull), e.value("unroutable", 0ull),
                     e.value("overflow_drops", 0ull), e.value("write_errors", 0ull), e.value("cpu_s", 0.0));
  const double outPackets = std::max(1.0, e.value("packets_out", 0.0));
  out += fmt::format("          packets left {:.1f} us late on average (max {:.0f} us; {} over 100 us)\n",
                     e.value("late_sum_us", 0.0) / outPackets, e.value("late_max_us", 0.0),
                     e.value("late_over_100us", 0ull));
  out += fmt::format("\n{:<16} {:<12} {:<22}", "node", "region", "namespace");
  for (const auto& p : t.planes) out += fmt::format(" {:<16}", p.name);
  out += "\n";
  for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
    const Node& node = t.nodes[static_cast<std::size_t>(n)];
    out += fmt::format("{:<16} {:<12} {:<22}", node.name + (nodeTakenDown(lab, n) ? " (down)" : ""),
                       t.regions[static_cast<std::size_t>(node.region)].name, lab.namespaceOf(n));
    for (int p = 0; p < static_cast<int>(t.planes.size()); ++p) out += fmt::format(" {:<16}", t.address(p, n));
    out += "\n";
  }
  return out;
}

}  // namespace meridian::lab
