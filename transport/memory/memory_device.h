// The in-memory backend: devices in one process whose paths are queues of frames, driven by
// whoever calls Network::step (no progress thread, no sockets, no timing of their own). It
// runs the real multipath engine (engine.h) over paths that lose, reorder, stall and die on
// command, so the protocol's failover, resend and matching can be tested deterministically:
// the test owns the clock (Network::advanceUs) and every step.
//
// A Network holds its devices and the links between them. Device::create with kind kMemory
// uses the process's shared network; tests make their own.
//
// Threads: every method is thread-safe (one lock per network); a thread waiting on a request
// of a memory channel runs steps itself, so threads may also drive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <vector>

#include "core/status.h"
#include "transport/device.h"

namespace meridian::transport::memory {

// What a path does to the frames on it, in both directions.
struct PathFaults {
  int dropData = 0;        // the next this many DATA frames sent on it vanish (loss)
  bool reorder = false;    // frames queued on it are delivered newest first
  bool stalled = false;    // frames queue up and none is delivered (a black hole while set)
  // At most this many payload bytes a step each way (0: no limit): with setStepUs, a rate
  // the multipath engine measures as it would a real link's.
  std::uint64_t bytesPerStep = 0;
};

class MemoryDevice;

class Network {
 public:
  Network();
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // The process's network (Device::create with kind kMemory).
  static Network& shared();

  // A device on this network; options.localAddresses name its paths.
  Result<std::unique_ptr<MemoryDevice>> createDevice(DeviceOptions options);

  // The network's clock (microseconds): starts at 1 and moves only when told, or by
  // `stepUs` at the start of every step (0 by default).
  std::int64_t nowUs() const;
  void advanceUs(std::int64_t us);
  void setStepUs(std::int64_t stepUs);

  // One round: every channel takes what was posted, schedules and writes its chunks, then
  // every path delivers what is queued on it (acks go back the same way), then stalls are
  // checked. True when any frame moved.
  bool step();
  // Steps until `done` or `maxSteps`; true when done.
  bool runUntil(const std::function<bool()>& done, int maxSteps = 100000);

  // Faults on path `path` of the channel between `rankA` and `rankB` in `sessionId`.
  // invalidArgument when there is no such channel or path.
  Status setFaults(std::uint64_t sessionId, int rankA, int rankB, std::size_t path, PathFaults faults);
  // Frames that vanished so far (dropData), for tests.
  std::uint64_t droppedFrames() const;

  struct State;

 private:
  friend class MemoryDevice;
  std::shared_ptr<State> state_;
};

class MemoryDevice final : public Device {
 public:
  ~MemoryDevice() override;

  DeviceKind kind() const override { return DeviceKind::kMemory; }
  DeviceCaps caps() const override;
  const EndpointName& endpoint() const override { return endpoint_; }
  std::string describe(std::span<const std::uint8_t> endpoint) const override;
  std::vector<std::string> pathNames() const override;
  Result<GroupInfo> joinGroup(GroupExchange& exchange, std::uint64_t sessionId, TimePoint deadline) override;
  Result<ChannelPtr> openChannel(const ChannelSpec& spec, TimePoint deadline) override;
  Result<std::pair<int, ChannelPtr>> acceptChannel(std::uint64_t sessionId) override;
  Status closeChannel(std::uint64_t sessionId, int peerRank) override;
  Status openRelay(const RelaySpec& spec, TimePoint deadline) override;
  Status closeRelay(std::uint64_t sessionId, int peerRank) override;
  // Registrations go through a RegistrationCache (keys from 1), as an RDMA backend's would.
  Result<MemoryRegion> registerMemory(const void* base, std::size_t bytes) override;
  Status deregisterMemory(const MemoryRegion& region) override;
  Status cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) override;
  Status abandonChannel(std::uint64_t sessionId, int peerRank, const Status& why) override;

  // Backend registrations made so far (cache misses), for tests.
  std::uint64_t registrations() const;

 private:
  friend class Network;
  MemoryDevice(std::shared_ptr<Network::State> net, std::uint32_t id, DeviceOptions options);
  std::shared_ptr<Network::State> net_;
  std::uint32_t id_;
  DeviceOptions options_;
  EndpointName endpoint_;
};

}  // namespace meridian::transport::memory
