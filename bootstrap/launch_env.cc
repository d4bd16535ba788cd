// Launcher detection and rendezvous at the bootstrap store.
#include "bootstrap/launch_env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <array>
#include <charconv>
#include <memory>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace tcp = transport::tcp;

namespace {

// The variables a launcher sets; localWorldSize is null where it must be derived.
struct LauncherVars {
  const char* launcher;
  const char* rank;
  const char* worldSize;
  const char* localRank;
  const char* localWorldSize;
};

constexpr LauncherVars kMeridianVars{"meridian", "MERIDIAN_RANK", "MERIDIAN_WORLD_SIZE", nullptr, nullptr};
constexpr LauncherVars kOpenMpiVars{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr LauncherVars kTorchrunVars{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr LauncherVars kSlurmVars{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

// Launcher variables are not Meridian knobs: this file is the one place that reads them.
std::optional<std::string> launcherVar(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool isSet(const char* name) { return launcherVar(name).has_value(); }

Result<int> parseInt(const std::string& text, const char* name) {
  int value = 0;
  const char* last = text.data() + text.size();
  auto [end, ec] = std::from_chars(text.data(), last, value);
  if (ec == std::errc::result_out_of_range) return invalidArgument("{}='{}' is out of range", name, text);
  if (ec != std::errc() || end != last) return invalidArgument("{}='{}' is not an integer", name, text);
  return value;
}

Result<std::optional<int>> optionalInt(const char* name) {
  if (name == nullptr) return std::optional<int>();
  auto text = launcherVar(name);
  if (!text) return std::optional<int>();
  MERIDIAN_ASSIGN_OR_RETURN(const int value, parseInt(*text, name));
  return std::optional<int>(value);
}

// How many tasks Slurm put on node `nodeId`, from a spec like "2(x3),1".
Result<int> slurmTasksOnNode(const std::string& spec, int nodeId, const char* name) {
  int firstNode = 0;
  std::string_view rest = spec;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    int tasks = 0;
    int repeat = 1;
    const char* last = item.data() + item.size();
    auto [end, ec] = std::from_chars(item.data(), last, tasks);
    if (ec == std::errc() && end != last) {
      // "(xN)"
      if (last - end < 4 || end[0] != '(' || end[1] != 'x' || last[-1] != ')') ec = std::errc::invalid_argument;
      else {
        auto [repeatEnd, repeatEc] = std::from_chars(end + 2, last - 1, repeat);
        if (repeatEc != std::errc() || repeatEnd != last - 1) ec = std::errc::invalid_argument;
      }
    }
    if (ec != std::errc() || tasks < 1 || repeat < 1) return invalidArgument("{}='{}' is not a Slurm tasks-per-node list", name, spec);
    if (nodeId < firstNode + repeat) return tasks;
    firstNode += repeat;
  }
  return invalidArgument("{}='{}' lists {} nodes, but SLURM_NODEID is {}", name, spec, firstNode, nodeId);
}

// Tasks on this node under Slurm, or -1 when Slurm does not say.
Result<int> slurmLocalWorldSize(int worldSize) {
  for (const char* nodesVar : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::optional<int> nodes, optionalInt(nodesVar));
    if (!nodes) continue;
    if (*nodes == 1) return worldSize;
    break;
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::optional<int> nodeId, optionalInt("SLURM_NODEID"));
  if (!nodeId) return -1;
  if (*nodeId < 0) return invalidArgument("SLURM_NODEID={} is negative", *nodeId);
  for (const char* specVar : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto spec = launcherVar(specVar)) return slurmTasksOnNode(*spec, *nodeId, specVar);
  }
  return -1;
}

Result<LaunchInfo> readMeridianKnobs() {
  if (!knobIsSet(knobs::kRank) || !knobIsSet(knobs::kWorldSize)) {
    return invalidArgument("{} is set but {} is not: set both, or neither to use the launcher's variables",
                           knobIsSet(knobs::kRank) ? "MERIDIAN_RANK" : "MERIDIAN_WORLD_SIZE",
                           knobIsSet(knobs::kRank) ? "MERIDIAN_WORLD_SIZE" : "MERIDIAN_RANK");
  }
  LaunchInfo info;
  info.launcher = kMeridianVars.launcher;
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t rank, readKnobInt(knobs::kRank));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t worldSize, readKnobInt(knobs::kWorldSize));
  info.rank = static_cast<int>(rank);
  info.worldSize = static_cast<int>(worldSize);
  if (info.worldSize == 1) {
    info.localRank = 0;
    info.localWorldSize = 1;
  }
  if (knobIsSet(knobs::kLocalRank)) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t localRank, readKnobInt(knobs::kLocalRank, 0, INT_MAX));
    info.localRank = static_cast<int>(localRank);
  }
  if (knobIsSet(knobs::kLocalWorldSize)) {
    MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t localWorldSize, readKnobInt(knobs::kLocalWorldSize, 1, INT_MAX));
    info.localWorldSize = static_cast<int>(localWorldSize);
  }
  return info;
}

