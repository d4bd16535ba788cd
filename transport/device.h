// Device: what collectives and the NCCL plugin hold to reach their peers, whatever carries
// the bytes. A device is created by kind (TCP today; the in-memory backend for tests;
// libfabric and shared memory plug in here), names itself to peers with an opaque endpoint
// name, opens and accepts multipath channels (channel.h) to peers, and registers memory
// for backends whose remote reads need it.
//
// Set-up of a group (a communicator's ranks): every rank creates its device, all-gathers
// endpoint() through its bootstrap, calls joinGroup with the same exchange (the device may
// settle group-wide things there, such as which same-host peers read each other's memory),
// then opens one channel per peer: the lower rank initiates, the other waits for it.
//
// Threads: create/joinGroup/openChannel/openRelay/closeChannel/destruction from set-up or
// control threads (each call is thread-safe); channels from any thread; each backend runs
// its I/O on its own named progress thread. Destroying a device fails whatever its
// channels still have outstanding with kCommError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/aead.h"
#include "core/status.h"
#include "transport/channel.h"

namespace meridian::transport {

enum class DeviceKind : std::uint8_t {
  kTcp,     // TCP streams over IPv4 paths (tcp/)
  kMemory,  // in-process frame queues with injectable faults, for tests (memory/)
};
std::string_view deviceKindName(DeviceKind kind);

// A device's name for itself, published to peers through the bootstrap: opaque bytes only
// the same kind of device decodes (TCP: every path's IPv4 address and port).
using EndpointName = std::vector<std::uint8_t>;
inline constexpr std::size_t kMaxEndpointNameBytes = 1024;

struct DeviceCaps {
  bool relay = false;       // openRelay: a path through a third rank
  bool remoteRead = false;  // peers may read chunks from this process's memory (DATA-REF)
  bool needsRegistration = false;  // remote reads need registerMemory first (RDMA-style)
};

// The knobs of a device; 0 / empty / -1 means "from the MERIDIAN_* knob".
struct DeviceOptions {
  DeviceKind kind = DeviceKind::kTcp;
  // Local addresses, one per path: TCP takes IPv4 ("127.0.0.1", "198.18.1.2:0"; an optional
  // ":port" picks the listening port); the memory backend takes any names.
  std::vector<std::string> localAddresses{"127.0.0.1"};
  std::size_t chunkBytes = 0;      // MERIDIAN_CHUNK_BYTES
  int pathStallMs = 0;             // MERIDIAN_PATH_STALL_MS
  std::string secret;              // empty: loadJobSecret()
  // Every frame after the handshake (core/aead.h); unset: MERIDIAN_WIRE_SECURITY.
  std::optional<WireSecurity> wireSecurity;
  std::string name = "0";          // progress thread name suffix and metrics label
  bool adaptive = true;            // false: static striping (MultipathConfig::adaptive)
  // Every channel gets one more path, a relay slot (down until openRelay), and this device
  // relays for its channels' peers. Both ends of a channel must agree (MERIDIAN_RELAY).
  bool relaySlot = false;
  // Same-host peers read large messages from each other's memory where the backend can
  // (joinGroup settles who; MERIDIAN_DIRECT_READ=off turns it off).
  bool directRead = true;
  // Metrics name the peer by its host instead of its rank: for callers whose "ranks" are not
  // stable names (the NCCL plugin's random connection ids).
  bool labelPeersByHost = false;
  // Fabric paths beside the TCP paths (libfabric; transport/fabric/). TCP devices only.
  struct Fabric {
    std::string mode;              // MERIDIAN_FABRIC: auto, on or off
    std::string provider;          // MERIDIAN_FABRIC_PROVIDER; empty: the best present
    std::string domain;            // MERIDIAN_FABRIC_DOMAIN; empty: the provider's first
    std::string tcp;               // MERIDIAN_FABRIC_TCP: data or standby (PathEndpoints::standby)
  } fabric;
  // MERIDIAN_SHM: auto (a shared-memory path to every peer on this host, TCP paths on
  // standby beside it; transport/shm/path.h) or off. TCP devices only.
  std::string shm;
  struct Tcp {
    int streamsPerPath = 0;        // MERIDIAN_TCP_STREAMS
    int socketBufferBytes = 0;     // MERIDIAN_TCP_SOCKBUF_BYTES
    int notsentLowatBytes = -1;    // MERIDIAN_TCP_NOTSENT_LOWAT_BYTES; 0: no limit
  } tcp;
};

// Fills every field of `options` left at "from the knob" (0, empty, -1) from its MERIDIAN_*
// knob, the backend's own included; kInvalidArgument naming the knob when one is malformed.
// Every backend's create calls it: knobs are read once, here.
Status resolveKnobs(DeviceOptions& options);

// The set-up exchange of a group, provided by the caller (a communicator's store).
class GroupExchange {
 public:
  virtual ~GroupExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank of the group contributes `mine` under `key` (unique per call); returns the
  // contributions in rank order once all are there, or an error at the deadline.
  virtual Result<std::vector<std::vector<std::uint8_t>>> allGather(std::string_view key,
                                                                   std::span<const std::uint8_t> mine,
                                                                   TimePoint deadline) = 0;
};

// What joinGroup settled, the same on every rank.
struct GroupInfo {
  bool everyPairReadsDirect = false;  // every two ranks read each other's memory (one host)
  int directPeers = 0;                // peers this rank reads directly
};

// How to open a channel: the lower rank initiates; the other side waits for its paths.
struct ChannelSpec {
  std::uint64_t sessionId = 0;  // identifies the group on both sides
  int selfRank = 0;
  int peerRank = 0;
  bool initiate = false;        // connect (true) or wait for the peer (false)
  EndpointName peer;            // the peer's endpoint(), on both sides (both use its path count)
};

// A relay path from this rank to `peerRank` through `viaRank` on plane `plane` (a path index
// both ends have). Both ends must already have channels to via, and to each other.
struct RelaySpec {
  std::uint64_t sessionId = 0;
  int selfRank = 0;
  int peerRank = 0;
  int viaRank = 0;
  EndpointName via;  // via's endpoint()
  int plane = 0;
};

// A registered range of this process's memory. `key` is what a peer needs to read it.
struct MemoryRegion {
  const void* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t key = 0;
};

class Device {
 public:
  static Result<std::unique_ptr<Device>> create(DeviceOptions options);
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  virtual DeviceCaps caps() const = 0;
  // Publish this to peers (ChannelSpec::peer, RelaySpec::via).
  virtual const EndpointName& endpoint() const = 0;
  // For logs and errors: "198.18.0.1:4000, 198.18.1.1:4001", or why it is not one.
  virtual std::string describe(std::span<const std::uint8_t> endpoint) const = 0;
  // One name per local path, in path order (PathStats::localAddress, metrics).
  virtual std::vector<std::string> pathNames() const = 0;

