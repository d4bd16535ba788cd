// TcpDevice: Meridian's TCP backend of the Device interface (transport/device.h). One
// device owns a non-blocking epoll engine with one named progress thread ("mer-tcp-<name>"),
// a listener on each local path address, and every stream of every channel opened through
// it. A path to a peer is one or more TCP streams (MERIDIAN_TCP_STREAMS); a channel stripes
// messages over all its paths (the multipath engine, transport/engine.h). Every stream is
// authenticated with the job secret first. Ranks on one host read each other's large
// messages directly (direct_read.h), as joinGroup settles.
//
// Threads: as Device; all socket I/O on the progress thread, or on a waiting thread that
// holds the progress lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "transport/channel.h"
#include "transport/device.h"

namespace meridian::transport::tcp {

// Same-host direct reads with one peer (direct_read.h), settled at set-up.
struct DirectReadPlan {
  std::int64_t readPeerPid = 0;  // the pid this side reads the peer's DATA-REF chunks from (0: none)
  bool peerReadsDirect = false;  // the peer reads this side's large messages itself
  // The peer is another process on this host (shm::localHostKey): with MERIDIAN_SHM=auto its
  // channel gets a shared-memory path, and its TCP paths stand by beside it.
  bool sameHost = false;
  int sameHostPeers = 0;  // how many of the group's ranks share this host (besides this one)
};

class TcpDevice final : public Device {
 public:
  static Result<std::unique_ptr<TcpDevice>> create(DeviceOptions options);
  ~TcpDevice() override;
  TcpDevice(const TcpDevice&) = delete;
  TcpDevice& operator=(const TcpDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::kTcp; }
  DeviceCaps caps() const override;
  const EndpointName& endpoint() const override;
  std::string describe(std::span<const std::uint8_t> endpoint) const override;
  std::vector<std::string> pathNames() const override { return listenAddresses(); }
  // Settles same-host direct reads in two rounds: every rank offers its host key, pid and a
  // cookie's address (nothing with directRead off), test-reads the cookies of the peers on
  // its host, and publishes whom it can read.
  Result<GroupInfo> joinGroup(GroupExchange& exchange, std::uint64_t sessionId, TimePoint deadline) override;
  // Local path i connects to the peer's path i (paths beyond the shorter list are unused).
  Result<ChannelPtr> openChannel(const ChannelSpec& spec, TimePoint deadline) override;
  Result<std::pair<int, ChannelPtr>> acceptChannel(std::uint64_t sessionId) override;
  Status closeChannel(std::uint64_t sessionId, int peerRank) override;
  // The relay's streams go to via's listen address on `plane`, and via splices them through
  // to the peer's address on the same plane; the two ends authenticate each other end to end
  // through via, which only forwards bytes. Blocks for a few round trips.
  Status openRelay(const RelaySpec& spec, TimePoint deadline) override;
  Status closeRelay(std::uint64_t sessionId, int peerRank) override;
  // TCP moves host memory without registration: the range comes back with key 0.
  Result<MemoryRegion> registerMemory(const void* base, std::size_t bytes) override;
  Status deregisterMemory(const MemoryRegion& region) override;
  Status cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) override;
  Status abandonChannel(std::uint64_t sessionId, int peerRank, const Status& why) override;

  // "ip:port" per path, in path order (what endpoint() encodes).
  const std::vector<std::string>& listenAddresses() const;
  // What joinGroup records per peer; tests of two devices in one process set it directly.
  void planDirectRead(std::uint64_t sessionId, int peerRank, DirectReadPlan plan);

  struct Impl;

 private:
  explicit TcpDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::transport::tcp