Result<LaunchInfo> readLauncher(const LauncherVars& vars) {
  LaunchInfo info;
  info.launcher = vars.launcher;
  MERIDIAN_ASSIGN_OR_RETURN(info.rank, parseInt(*launcherVar(vars.rank), vars.rank));
  MERIDIAN_ASSIGN_OR_RETURN(info.worldSize, parseInt(*launcherVar(vars.worldSize), vars.worldSize));
  MERIDIAN_ASSIGN_OR_RETURN(const std::optional<int> localRank, optionalInt(vars.localRank));
  MERIDIAN_ASSIGN_OR_RETURN(const std::optional<int> localWorldSize, optionalInt(vars.localWorldSize));
  if (localRank) {
    if (*localRank < 0) return invalidArgument("{}={} is negative", vars.localRank, *localRank);
    info.localRank = *localRank;
  }
  if (localWorldSize) {
    if (*localWorldSize < 1) return invalidArgument("{}={}: must be at least 1", vars.localWorldSize, *localWorldSize);
    info.localWorldSize = *localWorldSize;
  }
  return info;
}

Status validate(const LaunchInfo& info, const LauncherVars& vars) {
  if (info.worldSize < 1) return invalidArgument("{}={}: the world size must be at least 1", vars.worldSize, info.worldSize);
  if (info.rank < 0 || info.rank >= info.worldSize) {
    return invalidArgument("{}={} is outside [0, {}) set by {}", vars.rank, info.rank, info.worldSize, vars.worldSize);
  }
  const char* localRankName = vars.localRank != nullptr ? vars.localRank : "the local rank";
  const char* localSizeName = vars.localWorldSize != nullptr ? vars.localWorldSize : "the tasks per node";
  if (info.localWorldSize > info.worldSize) {
    return invalidArgument("{}={} exceeds {}={}", localSizeName, info.localWorldSize, vars.worldSize, info.worldSize);
  }
  if (info.localRank >= 0 && info.localWorldSize > 0 && info.localRank >= info.localWorldSize) {
    return invalidArgument("{}={} is outside [0, {}) set by {}", localRankName, info.localRank, info.localWorldSize,
                           localSizeName);
  }
  return Status::ok();
}

Status checkStoreAddress(const std::string& address, const char* source, int worldSize) {
  auto hp = tcp::parseHostPort(address);
  if (!hp) return hp.status().withContext(source);
  if (hp->port == 0 && worldSize > 1) {
    return invalidArgument("{}: '{}' has port 0, which only a world of 1 can use", source, address);
  }
  return Status::ok();
}

Result<std::string> storeAddressFor(const LaunchInfo& info) {
  if (knobIsSet(knobs::kStore)) {
    std::string address = knobString(knobs::kStore);
    MERIDIAN_RETURN_IF_ERROR(checkStoreAddress(address, "MERIDIAN_STORE", info.worldSize));
    return address;
  }
  const bool allLocal = info.worldSize == 1 || info.localWorldSize == info.worldSize;
  const auto masterAddr = launcherVar("MASTER_ADDR");
  const auto masterPort = launcherVar("MASTER_PORT");
  if (masterAddr && !masterPort) {
    return invalidArgument("MASTER_ADDR is set but MASTER_PORT is not: set MASTER_PORT, or MERIDIAN_STORE=host:port");
  }
  if (masterPort && (masterAddr || allLocal)) {
    std::string address = fmt::format("{}:{}", masterAddr.value_or("127.0.0.1"), *masterPort);
    MERIDIAN_RETURN_IF_ERROR(checkStoreAddress(address, "MASTER_ADDR/MASTER_PORT", info.worldSize));
    return address;
  }
  if (info.worldSize == 1) return std::string("127.0.0.1:0");  // nobody else needs to find it
  if (allLocal) return std::string(kDefaultLocalStore);
  return invalidArgument(
      "no store address: set MERIDIAN_STORE=host:port to an address of rank 0's host that every rank can reach "
      "({} ranks under {}, {} of them on this host)",
      info.worldSize, info.launcher, info.localWorldSize < 0 ? std::string("unknown how many") : std::to_string(info.localWorldSize));
}

}  // namespace

