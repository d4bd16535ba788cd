// The NCCL net plugin's API layer and version shims. Every entry point checks its arguments,
// catches every exception, and maps Meridian's Status to ncclResult_t:
//   kInvalidArgument -> ncclInvalidArgument (a bad handle, comm or size; also a message
//                       larger than its receive buffer, reported by test on the receive)
//   kPathError, kPeerError, kTimeout -> ncclRemoteError (the peer or the network failed)
//   kCommError, kInternal, anything else -> ncclInternalError
// Exported: ncclNetPlugin_v11 (NCCL 2.28), v10, v9 and v8, each a thin shim over the same
// functions; nothing else leaves the library (nccl_plugin/exports.map).
#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <exception>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "core/knobs.h"
#include "core/log.h"
#include "nccl_plugin/net_abi.h"
#include "nccl_plugin/plugin_core.h"

namespace meridian::plugin {
namespace {

std::atomic<MerNcclLogger> gLogger{nullptr};

void ncclLog(int level, const std::string& text) {
  if (MerNcclLogger logger = gLogger.load()) logger(level, kNcclLogNet, "meridian", 0, "%s", text.c_str());
}

template <typename... Args>
void ncclInfo(fmt::format_string<Args...> f, Args&&... args) {
  ncclLog(kNcclLogInfo, "NET/Meridian : " + fmt::format(f, std::forward<Args>(args)...));
}

// Meridian's own log lines go to NCCL's logger (NCCL_DEBUG decides what shows).
class NcclSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const int level = msg.level >= spdlog::level::warn   ? kNcclLogWarn
                      : msg.level == spdlog::level::info ? kNcclLogInfo
                                                         : kNcclLogTrace;
    ncclLog(level, "NET/Meridian : " + std::string(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}
};

int toNccl(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk: return kNcclSuccess;
    case StatusCode::kInvalidArgument: return kNcclInvalidArgument;
    case StatusCode::kPathError:
    case StatusCode::kPeerError:
    case StatusCode::kTimeout: return kNcclRemoteError;
    default: return kNcclInternalError;
  }
}

int fail(const char* what, const Status& st) {
  ncclLog(kNcclLogWarn, fmt::format("NET/Meridian : {}: {}", what, st.toString()));
  return toNccl(st);
}

// Runs `body` (returning an ncclResult_t), turning any exception into ncclInternalError.
template <typename F>
int guarded(const char* what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    ncclLog(kNcclLogWarn, fmt::format("NET/Meridian : {}: {}", what, e.what()));
  } catch (...) {
    ncclLog(kNcclLogWarn, fmt::format("NET/Meridian : {}: unknown exception", what));
  }
  return kNcclInternalError;
}

Core* core() {
  auto c = Core::instance();
  return c ? c.value() : nullptr;
}

int initCore(MerNcclLogger logger) {
  if (logger != nullptr) gLogger.store(logger);
  return guarded("init", [&] {
    if (logger != nullptr) {
      static std::once_flag once;
      std::call_once(once, [] { log::logger().sinks().assign(1, std::make_shared<NcclSink>()); });
    }
    auto c = Core::instance();
    if (!c) return fail("init", c.status());
    for (int d = 0; d < c.value()->deviceCount(); ++d) {
      const DeviceInfo& dev = c.value()->device(d);
      std::vector<std::string> paths;
      for (std::size_t p = 0; p < dev.addresses.size(); ++p) paths.push_back(dev.interfaces[p] + "/" + dev.addresses[p]);
      const std::string region = knobString(knobs::kRegion);
      ncclInfo("device {} {}: {} path(s) [{}], {} Mbit/s ({}), latency {}, region {}", d, dev.name, dev.addresses.size(),
               fmt::join(paths, ", "), dev.speedMbps, dev.speedMeasured ? "measured" : "link speed",
               dev.latencyUs > 0 ? fmt::format("{:.0f} us (measured)", dev.latencyUs) : std::string("unknown"),
               region.empty() ? "(MERIDIAN_REGION not set)" : region);
    }
    return kNcclSuccess;
  });
}

int devices(int* ndev) {
  return guarded("devices", [&] {
    if (ndev == nullptr) return fail("devices", invalidArgument("ndev is NULL"));
    Core* c = core();
    *ndev = c != nullptr ? c->deviceCount() : 0;
    return kNcclSuccess;
  });
}

