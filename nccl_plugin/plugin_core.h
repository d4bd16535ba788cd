// The NCCL net plugin's core: NCCL's connection model (listen / connect / accept, one-way
// connections, FIFO per connection, NULL-until-ready, NULL requests for back-pressure) on
// Meridian's multipath TCP channels. No NCCL types and no routing logic here: the API layer
// (plugin_api.cc) validates arguments, catches exceptions and maps Status to ncclResult_t,
// and the channels stripe and fail over by their measured rates.
//
// Devices: by default one virtual device spanning every local path (MERIDIAN_PATHS, or every
// IPv4 interface that is up and not loopback, else loopback), so NCCL sees one NIC and the
// multipath channel stripes inside it; MERIDIAN_NCCL_DEVICES=paths exposes one device per
// path instead.
//
// Routing: with MERIDIAN_ROUTING=adaptive (the default) a monitor thread ("mer-nccl-route")
// judges every send connection's paths four times a second from the kernel's TCP figures of
// their streams (routing::PathJudge: the retransmitted share) and moves traffic off a
// congested path through the channel's path weights, as probed channels do; NCCL's
// connections carry no probe endpoints.
//
// Threads: NCCL calls from its proxy threads; every method is thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"
#include "transport/channel.h"
#include "transport/device.h"

namespace meridian::plugin {

// What listen() hands NCCL to pass to the connecting rank (at most 128 bytes on the wire).
struct ConnectHandle {
  static constexpr std::size_t kBytes = 128;
  static constexpr std::size_t kMaxEndpointBytes = 104;  // what is left after the header
  static constexpr std::size_t kMaxPaths = 12;          // TCP paths whose endpoint fits
  std::uint64_t listenId = 0;               // which listen comm (the channels' session id)
  transport::EndpointName endpoint;         // the listener's device endpoint()
  std::uint64_t pending = 0;                // connector side: its connect in progress (0: none)
};
// Layout: magic "MRDH", version, endpoint length, listen id, pending id, then the endpoint.
// invalidArgument when the endpoint is empty or longer than kMaxEndpointBytes.
Status encodeHandle(const ConnectHandle& h, std::span<std::uint8_t, ConnectHandle::kBytes> out);
// invalidArgument on a wrong magic or version, an endpoint length of 0 or over the bound.
Result<ConnectHandle> decodeHandle(std::span<const std::uint8_t, ConnectHandle::kBytes> in);
// Connector side: records the connect in progress in the handle NCCL passes again.
void setHandlePending(std::span<std::uint8_t, ConnectHandle::kBytes> handle, std::uint64_t pending);

// What a `meridian-probe --json` report (MERIDIAN_NCCL_LINKS) says about one device: half the
// minimum round trip from `region` to the farthest other region over the best of `planes`
// (the device's paths), or within the region when the report has no other. NCCL's `latency`.
struct LinkLatency {
  double oneWayUs = 0;
  std::string toRegion;  // where the farthest round trip goes
};
// invalidArgument naming what is wrong: not JSON, no such region, matrices of the wrong
// size, no round trip from the region on those planes.
Result<LinkLatency> latencyFromProbeReport(std::string_view reportJson, const std::string& region,
                                           const std::vector<int>& planes);

// The device's bulk rate from the same report's `rate_mbps` matrices (meridian-probe
// --rate-seconds): per plane of `planes` the slowest rate from `region` to another region
// (within the region when the report has no other), summed over the planes: the rate the
// device sustains to every region at once. NCCL's `speed`.
struct LinkSpeed {
  double mbps = 0;
  std::string toRegion;  // where the slowest rate of the first plane goes
};
// nullopt when no plane of `planes` carries a rate (a report made without --rate-seconds: the
// kernel's figure stands); invalidArgument as latencyFromProbeReport, or when some planes
// carry rates from the region and others none.
Result<std::optional<LinkSpeed>> speedFromProbeReport(std::string_view reportJson, const std::string& region,
                                                      const std::vector<int>& planes);

struct DeviceInfo {
  std::string name;      // "meridian0"
  std::string pciPath;   // sysfs path of the first path's interface
  std::vector<std::string> addresses;  // local IPv4 per path
  std::vector<std::string> interfaces; // their interface names
  // Measured bulk rate from MERIDIAN_NCCL_LINKS when it has rates, else the summed link speed
  // of the paths (kernel's figure; 10 Gbit/s when unknown).
  int speedMbps = 0;
  float latencyUs = 0;   // from MERIDIAN_NCCL_LINKS when set, else 0 (unknown)
  bool speedMeasured = false;  // speedMbps came from MERIDIAN_NCCL_LINKS' rates
  std::uint64_t guid = 0;
};

// Grouped receives: at most this many buffers in one irecv (maxRecvs).
inline constexpr int kMaxRecvs = 8;
inline constexpr int kMaxRequestsPerComm = 32;

struct ListenComm;
struct SendComm;
struct RecvComm;
struct MemHandle {
  void* data = nullptr;
  std::size_t size = 0;
  int type = 0;
  // The range as each device registered it (regIsGlobal: one handle serves every comm), in
  // device order: fabric rails register it; TCP alone needs nothing (key 0).
  std::vector<transport::MemoryRegion> regions;
};
struct PluginRequest;
struct Route;

class Core {
 public:
  // The process's core, created on first use from the environment (MERIDIAN_PATHS,
  // MERIDIAN_NCCL_DEVICES, MERIDIAN_SECRET, ...). Lives until the process exits.
  static Result<Core*> instance();

