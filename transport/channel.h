// Channel: reliable, tagged messages to one peer over one or more network paths
// (multipath). Sends and receives with the same tag match in posting order (FIFO per
// peer and tag); a receive buffer may be larger than the message, never smaller.
//
// Thread safety: isend/irecv may be called from any thread; buffers must stay
// valid and untouched until the request is done. Errors that happen on the progress
// thread (a path failing, the peer going away) surface on the requests and on the next
// isend/irecv. A channel lives until its device is destroyed, which fails whatever is
// still outstanding with kCommError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/request.h"

namespace meridian::transport {

// What a backend measures about a path by itself, passively (TCP from TCP_INFO of the
// path's streams, a fabric provider from its counters); each backend fills what it knows and
// leaves the rest unknown. Routing judges paths on these, whatever carries them.
struct PathTelemetry {
  double rttUs = -1;                 // smoothed round trip (largest of the path's links); < 0: unknown
  double deliveryBytesPerSec = 0;    // delivery rate (summed over the path's links); 0: unknown
  std::uint64_t unitsSent = 0;       // transmission units sent so far (TCP segments, packets)
  std::uint64_t unitsResent = 0;     // of those, sent again (with unitsSent: the loss share)
};

// What a path runs over. Probes reach TCP paths only (they share the planes' addresses);
// routing judges the other kinds by their measured rates alone.
enum class PathKind : std::uint8_t {
  kTcp,           // TCP streams over a plane (a relay slot is one too, through a third node)
  kFabric,        // a libfabric rail
  kSharedMemory,  // rings in memory shared with a peer on this host
};
constexpr bool probesReach(PathKind kind) { return kind == PathKind::kTcp; }

// Per-path figures a channel exposes (bytes and chunks moved, measured rate).
struct PathStats {
  std::string localAddress;
  std::string remoteAddress;
  bool alive = false;
  bool stalled = false;
  bool relay = false;  // a relay slot: a path through a third node when up
  int relayVia = -1;   // the rank a live relay path goes through
  PathKind kind = PathKind::kTcp;
  std::uint64_t bytesSent = 0;
  std::uint64_t chunksSent = 0;
  std::uint64_t chunksResent = 0;
  std::uint64_t bytesReceived = 0;
  double rateBytesPerSec = 0;  // measured delivery rate while busy; 0 until measured
  double weight = 1.0;  // routing's preference (setPathWeights)
  PathTelemetry telemetry;  // the backend's own figures (about once a second)
};

// Tags with bit 62 set and bit 63 clear are background tags: control traffic whose receives
// stay posted for the channel's life. A peer closing gracefully while only such receives
// are waiting is a normal end, not an error (the receives still fail, quietly).
inline constexpr std::uint64_t kBackgroundTagBit = std::uint64_t{1} << 62;
constexpr bool isBackgroundTag(std::uint64_t tag) { return (tag >> 62) == 1; }

class Channel {
 public:
  virtual ~Channel() = default;

  // Starts sending `bytes` bytes from `data` with `tag`.
  virtual Result<RequestPtr> isend(const void* data, std::size_t bytes, std::uint64_t tag) = 0;
  // Starts receiving the next message with `tag` into `data` (capacity `capacityBytes`).
  // A message larger than the capacity fails the request with kInvalidArgument.
  virtual Result<RequestPtr> irecv(void* data, std::size_t capacityBytes, std::uint64_t tag) = 0;

  virtual int peerRank() const = 0;
  virtual std::vector<PathStats> pathStats() const = 0;
  // Routing's preference per path (index as in pathStats; 1 = neutral, larger takes more).
  // 0 (or below) says routing sees the path down: it carries nothing while another usable
  // path has a positive weight, and is used again when none has. Thread-safe; extra entries
  // are ignored, missing ones stay as they are.
  virtual void setPathWeights(std::span<const double> weights) = 0;
  // The channel's sticky error (ok while usable).
  virtual Status health() const = 0;
  // The channel ended because the peer closed every path on purpose with nothing of ours
  // outstanding (it finished first, or it is leaving the job): health() then holds the peer
  // error, but the peer left rather than failed.
  virtual bool peerLeft() const { return false; }
};

using ChannelPtr = std::shared_ptr<Channel>;

}  // namespace meridian::transport