Result<LaunchInfo> detectLaunch() {
  const LauncherVars* vars = nullptr;
  Result<LaunchInfo> found = internalError("no launcher");
  if (knobIsSet(knobs::kRank) || knobIsSet(knobs::kWorldSize)) {
    vars = &kMeridianVars;
    found = readMeridianKnobs();
  } else {
    for (const LauncherVars* candidate : {&kOpenMpiVars, &kTorchrunVars, &kSlurmVars}) {
      if (isSet(candidate->rank) && isSet(candidate->worldSize)) {
        vars = candidate;
        found = readLauncher(*candidate);
        break;
      }
    }
  }
  if (vars == nullptr) {
    LaunchInfo single;
    single.rank = 0;
    single.worldSize = 1;
    single.localRank = 0;
    single.localWorldSize = 1;
    single.launcher = "none";
    MLOG_INFO(kCollectives, "no launcher variables found: running as a single process (rank 0 of 1)");
    found = single;
  }
  if (!found) return found.status();
  LaunchInfo info = std::move(found).value();
  if (vars == &kSlurmVars) {
    MERIDIAN_ASSIGN_OR_RETURN(info.localWorldSize, slurmLocalWorldSize(info.worldSize));
  }
  if (vars != nullptr) MERIDIAN_RETURN_IF_ERROR(validate(info, *vars));
  MERIDIAN_ASSIGN_OR_RETURN(info.storeAddress, storeAddressFor(info));
  return info;
}

Result<std::unique_ptr<Store>> rendezvous(const LaunchInfo& info, const std::string& secret, TimePoint deadline,
                                          std::unique_ptr<StoreServer>* serverOut) {
  if (info.worldSize < 1 || info.rank < 0 || info.rank >= info.worldSize) {
    return invalidArgument("rendezvous: rank {} is outside a world of {}", info.rank, info.worldSize);
  }
  MERIDIAN_ASSIGN_OR_RETURN(const tcp::HostPort where, tcp::parseHostPort(info.storeAddress));
  std::string connectAddress = info.storeAddress;
  if (info.rank == 0) {
    if (serverOut == nullptr) return invalidArgument("rendezvous: rank 0 hosts the store and needs serverOut");
    in_addr literal{};
    const bool isIp = ::inet_pton(AF_INET, where.host.c_str(), &literal) == 1;
    Result<std::unique_ptr<StoreServer>> server = internalError("no store server");
    if (knobIsSet(knobs::kStoreFd)) {
      // The launcher kept the port bound for us (local_launch.h): serve on its socket.
      MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t fd, readKnobInt(knobs::kStoreFd, 0, INT_MAX));
      // Taken once: a later rendezvous in this process, or a process it starts, must not
      // take whatever reuses the number for the store's socket.
      ::unsetenv(knobs::kStoreFd.name);
      server = StoreServer::adopt(static_cast<int>(fd), where.port, secret);
      if (!server) {
        return server.status().withContext(
            fmt::format("rank 0 cannot host the store at {} on {}={}", info.storeAddress, knobs::kStoreFd.name, fd));
      }
    } else {
      server = StoreServer::start(isIp ? where.host : "0.0.0.0", where.port, secret);
    }
    if (!server) {
      return server.status().withContext(fmt::format(
          "rank 0 cannot host the store at {} (is the port taken, e.g. by another job or by torch's own store "
          "on MASTER_PORT? pick a free one with MERIDIAN_STORE)",
          info.storeAddress));
    }
    const std::string connectHost = isIp && where.host != "0.0.0.0" ? where.host : "127.0.0.1";
    connectAddress = fmt::format("{}:{}", connectHost, server.value()->port());
    *serverOut = std::move(server).value();
  } else if (where.port == 0) {
    return invalidArgument("rendezvous: rank {} cannot find a store at port 0 ('{}')", info.rank, info.storeAddress);
  }
  auto store = TcpStore::connect(connectAddress, secret, deadline);
  if (!store) {
    if (info.rank == 0) serverOut->reset();
    return store.status().withContext(fmt::format("rendezvous of rank {} of {}", info.rank, info.worldSize));
  }
  MLOG_INFO(kCollectives, "rank {} of {} (launcher {}) joined the store at {}", info.rank, info.worldSize,
            info.launcher, connectAddress);
  return std::unique_ptr<Store>(std::move(store).value());
}

// The local IPv4 address the kernel would use to reach host:port (no packet is sent).
std::string localAddressToward(const std::string& hostPort) {
  std::size_t colon = hostPort.rfind(':');
  std::string host = colon == std::string::npos ? hostPort : hostPort.substr(0, colon);
  const std::string port = colon == std::string::npos ? std::string() : hostPort.substr(colon + 1);
  const char* service = port.empty() || port == "0" ? "1" : port.c_str();  // any port will do
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), service, &hints, &res) != 0 || res == nullptr) return "127.0.0.1";
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() || ::connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0) return "127.0.0.1";
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) return "127.0.0.1";
  std::array<char, INET_ADDRSTRLEN> buf{};
  if (::inet_ntop(AF_INET, &local.sin_addr, buf.data(), buf.size()) == nullptr) return "127.0.0.1";
  return buf.data();
}

std::vector<std::string> localPathAddresses(const LaunchInfo& info) {
  std::vector<std::string> paths = splitCommaList(knobString(knobs::kPaths));
  if (paths.empty()) paths = {localAddressToward(info.storeAddress)};
  return paths;
}

std::vector<std::string> withoutPorts(std::vector<std::string> addresses) {
  for (auto& a : addresses) a = a.substr(0, a.find(':'));
  return addresses;
}

}  // namespace meridian::bootstrap
