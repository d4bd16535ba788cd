#include "nccl_plugin/plugin_core.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/knobs.h"
#include "core/local_launch.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/secret.h"
#include "core/wire.h"
#include "routing/path_judge.h"

namespace meridian::plugin {

namespace {

constexpr std::uint32_t kHandleMagic = 0x4844524D;  // "MRDH"
// 2: the listener's device endpoint (transport/device.h) in place of ip and port per path.
constexpr std::uint8_t kHandleVersion = 2;
constexpr std::size_t kHandleHeaderBytes = 24;
static_assert(kHandleHeaderBytes + ConnectHandle::kMaxEndpointBytes == ConnectHandle::kBytes);
constexpr int kUnknownSpeedMbps = 10'000;
// How often the routing monitor judges the send connections' paths (the device reads TCP_INFO
// once a second; a quicker look acts on a fresh reading sooner).
constexpr auto kJudgePeriod = std::chrono::milliseconds(250);

// A nonzero id from the CSPRNG (OpenSSL): listen ids name a listener on the wire, and one a
// peer could predict from earlier ones would let it answer for another connection.
Result<std::uint64_t> randomId() {
  std::uint64_t v = 0;
  try {
    while (v == 0) {
      std::uint8_t bytes[sizeof v];
      randomBytes(bytes);
      std::memcpy(&v, bytes, sizeof v);
    }
  } catch (const std::exception& e) {
    return internalError("cannot draw a random id: {}", e.what());
  }
  return v;
}

// Interface name and IPv4 address of every interface that is up (loopback last).
std::vector<std::pair<std::string, std::string>> upInterfaces() {
  std::vector<std::pair<std::string, std::string>> out, loopback;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof(ip));
    ((i->ifa_flags & IFF_LOOPBACK) ? loopback : out).emplace_back(i->ifa_name, ip);
  }
  ::freeifaddrs(all);
  std::sort(out.begin(), out.end());
  out.insert(out.end(), loopback.begin(), loopback.end());
  return out;
}

std::string interfaceOf(const std::string& ip, const std::vector<std::pair<std::string, std::string>>& ifs) {
  for (const auto& [name, addr] : ifs) {
    if (addr == ip) return name;
  }
  return {};
}

int linkSpeedMbps(const std::string& iface) {
  std::ifstream f("/sys/class/net/" + iface + "/speed");
  int mbps = -1;
  if (f >> mbps && mbps > 0) return mbps;
  return kUnknownSpeedMbps;  // loopback, veth and TUN report none
}

std::string sysfsPath(const std::string& iface) {
  std::error_code ec;
  for (const std::string& p : {"/sys/class/net/" + iface + "/device", "/sys/class/net/" + iface}) {
    auto real = std::filesystem::canonical(p, ec);
    if (!ec) return real.string();
  }
  return "/sys/devices/virtual/net/" + iface;
}

