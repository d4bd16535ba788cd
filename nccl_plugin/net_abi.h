// The NCCL net-plugin ABI, versions 8 to 11, declared from the facts in
// ../shared/design/NCCL_NET.md (NCCL 2.28's layouts): the function tables NCCL looks up by
// symbol name, the device properties it reads, and the constants both sides agree on. Our own
// declarations, C layout: field order and types are the contract, names are ours.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// ncclResult_t values (the functions return int).
inline constexpr int kNcclSuccess = 0;
inline constexpr int kNcclUnhandledCudaError = 1;
inline constexpr int kNcclSystemError = 2;
inline constexpr int kNcclInternalError = 3;
inline constexpr int kNcclInvalidArgument = 4;
inline constexpr int kNcclInvalidUsage = 5;
inline constexpr int kNcclRemoteError = 6;
inline constexpr int kNcclInProgress = 7;

// Pointer types (ptrSupport, regMr's type).
inline constexpr int kNcclPtrHost = 1;
inline constexpr int kNcclPtrCuda = 2;
inline constexpr int kNcclPtrDmabuf = 4;

inline constexpr std::size_t kNcclNetHandleMaxBytes = 128;
inline constexpr int kNcclNetMaxRequests = 32;  // in flight per comm
inline constexpr int kNcclNetMaxDevsPerNic = 4;
inline constexpr int kNcclNetDeviceHost = 0;    // netDeviceType

// The logger NCCL passes to init: level, subsystem flags, file, line, printf format.
inline constexpr int kNcclLogNone = 0;
inline constexpr int kNcclLogVersion = 1;
inline constexpr int kNcclLogWarn = 2;
inline constexpr int kNcclLogInfo = 3;
inline constexpr int kNcclLogAbort = 4;
inline constexpr int kNcclLogTrace = 5;
inline constexpr unsigned long kNcclLogNet = 0x10;
typedef void (*MerNcclLogger)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

// Opaque to a host-memory plugin: the profiler callback and device-offload handles.
typedef void* MerNcclProfilerCallback;
struct MerNcclNetDeviceHandle;

struct MerNcclVDeviceProps {
  int ndevs;
  int devs[kNcclNetMaxDevsPerNic];
};

struct MerNcclNetCommConfig {
  int trafficClass;  // -1: unset
};

struct MerNcclNetCommAttr {
  std::int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
};
struct MerNcclNetAttr {
  MerNcclNetCommAttr sendCommAttr;
  MerNcclNetCommAttr recvCommAttr;
  std::uint32_t op, algo, proto;
};

struct MerNcclProps_v8 {
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;      // Mbit/s
  int port;
  float latency;  // microseconds
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};

struct MerNcclProps_v9 {  // v9 and v10
  char* name;
  char* pciPath;
  std::uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  MerNcclVDeviceProps vProps;
  std::size_t maxP2pBytes;
  std::size_t maxCollBytes;
};

// v11 appends one field to v9's layout (a standard-layout derived struct keeps the base's
// fields first, in order).
struct MerNcclProps_v11 : MerNcclProps_v9 {
  int maxMultiRequestSize;
};

using Dev = MerNcclNetDeviceHandle;

struct MerNcclNet_v8 {
  const char* name;
  int (*init)(MerNcclLogger);
  int (*devices)(int*);
  int (*getProperties)(int, MerNcclProps_v8*);
  int (*listen)(int, void*, void**);
  int (*connect)(int, void*, void**, Dev**);
  int (*accept)(void*, void**, Dev**);
  int (*regMr)(void*, void*, std::size_t, int, void**);
  int (*regMrDmaBuf)(void*, void*, std::size_t, int, std::uint64_t, int, void**);
  int (*deregMr)(void*, void*);
  int (*isend)(void*, void*, int, int, void*, void**);
  int (*irecv)(void*, int, void**, int*, int*, void**, void**);
  int (*iflush)(void*, int, void**, int*, void**, void**);
  int (*test)(void*, int*, int*);
  int (*closeSend)(void*);
  int (*closeRecv)(void*);
  int (*closeListen)(void*);
  int (*getDeviceMr)(void*, void*, void**);
  int (*irecvConsumed)(void*, int, void*);
};