  // Settles group-wide set-up for session `sessionId` before its channels open; every rank
  // of the group calls it with the same exchange. Channels of a session that never joined
  // use none of it (the NCCL plugin's).
  virtual Result<GroupInfo> joinGroup(GroupExchange& exchange, std::uint64_t sessionId, TimePoint deadline) = 0;

  // Opens a channel to one peer; blocks until every path is up or the deadline passes.
  virtual Result<ChannelPtr> openChannel(const ChannelSpec& spec, TimePoint deadline) = 0;
  // A listener that does not know its peers' ranks (NCCL's accept): takes the channel of
  // whichever peer has connected all its paths into `sessionId`. Never blocks: kAgain until
  // one has. Returns the peer's rank (its selfRank) with the channel.
  virtual Result<std::pair<int, ChannelPtr>> acceptChannel(std::uint64_t sessionId) = 0;
  // Closes the channel on purpose: eager sends already complete for their callers are
  // delivered first (bounded), then the peer is told and what is outstanding fails with
  // kCommError. invalidArgument when unknown.
  virtual Status closeChannel(std::uint64_t sessionId, int peerRank) = 0;

  // Connects the relay slot of the channel to spec.peerRank through spec.viaRank; from then on
  // the channel stripes over it too. kAgain when the slot is in use; invalidArgument without
  // a relay slot (or caps().relay false) or such a channel; peerError when via refuses.
  virtual Status openRelay(const RelaySpec& spec, TimePoint deadline) = 0;
  // Closes the relay slot on purpose (its chunks move to the direct paths).
  virtual Status closeRelay(std::uint64_t sessionId, int peerRank) = 0;

  // Registers [base, base+bytes) for remote reads and for sends in place (a TCP device
  // registers it on its fabric rails, whose paths then send chunks of it without a copy).
  // Backends that need no registration return the range with key 0. Hits on a registered
  // range (or a sub-range of one) cost nothing; the caller deregisters before it frees the
  // memory (the cache cannot see frees).
  virtual Result<MemoryRegion> registerMemory(const void* base, std::size_t bytes) = 0;
  virtual Status deregisterMemory(const MemoryRegion& region) = 0;

  // The peer is gone for good (the others agreed it is lost): the channel fails now with
  // `why`, and closing the device does not wait to deliver anything to it first.
  virtual Status abandonChannel(std::uint64_t sessionId, int peerRank, const Status& why) = 0;

  // Test seam: abruptly fails path `pathIndex` of the channel to `peerRank` (a cable pull).
  virtual Status cutPath(std::uint64_t sessionId, int peerRank, int pathIndex) = 0;
};

}  // namespace meridian::transport