Status checkedIndex(int dev, int count) {
  if (dev < 0 || dev >= count) return invalidArgument("no device {} (the plugin has {})", dev, count);
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------- the handle

Status encodeHandle(const ConnectHandle& h, std::span<std::uint8_t, ConnectHandle::kBytes> out) {
  if (h.endpoint.empty() || h.endpoint.size() > ConnectHandle::kMaxEndpointBytes) {
    return invalidArgument("a device endpoint of {} bytes does not fit a connection handle (1 to {}; at most {} paths)",
                           h.endpoint.size(), ConnectHandle::kMaxEndpointBytes, ConnectHandle::kMaxPaths);
  }
  std::fill(out.begin(), out.end(), 0);
  wire::store<std::uint32_t>(&out[0], kHandleMagic);
  out[4] = kHandleVersion;
  out[5] = static_cast<std::uint8_t>(h.endpoint.size());
  wire::store<std::uint64_t>(&out[8], h.listenId);
  wire::store<std::uint64_t>(&out[16], h.pending);
  std::copy(h.endpoint.begin(), h.endpoint.end(), out.begin() + kHandleHeaderBytes);
  return Status::ok();
}

Result<ConnectHandle> decodeHandle(std::span<const std::uint8_t, ConnectHandle::kBytes> in) {
  if (wire::load<std::uint32_t>(&in[0]) != kHandleMagic) return invalidArgument("not a Meridian connection handle");
  if (in[4] != kHandleVersion) return invalidArgument("connection handle version {} (this plugin speaks {})", in[4], kHandleVersion);
  const std::size_t bytes = in[5];
  if (bytes == 0 || bytes > ConnectHandle::kMaxEndpointBytes) {
    return invalidArgument("connection handle with an endpoint of {} bytes (1 to {})", bytes,
                           ConnectHandle::kMaxEndpointBytes);
  }
  ConnectHandle h;
  h.listenId = wire::load<std::uint64_t>(&in[8]);
  h.pending = wire::load<std::uint64_t>(&in[16]);
  h.endpoint.assign(in.begin() + kHandleHeaderBytes, in.begin() + kHandleHeaderBytes + static_cast<std::ptrdiff_t>(bytes));
  return h;
}

void setHandlePending(std::span<std::uint8_t, ConnectHandle::kBytes> handle, std::uint64_t pending) {
  wire::store<std::uint64_t>(&handle[16], pending);
}

// ---------------------------------------------------------------- measured links

namespace {

// One selected plane's row of a report matrix: the values from the region, -1 where null.
struct PlaneRow {
  int index = 0;
  std::vector<double> values;
};

struct ReportRows {
  std::vector<std::string> regions;
  std::size_t from = 0;
  std::vector<PlaneRow> rows;  // the planes of `planes` that carry `key`
};

// Reads `key` (an n x n matrix of non-negative numbers or nulls) of the report's planes
// among `planes`, the row of `region`. A plane without `key` is left out when `optional`.
Result<ReportRows> reportRows(std::string_view reportJson, const std::string& region, const std::vector<int>& planes,
                              const char* key, bool optional) {
  using nlohmann::json;
  const json report = json::parse(reportJson, nullptr, false);
  if (report.is_discarded() || !report.is_object()) return invalidArgument("not a JSON object");
  const json& names = report.value("regions", json());
  const json& planeList = report.value("planes", json());
  if (!names.is_array() || !planeList.is_array()) return invalidArgument("no \"regions\" and \"planes\" arrays");
  ReportRows out;
  for (const json& n : names) {
    if (!n.is_string()) return invalidArgument("a region name that is not a string");
    out.regions.push_back(n.get<std::string>());
  }
  const auto own = std::find(out.regions.begin(), out.regions.end(), region);
  if (own == out.regions.end()) {
    return invalidArgument("region '{}' is not in the report (it has: {})", region, fmt::join(out.regions, ", "));
  }
  const std::size_t nr = out.regions.size();
  out.from = static_cast<std::size_t>(own - out.regions.begin());
  for (const json& plane : planeList) {
    if (!plane.is_object()) return invalidArgument("a plane that is not an object");
    const json& index = plane.value("index", json());
    if (!index.is_number_integer()) return invalidArgument("a plane without an integer \"index\"");
    if (std::find(planes.begin(), planes.end(), index.get<int>()) == planes.end()) continue;
    if (optional && !plane.contains(key)) continue;
    const json& cells = plane.value(key, json());
    if (!cells.is_array() || cells.size() != nr * nr) {
      return invalidArgument("plane {}: {} holds {} values, not {} x {}", index.get<int>(), key,
                             cells.is_array() ? cells.size() : 0, nr, nr);
    }
    PlaneRow row{index.get<int>(), std::vector<double>(nr, -1)};
    for (std::size_t to = 0; to < nr; ++to) {
      const json& v = cells[out.from * nr + to];
      if (v.is_null()) continue;
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        return invalidArgument("plane {}: a {} value that is not a non-negative number", index.get<int>(), key);
      }
      row.values[to] = v.get<double>();
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

// The cell of `values` to judge the device by: `better` picks among the other regions'
// cells (the farthest round trip, the slowest rate); the region's own cell when there is no
// other. -1 when the row has none.
template <typename Better>
double pickCell(const ReportRows& r, const std::vector<double>& values, Better better, std::string& toRegion) {
  double picked = -1;
  for (std::size_t to = 0; to < values.size(); ++to) {
    if (to == r.from || values[to] < 0) continue;
    if (picked < 0 || better(values[to], picked)) {
      picked = values[to];
      toRegion = r.regions[to];
    }
  }
  if (picked < 0 && values[r.from] >= 0) {
    picked = values[r.from];
    toRegion = r.regions[r.from];
  }
  return picked;
}

}  // namespace

Result<LinkLatency> latencyFromProbeReport(std::string_view reportJson, const std::string& region,
                                           const std::vector<int>& planes) {
  MERIDIAN_ASSIGN_OR_RETURN(ReportRows r, reportRows(reportJson, region, planes, "min_rtt_ms", false));
  // Per destination region, the best (lowest) minimum round trip over the device's planes.
  std::vector<double> best(r.regions.size(), -1);
  for (const PlaneRow& row : r.rows) {
    for (std::size_t to = 0; to < best.size(); ++to) {
      if (row.values[to] >= 0 && (best[to] < 0 || row.values[to] < best[to])) best[to] = row.values[to];
    }
  }
  LinkLatency out;
  const double farthest = pickCell(r, best, [](double a, double b) { return a > b; }, out.toRegion);
  if (farthest < 0) return invalidArgument("no round trip from region '{}' on plane(s) {}", region, fmt::join(planes, ", "));
  out.oneWayUs = farthest * 1000 / 2;
  return out;
}

Result<std::optional<LinkSpeed>> speedFromProbeReport(std::string_view reportJson, const std::string& region,
                                                      const std::vector<int>& planes) {
  MERIDIAN_ASSIGN_OR_RETURN(ReportRows r, reportRows(reportJson, region, planes, "rate_mbps", true));
  if (r.rows.empty()) return std::optional<LinkSpeed>();
  LinkSpeed out;
  std::vector<int> without;
  for (const PlaneRow& row : r.rows) {
    std::string to;
    const double slowest = pickCell(r, row.values, [](double a, double b) { return a < b; }, to);
    if (slowest < 0) {
      without.push_back(row.index);
      continue;
    }
    if (out.toRegion.empty()) out.toRegion = to;
    out.mbps += slowest;
  }
  if (!without.empty()) {
    return invalidArgument("no rate from region '{}' on plane(s) {} of the device", region, fmt::join(without, ", "));
  }
  return std::optional<LinkSpeed>(out);
}

namespace {

// The device's latency from MERIDIAN_NCCL_LINKS (when set).
Status applyMeasuredLinks(const std::string& path, DeviceInfo& info, const std::vector<int>& planes) {
  const std::string region = knobString(knobs::kRegion);
  if (region.empty()) return invalidArgument("MERIDIAN_NCCL_LINKS is set but MERIDIAN_REGION is not: which row is this node's?");
  constexpr std::uintmax_t kMaxReportBytes = 16u << 20;
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return invalidArgument("MERIDIAN_NCCL_LINKS={}: {}", path, ec.message());
  if (size > kMaxReportBytes) return invalidArgument("MERIDIAN_NCCL_LINKS={}: {} bytes (at most {})", path, size, kMaxReportBytes);
  std::ifstream f(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (!f.good() && !f.eof()) return invalidArgument("MERIDIAN_NCCL_LINKS={}: cannot read it", path);
  auto got = latencyFromProbeReport(text, region, planes);
  if (!got) return got.status().withContext(fmt::format("MERIDIAN_NCCL_LINKS={}", path));
  info.latencyUs = static_cast<float>(got->oneWayUs);
  MLOG_INFO(kPlugin, "device {}: latency {:.0f} us, one way from {} to {} (measured, {})", info.name, got->oneWayUs,
            region, got->toRegion, path);
  auto speed = speedFromProbeReport(text, region, planes);
  if (!speed) return speed.status().withContext(fmt::format("MERIDIAN_NCCL_LINKS={}", path));
  if (!speed->has_value()) {
    MLOG_INFO(kPlugin, "device {}: speed {} Mbit/s from the kernel (the report has no rates: meridian-probe --rate-seconds)",
              info.name, info.speedMbps);
    return Status::ok();
  }
  // NCCL takes an int of Mbit/s; a measured rate under 1 Mbit/s still says "slow", not "unknown".
  info.speedMbps = std::max(1, static_cast<int>(std::lround((*speed)->mbps)));
  info.speedMeasured = true;
  MLOG_INFO(kPlugin, "device {}: speed {} Mbit/s, the slowest rate from {} (to {}) summed over its planes (measured, {})",
            info.name, info.speedMbps, region, (*speed)->toRegion, path);
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------- comms

struct ListenComm {
  int dev = 0;
  std::uint64_t listenId = 0;
};

// A send connection as the routing monitor sees it (shared: closeSend may drop the comm
// while a judging round still holds it).
struct Route {
  int connectionId = 0;
  transport::ChannelPtr channel;
  routing::PathJudge judge;  // the monitor's, under Core::judgeMu_
};

struct SendComm {
  int dev = 0;
  std::uint64_t listenId = 0;
  int connectionId = 0;
  transport::ChannelPtr channel;
  std::shared_ptr<Route> route;
  int inflight = 0;  // under Core::mu_
};

struct RecvComm {
  int dev = 0;
  std::uint64_t listenId = 0;
  int peer = 0;
  transport::ChannelPtr channel;
  int inflight = 0;
};

struct PluginRequest {
  const void* owner = nullptr;
  int* inflight = nullptr;
  std::vector<transport::RequestPtr> parts;  // one per buffer
};

// ---------------------------------------------------------------- Core

Result<Core*> Core::instance() {
  static std::mutex mu;
  static Core* core = nullptr;  // never destroyed: NCCL may call in while the process exits
  static Status failed = Status::ok();
  std::lock_guard lock(mu);
  if (core != nullptr) return core;
  if (!failed.isOk()) return failed;
  auto fresh = std::unique_ptr<Core>(new Core());
  Status st = fresh->init();
  if (!st.isOk()) {
    failed = st;
    return st;
  }
  core = fresh.release();
  // At exit, stop the devices' threads before the statics they use (logger, metrics) are
  // destroyed: those exist already, so this handler runs before their destructors.
  (void)log::logger();
  (void)MetricsRegistry::global();
  std::atexit([] {
    core->stopMonitor();
    for (auto& d : core->devices_) d.transport.reset();
  });
  if (core->adaptive_) core->monitor_ = std::thread([] { core->monitorLoop(); });
  return core;
}

void Core::monitorLoop() {
  pthread_setname_np(pthread_self(), "mer-nccl-route");
  // Nothing leaves this thread (NCCL's process must not end here): a broken invariant stops
  // re-weighting, and the connections keep their last weights.
  try {
    std::unique_lock lock(monitorMu_);
    while (!monitorCv_.wait_for(lock, kJudgePeriod, [&] { return stopping_; })) {
      lock.unlock();
      judgePathsOnce();
      lock.lock();
    }
  } catch (const std::exception& e) {
    MLOG_ERROR(kPlugin, "path monitor stopped: {}", e.what());
  }
}

void Core::stopMonitor() {
  {
    std::lock_guard lock(monitorMu_);
    stopping_ = true;
  }
  monitorCv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

void Core::judgePathsOnce() {
  std::vector<std::shared_ptr<Route>> routes;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, comm] : sends_) routes.push_back(comm->route);
  }
  std::lock_guard judging(judgeMu_);
  const std::int64_t now = nowUs();
  for (const auto& r : routes) {
    const std::vector<transport::PathStats> stats = r->channel->pathStats();
    std::optional<std::vector<double>> weights = r->judge.update(now, stats);
    for (std::size_t path : r->judge.changed()) {
      const routing::PathVerdict& v = r->judge.verdicts()[path];
      MLOG_INFO(kPlugin, "connection {}: path {} ({}) {}: {}", r->connectionId, path, stats[path].localAddress,
                v.state == routing::CongestionState::kCongested ? "congested" : "clear again", v.reason);
    }
    if (weights) r->channel->setPathWeights(*weights);
  }
}

Status Core::init() {
  transport::setWaitersShareCores(localRanksOutnumberCores());
  const auto ifs = upInterfaces();
  std::vector<std::string> paths = splitCommaList(knobString(knobs::kPaths));
  if (paths.empty()) {
    for (const auto& [name, ip] : ifs) {
      if (name != "lo") paths.push_back(ip);
    }
    if (paths.empty()) paths.push_back("127.0.0.1");
  }
  if (paths.size() > ConnectHandle::kMaxPaths) {
    return invalidArgument("{} paths; a connection handle holds at most {} (set MERIDIAN_PATHS)", paths.size(),
                           ConnectHandle::kMaxPaths);
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::string mode, readKnobChoice(knobs::kNcclDevices));
  MERIDIAN_ASSIGN_OR_RETURN(const std::string routingMode, readKnobChoice(knobs::kRouting));
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t timeoutMs, readKnobInt(knobs::kTimeoutMs));
  connectTimeout_ = std::chrono::milliseconds(timeoutMs);
  std::vector<std::vector<std::string>> groups;
  if (mode == "virtual") {
    groups.push_back(paths);
  } else {
    for (const auto& p : paths) groups.push_back({p});
  }
  adaptive_ = routingMode == "adaptive";
  for (std::size_t d = 0; d < groups.size(); ++d) {
    Device dev;
    dev.info.name = fmt::format("meridian{}", d);
    dev.info.addresses = groups[d];
    dev.info.speedMbps = 0;
    for (const auto& ip : groups[d]) {
      std::string iface = interfaceOf(ip, ifs);
      dev.info.interfaces.push_back(iface.empty() ? "?" : iface);
      dev.info.speedMbps += iface.empty() ? kUnknownSpeedMbps : linkSpeedMbps(iface);
    }
    dev.info.pciPath = sysfsPath(dev.info.interfaces.front());
    dev.info.guid = std::hash<std::string>{}(fmt::format("{}", fmt::join(groups[d], ",")));
    if (const std::string links = knobString(knobs::kNcclLinks); !links.empty()) {
      std::vector<int> planes;
      if (mode == "virtual") {
        for (std::size_t p = 0; p < paths.size(); ++p) planes.push_back(static_cast<int>(p));
      } else {
        planes.push_back(static_cast<int>(d));
      }
      MERIDIAN_RETURN_IF_ERROR(applyMeasuredLinks(links, dev.info, planes));
    }
    transport::DeviceOptions o;
    o.localAddresses = groups[d];
    o.name = fmt::format("nccl{}", d);
    o.adaptive = adaptive_;
    o.labelPeersByHost = true;
    MERIDIAN_ASSIGN_OR_RETURN(dev.transport, transport::Device::create(std::move(o)));
    devices_.push_back(std::move(dev));
  }
  return Status::ok();
}

Result<ListenComm*> Core::listen(int dev, std::span<std::uint8_t, ConnectHandle::kBytes> handle) {
  MERIDIAN_RETURN_IF_ERROR(checkedIndex(dev, deviceCount()));
  auto comm = std::make_unique<ListenComm>();
  comm->dev = dev;
  MERIDIAN_ASSIGN_OR_RETURN(comm->listenId, randomId());
  ConnectHandle h;
  h.listenId = comm->listenId;
  h.endpoint = devices_[static_cast<std::size_t>(dev)].transport->endpoint();
  MERIDIAN_RETURN_IF_ERROR(encodeHandle(h, handle));
  std::lock_guard lock(mu_);
  ListenComm* raw = comm.get();
  listens_[raw] = std::move(comm);
  return raw;
}

Result<SendComm*> Core::connect(int dev, std::span<std::uint8_t, ConnectHandle::kBytes> handle) {
  MERIDIAN_RETURN_IF_ERROR(checkedIndex(dev, deviceCount()));
  MERIDIAN_ASSIGN_OR_RETURN(ConnectHandle h, decodeHandle(handle));
  std::unique_lock lock(mu_);
  if (h.pending == 0) {
    auto p = std::make_unique<PendingConnect>();
    p->dev = dev;
    MERIDIAN_ASSIGN_OR_RETURN(const std::uint64_t drawn, randomId());
    p->connectionId = static_cast<int>(drawn % (INT_MAX - 1)) + 1;
    transport::ChannelSpec spec;
    spec.sessionId = h.listenId;
    spec.selfRank = p->connectionId;
    spec.peerRank = 0;  // the listener
    spec.initiate = true;
    spec.peer = h.endpoint;
    const auto deadline = Clock::now() + connectTimeout_;
    transport::Device* device = devices_[static_cast<std::size_t>(dev)].transport.get();
    p->result = std::async(std::launch::async, [device, spec, deadline] { return device->openChannel(spec, deadline); });
    const std::uint64_t id = nextPending_++;
    pending_[id] = std::move(p);
    setHandlePending(handle, id);
    return nullptr;
  }
  auto it = pending_.find(h.pending);
  if (it == pending_.end()) return invalidArgument("connection handle names no connect in progress");
  PendingConnect& p = *it->second;
  if (p.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return nullptr;
  Result<transport::ChannelPtr> ch = p.result.get();
  auto comm = std::make_unique<SendComm>();
  comm->dev = p.dev;
  comm->listenId = h.listenId;
  comm->connectionId = p.connectionId;
  pending_.erase(it);
  setHandlePending(handle, 0);
  if (!ch) return ch.status().withContext("connect");
  comm->channel = std::move(ch).value();
  comm->route = std::make_shared<Route>();
  comm->route->connectionId = comm->connectionId;
  comm->route->channel = comm->channel;
  SendComm* raw = comm.get();
  sends_[raw] = std::move(comm);
  return raw;
}

Result<RecvComm*> Core::accept(ListenComm* listen) {
  std::unique_lock lock(mu_);
  auto it = listens_.find(listen);
  if (it == listens_.end()) return invalidArgument("accept on an unknown or closed listen comm");
  const int dev = it->second->dev;
  const std::uint64_t id = it->second->listenId;
  lock.unlock();
  auto got = devices_[static_cast<std::size_t>(dev)].transport->acceptChannel(id);
  if (!got) {
    if (got.status().code() == StatusCode::kAgain) return nullptr;
    return got.status();
  }
  auto comm = std::make_unique<RecvComm>();
  comm->dev = dev;
  comm->listenId = id;
  comm->peer = got->first;
  comm->channel = std::move(got->second);
  lock.lock();
  RecvComm* raw = comm.get();
  recvs_[raw] = std::move(comm);
  return raw;
}

Result<MemHandle*> Core::regMr(void* data, std::size_t size, int type) {
  // Every device registers the range (regIsGlobal): fabric rails for sends in place, through
  // their registration caches, so sub-ranges of a registered buffer, as NCCL registers
  // them over and over, cost no new registration; TCP alone registers nothing.
  auto mr = std::make_unique<MemHandle>(MemHandle{data, size, type, {}});
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    auto region = devices_[d].transport->registerMemory(data, size);
    if (!region) {
      for (std::size_t i = 0; i < mr->regions.size(); ++i) (void)devices_[i].transport->deregisterMemory(mr->regions[i]);
      return region.status();
    }
    mr->regions.push_back(region.value());
  }
  std::lock_guard lock(mu_);
  MemHandle* raw = mr.get();
  mrs_[raw] = std::move(mr);
  return raw;
}

Status Core::deregMr(MemHandle* mr) {
  std::unique_ptr<MemHandle> owned;
  {
    std::lock_guard lock(mu_);
    auto it = mrs_.find(mr);
    if (it == mrs_.end()) return invalidArgument("deregMr of an unknown memory handle");
    owned = std::move(it->second);
    mrs_.erase(it);
  }
  Status first;
  for (std::size_t d = 0; d < owned->regions.size(); ++d) {
    Status st = devices_[d].transport->deregisterMemory(owned->regions[d]);
    if (first.isOk() && !st.isOk()) first = st;
  }
  return first;
}

Result<PluginRequest*> Core::isend(SendComm* comm, void* data, std::size_t size, int tag) {
  std::lock_guard lock(mu_);
  if (!sends_.count(comm)) return invalidArgument("isend on an unknown or closed send comm");
  if (comm->inflight >= kMaxRequestsPerComm) return nullptr;
  MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr r,
                            comm->channel->isend(data, size, static_cast<std::uint32_t>(tag)));
  auto req = std::make_unique<PluginRequest>();
  req->owner = comm;
  req->inflight = &comm->inflight;
  req->parts.push_back(std::move(r));
  ++comm->inflight;
  PluginRequest* raw = req.get();
  requests_[raw] = std::move(req);
  return raw;
}

Result<PluginRequest*> Core::irecv(RecvComm* comm, int n, void** data, const std::size_t* sizes, const int* tags) {
  if (n < 1 || n > kMaxRecvs) return invalidArgument("irecv of {} buffers (1 to {})", n, kMaxRecvs);
  std::lock_guard lock(mu_);
  if (!recvs_.count(comm)) return invalidArgument("irecv on an unknown or closed receive comm");
  if (comm->inflight >= kMaxRequestsPerComm) return nullptr;
  auto req = std::make_unique<PluginRequest>();
  req->owner = comm;
  req->inflight = &comm->inflight;
  for (int i = 0; i < n; ++i) {
    MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr r,
                              comm->channel->irecv(data[i], sizes[i], static_cast<std::uint32_t>(tags[i])));
    req->parts.push_back(std::move(r));
  }
  ++comm->inflight;
  PluginRequest* raw = req.get();
  requests_[raw] = std::move(req);
  return raw;
}

Result<bool> Core::test(PluginRequest* request, int* sizes) {
  std::lock_guard lock(mu_);
  auto it = requests_.find(request);
  if (it == requests_.end()) return invalidArgument("test of an unknown or finished request");
  for (const auto& part : request->parts) {
    if (!part->test()) return false;
  }
  Status st = Status::ok();
  for (std::size_t i = 0; i < request->parts.size(); ++i) {
    const auto& part = request->parts[i];
    if (!part->status().isOk() && st.isOk()) st = part->status();
    if (sizes != nullptr) sizes[i] = static_cast<int>(std::min<std::size_t>(part->bytes(), INT_MAX));
  }
  --*request->inflight;
  requests_.erase(it);
  if (!st.isOk()) return st;
  return true;
}

namespace {
template <typename Map>
void dropRequestsOf(Map& requests, const void* owner) {
  std::erase_if(requests, [&](const auto& entry) { return entry.second->owner == owner; });
}
}  // namespace

Status Core::closeSend(SendComm* comm) {
  std::unique_lock lock(mu_);
  auto it = sends_.find(comm);
  if (it == sends_.end()) return invalidArgument("closeSend of an unknown or closed send comm");
  std::unique_ptr<SendComm> owned = std::move(it->second);
  sends_.erase(it);
  dropRequestsOf(requests_, comm);
  lock.unlock();
  return devices_[static_cast<std::size_t>(owned->dev)].transport->closeChannel(owned->listenId, 0);
}

Status Core::closeRecv(RecvComm* comm) {
  std::unique_lock lock(mu_);
  auto it = recvs_.find(comm);
  if (it == recvs_.end()) return invalidArgument("closeRecv of an unknown or closed receive comm");
  std::unique_ptr<RecvComm> owned = std::move(it->second);
  recvs_.erase(it);
  dropRequestsOf(requests_, comm);
  lock.unlock();
  return devices_[static_cast<std::size_t>(owned->dev)].transport->closeChannel(owned->listenId, owned->peer);
}

Status Core::closeListen(ListenComm* comm) {
  std::lock_guard lock(mu_);
  if (listens_.erase(comm) == 0) return invalidArgument("closeListen of an unknown or closed listen comm");
  return Status::ok();
}

bool Core::isListen(const void* p) const {
  std::lock_guard lock(mu_);
  return listens_.count(p) > 0;
}
bool Core::isSend(const void* p) const {
  std::lock_guard lock(mu_);
  return sends_.count(p) > 0;
}
bool Core::isRecv(const void* p) const {
  std::lock_guard lock(mu_);
  return recvs_.count(p) > 0;
}
bool Core::isRequest(const void* p) const {
  std::lock_guard lock(mu_);
  return requests_.count(p) > 0;
}

}  // namespace meridian::plugin