int getProperties(int dev, MerNcclProps_v11* props) {
  return guarded("getProperties", [&] {
    Core* c = core();
    if (props == nullptr || c == nullptr || dev < 0 || dev >= c->deviceCount()) {
      return fail("getProperties", invalidArgument("device {} or props invalid", dev));
    }
    const DeviceInfo& d = c->device(dev);
    *props = MerNcclProps_v11{};
    props->name = const_cast<char*>(d.name.c_str());
    props->pciPath = const_cast<char*>(d.pciPath.c_str());
    props->guid = d.guid;
    props->ptrSupport = kNcclPtrHost;
    props->regIsGlobal = 1;  // regMr only remembers a range: valid for every comm
    props->forceFlush = 0;
    props->speed = d.speedMbps;
    props->port = 0;
    props->latency = d.latencyUs;
    props->maxComms = 65536;
    props->maxRecvs = kMaxRecvs;
    props->netDeviceType = kNcclNetDeviceHost;
    props->netDeviceVersion = 0;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = std::size_t{1} << 31;
    props->maxCollBytes = std::size_t{1} << 31;
    props->maxMultiRequestSize = 1;
    return kNcclSuccess;
  });
}

std::span<std::uint8_t, ConnectHandle::kBytes> handleSpan(void* handle) {
  return std::span<std::uint8_t, ConnectHandle::kBytes>(static_cast<std::uint8_t*>(handle), ConnectHandle::kBytes);
}

int listenDev(int dev, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    Core* c = core();
    if (c == nullptr || handle == nullptr || listenComm == nullptr) {
      return fail("listen", invalidArgument("not initialised, or a NULL handle or listenComm"));
    }
    auto r = c->listen(dev, handleSpan(handle));
    if (!r) return fail("listen", r.status());
    *listenComm = r.value();
    return kNcclSuccess;
  });
}

int connectDev(int dev, void* handle, void** sendComm) {
  return guarded("connect", [&] {
    Core* c = core();
    if (c == nullptr || handle == nullptr || sendComm == nullptr) {
      return fail("connect", invalidArgument("not initialised, or a NULL handle or sendComm"));
    }
    *sendComm = nullptr;
    auto r = c->connect(dev, handleSpan(handle));
    if (!r) return fail("connect", r.status());
    *sendComm = r.value();
    return kNcclSuccess;
  });
}

int acceptComm(void* listenComm, void** recvComm) {
  return guarded("accept", [&] {
    Core* c = core();
    if (c == nullptr || recvComm == nullptr || !c->isListen(listenComm)) {
      return fail("accept", invalidArgument("an unknown listen comm or a NULL recvComm"));
    }
    *recvComm = nullptr;
    auto r = c->accept(static_cast<ListenComm*>(listenComm));
    if (!r) return fail("accept", r.status());
    *recvComm = r.value();
    return kNcclSuccess;
  });
}

int regMr(void* comm, void* data, std::size_t size, int type, void** mhandle) {
  return guarded("regMr", [&] {
    Core* c = core();
    if (c == nullptr || mhandle == nullptr || (!c->isSend(comm) && !c->isRecv(comm))) {
      return fail("regMr", invalidArgument("an unknown comm or a NULL mhandle"));
    }
    if (type != kNcclPtrHost) {
      return fail("regMr", invalidArgument("pointer type {}: this plugin moves host memory only (ptrSupport HOST)", type));
    }
    auto r = c->regMr(data, size, type);
    if (!r) return fail("regMr", r.status());
    *mhandle = r.value();
    return kNcclSuccess;
  });
}

int regMrDmaBuf(void*, void*, std::size_t, int, std::uint64_t, int, void**) {
  return fail("regMrDmaBuf", invalidArgument("DMA-BUF needs a GPUDirect backend (this plugin moves host memory)"));
}

int deregMr(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    Core* c = core();
    if (c == nullptr || (!c->isSend(comm) && !c->isRecv(comm))) return fail("deregMr", invalidArgument("an unknown comm"));
    if (Status st = c->deregMr(static_cast<MemHandle*>(mhandle)); !st.isOk()) return fail("deregMr", st);
    return kNcclSuccess;
  });
}

int isend(void* sendComm, void* data, std::size_t size, int tag, void** request) {
  return guarded("isend", [&] {
    Core* c = core();
    if (c == nullptr || request == nullptr || (data == nullptr && size > 0)) {
      return fail("isend", invalidArgument("a NULL request or data pointer"));
    }
    *request = nullptr;
    auto r = c->isend(static_cast<SendComm*>(sendComm), data, size, tag);
    if (!r) return fail("isend", r.status());
    *request = r.value();
    return kNcclSuccess;
  });
}