  int deviceCount() const { return static_cast<int>(devices_.size()); }
  const DeviceInfo& device(int dev) const { return devices_[static_cast<std::size_t>(dev)].info; }

  Result<ListenComm*> listen(int dev, std::span<std::uint8_t, ConnectHandle::kBytes> handle);
  // nullptr while the connection is being set up (call again with the same handle).
  Result<SendComm*> connect(int dev, std::span<std::uint8_t, ConnectHandle::kBytes> handle);
  // nullptr until a connector has all its streams up.
  Result<RecvComm*> accept(ListenComm* listen);

  Result<MemHandle*> regMr(void* data, std::size_t size, int type);
  Status deregMr(MemHandle* mr);  // invalidArgument for a handle regMr did not give

  // nullptr: kMaxRequestsPerComm are in flight; try again later.
  Result<PluginRequest*> isend(SendComm* comm, void* data, std::size_t size, int tag);
  Result<PluginRequest*> irecv(RecvComm* comm, int n, void** data, const std::size_t* sizes, const int* tags);
  // true when done (then `sizes`, when given, gets the bytes per buffer, and the request is
  // freed); an error frees it too.
  Result<bool> test(PluginRequest* request, int* sizes);

  Status closeSend(SendComm* comm);
  Status closeRecv(RecvComm* comm);
  Status closeListen(ListenComm* comm);

  // Is this one of ours (and alive)? For argument checks.
  bool isListen(const void* p) const;
  bool isSend(const void* p) const;
  bool isRecv(const void* p) const;
  bool isRequest(const void* p) const;

 private:
  struct Device {
    DeviceInfo info;
    std::unique_ptr<transport::Device> transport;
  };
  struct PendingConnect {
    int dev = 0;
    int connectionId = 0;
    std::future<Result<transport::ChannelPtr>> result;
  };
  Core() = default;
  Status init();
  void monitorLoop();
  // One round of the routing monitor: judge every send connection's paths, apply weights.
  void judgePathsOnce();
  void stopMonitor();

  bool adaptive_ = true;
  std::chrono::milliseconds connectTimeout_{0};  // MERIDIAN_TIMEOUT_MS, read at init
  std::thread monitor_;
  std::mutex monitorMu_;
  std::condition_variable monitorCv_;
  bool stopping_ = false;  // under monitorMu_
  std::mutex judgeMu_;     // one judging round at a time (the thread, or a test)

  std::vector<Device> devices_;
  mutable std::mutex mu_;
  std::uint64_t nextPending_ = 1;
  std::map<std::uint64_t, std::unique_ptr<PendingConnect>> pending_;
  std::map<const void*, std::unique_ptr<ListenComm>> listens_;
  std::map<const void*, std::unique_ptr<SendComm>> sends_;
  std::map<const void*, std::unique_ptr<RecvComm>> recvs_;
  std::map<const void*, std::unique_ptr<PluginRequest>> requests_;
  std::map<const void*, std::unique_ptr<MemHandle>> mrs_;
};

}  // namespace meridian::plugin
