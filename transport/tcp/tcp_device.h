// TcpDevice: Meridian's TCP backend. One device owns a non-blocking epoll engine with one
// named progress thread ("mer-tcp-<name>"), a listener on each local path address, and
// every stream of every channel opened through it. A path to a peer is one or more TCP
// streams (MERIDIAN_TCP_STREAMS); a channel stripes messages over all its paths
// (transport/multipath). Every stream is authenticated with the job secret first.
//
// Threads: create/openChannel/destruction from any one set-up thread; channels' isend/irecv
// from any thread; all socket I/O on the progress thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "transport/channel.h"

namespace meridian::transport::tcp {

struct DeviceOptions {
  // Local IPv4 addresses, one per path ("127.0.0.1", "127.0.0.2", or "198.18.1.2:0");
  // an optional ":port" picks the listening port (default: the kernel chooses).
  std::vector<std::string> localAddresses{"127.0.0.1"};
  int streamsPerPath = 0;          // 0: MERIDIAN_TCP_STREAMS
  int socketBufferBytes = 0;       // 0: MERIDIAN_TCP_SOCKBUF_BYTES
  int notsentLowatBytes = -1;      // -1: MERIDIAN_TCP_NOTSENT_LOWAT_BYTES; 0: no limit
  std::size_t chunkBytes = 0;      // 0: MERIDIAN_CHUNK_BYTES
  int pathStallMs = 0;             // 0: MERIDIAN_PATH_STALL_MS
  std::string secret;              // empty: loadJobSecret()
  std::string name = "0";          // progress thread name suffix and metrics label
  bool adaptive = true;            // false: static striping (MultipathConfig::adaptive)
  // Every channel gets one more path, a relay slot (down until openRelay), and this device
  // relays for its channels' peers. Both ends of a channel must agree (MERIDIAN_RELAY).
  bool relaySlot = false;
  // Metrics name the peer by its host (path 0's remote IP) instead of its rank: for callers
  // whose "ranks" are not stable names (the NCCL plugin's random connection ids), so series
  // stay one per peer host however often connections come and go.
  bool labelPeersByHost = false;
};

// A relay path from this rank to `peerRank` through `viaRank`: the streams go to via's
// `viaAddress` (its listen address on plane `plane`), and via splices them through to the
// peer's address on the same plane. Both ends must already have channels to via, and to
// each other, in the session.
struct RelaySpec {
  std::uint64_t sessionId = 0;
  int selfRank = 0;
  int peerRank = 0;
  int viaRank = 0;
  std::string viaAddress;
  int plane = 0;
};

// How to open a channel: the lower rank initiates; the other side waits for its streams.
struct ChannelSpec {
  std::uint64_t sessionId = 0;              // identifies the communicator on both sides
  int selfRank = 0;
  int peerRank = 0;
  bool initiate = false;                    // connect (true) or wait for the peer (false)
  std::vector<std::string> peerAddresses;   // the peer's listenAddresses(), on both sides: the
                                            // initiator connects to them; both use their count  // Same-host direct reads (direct_read.h), both settled at set-up: the pid this side reads
  // the peer's kDataRef chunks from (0: it never sends any; one arriving fails the path),
  // and whether the peer reads this side's large messages itself.
  std::int64_t readPeerPid = 0;
  bool peerReadsDirect = false;
};

class TcpDevice {
 public:
  static Result<std::unique_ptr<TcpDevice>> create(DeviceOptions options);
  ~TcpDevice();
  TcpDevice(const TcpDevice&) = delete;
  TcpDevice& operator=(const TcpDevice&) = delete;

  // "ip:port" per path, in path order; publish these to peers.
  const std::vector<std::string>& listenAddresses() const;

  // Opens a channel to one peer; blocks until every stream of every path is connected
  // and authenticated, or the deadline passes. Local path i connects to the peer's path
  // i (paths beyond the shorter list are unused).
  Result<ChannelPtr> openChannel(const ChannelSpec& spec, TimePoint deadline);

  // Connects the relay slot of the channel to spec.peerRank through spec.viaRank (see
  // RelaySpec): the two ranks authenticate each other end to end through via, which only
  // forwards bytes, and from then on the channel stripes over the relay path too. Blocks
  // the calling thread for a few round trips. kAgain when the slot is in use already;
  // invalidArgument without a relay slot or such a channel; peerError when via refuses.
  Status openRelay(const RelaySpec& spec, TimePoint deadline);
  // Closes the relay slot of the channel to `peerRank` on purpose (its chunks move to the
  // direct paths). invalidArgument when there is no such channel or no relay is up.
  Status closeRelay(std::uint64_t sessionId, int peerRank);

  // A listener that does not know its peers' ranks (NCCL's accept): takes the channel of
  // whichever peer has connected every stream of every path it opened into `sessionId`
  // (openChannel with initiate on its side). Never blocks: kAgain until one has. Returns
  // the peer's rank (its selfRank) with the channel.
  Result<std::pair<int, ChannelPtr>> acceptChannel(std::uint64_t sessionId);
  // Closes the channel to `peerRank` in `sessionId` and forgets it: eager sends already
  // complete for their callers are delivered first (at most 5 s), then the peer is told
  // and every outstanding request fails with kCommError. invalidArgument when unknown.
  Status closeChannel(std::uint64_t sessionId, int peerRank);

  // Test seam: abruptly closes every stream of path `pathIndex` of the channel to
  // `peerRank` in `sessionId` (as a cable pull would), on the progress thread.
  Status cutPath(std::uint64_t sessionId, int peerRank, int pathIndex);

  struct Impl;

 private:
  explicit TcpDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::transport::tcp