int irecv(void* recvComm, int n, void** data, std::size_t* sizes, int* tags, void** request) {
  return guarded("irecv", [&] {
    Core* c = core();
    if (c == nullptr || request == nullptr || n < 1 || data == nullptr || sizes == nullptr || tags == nullptr) {
      return fail("irecv", invalidArgument("n {} or a NULL argument", n));
    }
    *request = nullptr;  // it may come in as 0x1 (optional completion): nothing to read there
    auto r = c->irecv(static_cast<RecvComm*>(recvComm), n, data, sizes, tags);
    if (!r) return fail("irecv", r.status());
    *request = r.value();
    return kNcclSuccess;
  });
}

int iflush(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;  // host memory: nothing to flush
  return kNcclSuccess;
}

int test(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    Core* c = core();
    if (c == nullptr || done == nullptr) return fail("test", invalidArgument("a NULL done"));
    *done = 0;
    auto r = c->test(static_cast<PluginRequest*>(request), sizes);
    if (!r) return fail("test", r.status());
    *done = r.value() ? 1 : 0;
    return kNcclSuccess;
  });
}

int closeSend(void* comm) {
  return guarded("closeSend", [&] {
    Core* c = core();
    Status st = c != nullptr ? c->closeSend(static_cast<SendComm*>(comm)) : invalidArgument("not initialised");
    return st.isOk() ? kNcclSuccess : fail("closeSend", st);
  });
}

int closeRecv(void* comm) {
  return guarded("closeRecv", [&] {
    Core* c = core();
    Status st = c != nullptr ? c->closeRecv(static_cast<RecvComm*>(comm)) : invalidArgument("not initialised");
    return st.isOk() ? kNcclSuccess : fail("closeRecv", st);
  });
}

int closeListen(void* comm) {
  return guarded("closeListen", [&] {
    Core* c = core();
    Status st = c != nullptr ? c->closeListen(static_cast<ListenComm*>(comm)) : invalidArgument("not initialised");
    return st.isOk() ? kNcclSuccess : fail("closeListen", st);
  });
}

int getDeviceMr(void*, void*, void**) {
  return fail("getDeviceMr", invalidArgument("no device offload (netDeviceType HOST)"));
}
int irecvConsumed(void*, int, void*) {
  return fail("irecvConsumed", invalidArgument("no device offload (netDeviceType HOST)"));
}

int makeVDevice(int* d, MerNcclVDeviceProps* props) {
  return guarded("makeVDevice", [&] {
    Core* c = core();
    // The virtual device already spans every path; a "virtual NIC" of one device is itself.
    if (c == nullptr || d == nullptr || props == nullptr || props->ndevs != 1 || props->devs[0] < 0 ||
        props->devs[0] >= c->deviceCount()) {
      return fail("makeVDevice", invalidArgument("only single-device virtual NICs (Meridian stripes inside its device)"));
    }
    *d = props->devs[0];
    return kNcclSuccess;
  });
}

// ---- version shims

int initV11(void** ctx, std::uint64_t, MerNcclNetCommConfig*, MerNcclLogger logger, MerNcclProfilerCallback) {
  int rc = initCore(logger);
  if (ctx != nullptr) *ctx = rc == kNcclSuccess ? static_cast<void*>(core()) : nullptr;
  return rc;
}
int initV10(MerNcclLogger logger, MerNcclProfilerCallback) { return initCore(logger); }
int initV8(MerNcclLogger logger) { return initCore(logger); }
int finalizeV11(void*) { return kNcclSuccess; }
int setNetAttrV11(void*, MerNcclNetAttr*) { return kNcclSuccess; }  // hints only

int listenV11(void*, int dev, void* handle, void** comm) { return listenDev(dev, handle, comm); }
int listenV8(int dev, void* handle, void** comm) { return listenDev(dev, handle, comm); }
int connectV11(void*, int dev, void* handle, void** comm, Dev**) { return connectDev(dev, handle, comm); }
int connectV10(int dev, MerNcclNetCommConfig*, void* handle, void** comm, Dev**) { return connectDev(dev, handle, comm); }
int connectV8(int dev, void* handle, void** comm, Dev**) { return connectDev(dev, handle, comm); }
int acceptV8(void* listenComm, void** comm, Dev**) { return acceptComm(listenComm, comm); }

