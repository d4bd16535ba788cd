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

// Per-path figures a channel exposes (bytes and chunks moved, measured rate).
struct PathStats {
  std::string localAddress;
  std::string remoteAddress;
  bool alive = false;
  bool stalled = false;
  bool relay = false;  // a relay slot: a path through a third node when up
  int relayVia = -1;   // the rank a live relay path goes through
  std::uint64_t bytesSent = 0;
  std::uint64_t chunksSent = 0;
  std::uint64_t chunksResent = 0;
  std::uint64_t bytesReceived = 0;
  double rateBytesPerSec = 0;  // measured delivery rate while busy; 0 until measured
  double weight = 1.0;  // routing's preference (setPathWeights)
  // Passive figures from the kernel (TCP_INFO of the path's streams, about once a second;
  // tcpRttUs < 0 until first read): the largest smoothed RTT, the summed delivery rate, and
  // the segments retransmitted so far.
  double tcpRttUs = -1;
  double tcpDeliveryBytesPerSec = 0;
  std::uint64_t tcpRetransmits = 0;
  // ... and the segments they have sent so far (with tcpRetransmits: the share resent
  // between two readings).
  std::uint64_t tcpSegmentsSent = 0;
};

// One reading of the kernel's figures for a path's streams (TCP_INFO), as PathStats shows them.
struct TcpFigures {
  double rttUs = -1;
  double deliveryBytesPerSec = 0;
  std::uint64_t retransmits = 0;
  std::uint64_t segmentsSent = 0;
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
  // Routing's preference per path (index as in pathStats; > 0, 1 = neutral, larger takes
  // more). Thread-safe; extra entries are ignored, missing ones stay as they are.
  virtual void setPathWeights(std::span<const double> weights) = 0;
  // The channel's sticky error (ok while usable).
  virtual Status health() const = 0;
};

using ChannelPtr = std::shared_ptr<Channel>;

}  // namespace meridian::transport