struct MerNcclNet_v9 {
  const char* name;
  int (*init)(MerNcclLogger);
  int (*devices)(int*);
  int (*getProperties)(int, MerNcclProps_v9*);
  int (*listen)(int, void*, void**);
  int (*connect)(int, void*, void**, Dev**);
  int (*accept)(void*, void**, Dev**);
  int (*regMr)(void*, void*, std::size_t, int, void**);
  int (*regMrDmaBuf)(void*, void*, std::size_t, int, std::uint64_t, int, void**);
  int (*deregMr)(void*, void*);
  int (*isend)(void*, void*, std::size_t, int, void*, void**);
  int (*irecv)(void*, int, void**, std::size_t*, int*, void**, void**);
  int (*iflush)(void*, int, void**, int*, void**, void**);
  int (*test)(void*, int*, int*);
  int (*closeSend)(void*);
  int (*closeRecv)(void*);
  int (*closeListen)(void*);
  int (*getDeviceMr)(void*, void*, void**);
  int (*irecvConsumed)(void*, int, void*);
  int (*makeVDevice)(int*, MerNcclVDeviceProps*);
};

struct MerNcclNet_v10 {
  const char* name;
  int (*init)(MerNcclLogger, MerNcclProfilerCallback);
  int (*devices)(int*);
  int (*getProperties)(int, MerNcclProps_v9*);
  int (*listen)(int, void*, void**);
  int (*connect)(int, MerNcclNetCommConfig*, void*, void**, Dev**);
  int (*accept)(void*, void**, Dev**);
  int (*regMr)(void*, void*, std::size_t, int, void**);
  int (*regMrDmaBuf)(void*, void*, std::size_t, int, std::uint64_t, int, void**);
  int (*deregMr)(void*, void*);
  int (*isend)(void*, void*, std::size_t, int, void*, void*, void**);
  int (*irecv)(void*, int, void**, std::size_t*, int*, void**, void**, void**);
  int (*iflush)(void*, int, void**, int*, void**, void**);
  int (*test)(void*, int*, int*);
  int (*closeSend)(void*);
  int (*closeRecv)(void*);
  int (*closeListen)(void*);
  int (*getDeviceMr)(void*, void*, void**);
  int (*irecvConsumed)(void*, int, void*);
  int (*makeVDevice)(int*, MerNcclVDeviceProps*);
};

struct MerNcclNet_v11 {
  const char* name;
  int (*init)(void** ctx, std::uint64_t commId, MerNcclNetCommConfig*, MerNcclLogger, MerNcclProfilerCallback);
  int (*devices)(int*);
  int (*getProperties)(int, MerNcclProps_v11*);
  int (*listen)(void* ctx, int, void*, void**);
  int (*connect)(void* ctx, int, void*, void**, Dev**);
  int (*accept)(void*, void**, Dev**);
  int (*regMr)(void*, void*, std::size_t, int, void**);
  int (*regMrDmaBuf)(void*, void*, std::size_t, int, std::uint64_t, int, void**);
  int (*deregMr)(void*, void*);
  int (*isend)(void*, void*, std::size_t, int, void*, void*, void**);
  int (*irecv)(void*, int, void**, std::size_t*, int*, void**, void**, void**);
  int (*iflush)(void*, int, void**, int*, void**, void**);
  int (*test)(void*, int*, int*);
  int (*closeSend)(void*);
  int (*closeRecv)(void*);
  int (*closeListen)(void*);
  int (*getDeviceMr)(void*, void*, void**);
  int (*irecvConsumed)(void*, int, void*);
  int (*makeVDevice)(int*, MerNcclVDeviceProps*);
  int (*finalize)(void* ctx);
  int (*setNetAttr)(void* ctx, MerNcclNetAttr*);
};

}  // extern "C"

// The layouts NCCL 2.28 compiles against on x86-64 and aarch64 (LP64).
static_assert(sizeof(MerNcclProps_v8) == 64);
static_assert(sizeof(MerNcclProps_v9) == 104);
static_assert(sizeof(MerNcclProps_v11) == 112);
static_assert(sizeof(MerNcclNet_v8) == 19 * sizeof(void*));
static_assert(sizeof(MerNcclNet_v9) == 20 * sizeof(void*));
static_assert(sizeof(MerNcclNet_v10) == 20 * sizeof(void*));
static_assert(sizeof(MerNcclNet_v11) == 22 * sizeof(void*));
