// A conformance harness for NCCL net plugins: it loads a plugin the way NCCL does (dlopen by
// name, dlsym of ncclNetPlugin_v11) and drives the function table as NCCL's proxy thread
// would: listen, handle exchange, connect and accept never blocking (alternated on one
// thread when both ends are in one process), regMr on sub-ranges, up to 32 requests in
// flight with NULL-request retries, sizes from 0 to 64 MiB into larger receive buffers,
// grouped receives, test with and without sizes, the optional-completion marker, and close
// with requests in flight. Every function returns "" on success or what went wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nccl_plugin/net_abi.h"

namespace meridian::plugin::conformance {

struct Plugin {
  void* lib = nullptr;
  const MerNcclNet_v11* net = nullptr;
  void* ctx = nullptr;
};
// dlopen(`name`) (a file name searched like NCCL's, or a path), the v11 table, init.
std::string load(const std::string& name, Plugin* out);

// One line per device on stdout: name, speed (Mbit/s), latency (us), pciPath, maxRecvs.
std::string printProperties(Plugin& p);

// The message sizes both ends agree on (0 to 64 MiB).
std::vector<std::size_t> planSizes();

// Listener: listen on device 0, write the handle to *handle, then (after the peer got it)
// accept and receive the plan. Connector: connect with the handle and send the plan.
std::string listen(Plugin& p, std::vector<std::uint8_t>* handle, void** listenComm);
std::string acceptAll(Plugin& p, void* listenComm, void** recvComm);
std::string connectAll(Plugin& p, std::vector<std::uint8_t> handle, void** sendComm);
// Both in one process, alternating on this thread as NCCL does.
std::string connectAndAccept(Plugin& p, void* listenComm, std::vector<std::uint8_t> handle, void** sendComm,
                             void** recvComm);

// The transfer plan (`repeats` times): one side each, or both alternating on one thread
// (either comm null means that side is in the other process). Then grouped receives, bad
// use, and close with requests in flight. `bytesMoved` (when given) gets the plan's bytes.
// With the ends in two processes, `barrier` (both sides call it) runs before the comms close,
// as NCCL closes only after every operation finished on both ends (a bootstrap barrier):
// without it a fast sender could close before its last messages were matched.
std::string runPlan(Plugin& p, void* sendComm, void* recvComm, int repeats = 1, std::size_t* bytesMoved = nullptr,
                    const std::function<std::string()>& barrier = {});

// Throughput: `iters` messages of `bytes` one way with up to `inflight` in flight (NULL
// requests retried), no checking; `*seconds` from the first post to the last completion on
// this side. Either comm may be null (the other process has it).
std::string stream(Plugin& p, void* sendComm, void* recvComm, std::size_t bytes, int iters, int inflight,
                   double* seconds);

}  // namespace meridian::plugin::conformance