int isendV10(void* comm, void* data, std::size_t size, int tag, void*, void*, void** request) {
  return isend(comm, data, size, tag, request);
}
int isendV9(void* comm, void* data, std::size_t size, int tag, void*, void** request) {
  return isend(comm, data, size, tag, request);
}
int isendV8(void* comm, void* data, int size, int tag, void*, void** request) {
  if (size < 0) return fail("isend", invalidArgument("negative size {}", size));
  return isend(comm, data, static_cast<std::size_t>(size), tag, request);
}
int irecvV10(void* comm, int n, void** data, std::size_t* sizes, int* tags, void**, void**, void** request) {
  return irecv(comm, n, data, sizes, tags, request);
}
int irecvV9(void* comm, int n, void** data, std::size_t* sizes, int* tags, void**, void** request) {
  return irecv(comm, n, data, sizes, tags, request);
}
int irecvV8(void* comm, int n, void** data, int* sizes, int* tags, void**, void** request) {
  if (n < 1 || n > kMaxRecvs || sizes == nullptr) return fail("irecv", invalidArgument("n {} or NULL sizes", n));
  std::array<std::size_t, kMaxRecvs> wide{};
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return fail("irecv", invalidArgument("negative size {}", sizes[i]));
    wide[static_cast<std::size_t>(i)] = static_cast<std::size_t>(sizes[i]);
  }
  return irecv(comm, n, data, wide.data(), tags, request);
}

int getPropertiesV9(int dev, MerNcclProps_v9* props) {
  if (props == nullptr) return fail("getProperties", invalidArgument("props is NULL"));
  MerNcclProps_v11 p{};
  int rc = getProperties(dev, &p);
  if (rc != kNcclSuccess) return rc;
  *props = p;  // v9's fields, v11's last one left out
  return kNcclSuccess;
}
int getPropertiesV8(int dev, MerNcclProps_v8* props) {
  if (props == nullptr) return fail("getProperties", invalidArgument("props is NULL"));
  MerNcclProps_v11 p{};
  int rc = getProperties(dev, &p);
  if (rc != kNcclSuccess) return rc;
  *props = MerNcclProps_v8{p.name,     p.pciPath,  p.guid,          p.ptrSupport,    p.regIsGlobal, p.speed,
                           p.port,     p.latency,  p.maxComms,      p.maxRecvs,      p.netDeviceType,
                           p.netDeviceVersion};
  return kNcclSuccess;
}

constexpr const char* kName = "Meridian";

}  // namespace

// The tables NCCL looks up by name (C linkage, default visibility, external: `extern const`).
extern "C" {

__attribute__((visibility("default"))) extern const MerNcclNet_v11 ncclNetPlugin_v11 = {
    kName,   initV11, devices,      getProperties, listenV11,     connectV11,  acceptV8,
    regMr,   regMrDmaBuf, deregMr,  isendV10,      irecvV10,      iflush,      test,
    closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice, finalizeV11,
    setNetAttrV11};

__attribute__((visibility("default"))) extern const MerNcclNet_v10 ncclNetPlugin_v10 = {
    kName,   initV10, devices,      getPropertiesV9, listenV8,       connectV10,  acceptV8,
    regMr,   regMrDmaBuf, deregMr,  isendV10,        irecvV10,     iflush,      test,
    closeSend, closeRecv, closeListen, getDeviceMr,  irecvConsumed, makeVDevice};

__attribute__((visibility("default"))) extern const MerNcclNet_v9 ncclNetPlugin_v9 = {
    kName,   initV8,  devices,      getPropertiesV9, listenV8,       connectV8,   acceptV8,
    regMr,   regMrDmaBuf, deregMr,  isendV9,         irecvV9,      iflush,      test,
    closeSend, closeRecv, closeListen, getDeviceMr,  irecvConsumed, makeVDevice};

__attribute__((visibility("default"))) extern const MerNcclNet_v8 ncclNetPlugin_v8 = {
    kName,   initV8,  devices,      getPropertiesV8, listenV8,       connectV8,   acceptV8,
    regMr,   regMrDmaBuf, deregMr,  isendV8,         irecvV8,      iflush,      test,
    closeSend, closeRecv, closeListen, getDeviceMr,  irecvConsumed};

}  // extern "C"

}  // namespace meridian::plugin
