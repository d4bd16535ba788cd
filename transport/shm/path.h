// ShmPath: one path of a multipath channel between two ranks on one host, over a pair of
// rings (ring.h) in one shared segment (segment.h). It is driven like a fabric path: the
// backend's progress calls pump(), which reads what the peer wrote, writes acknowledgements
// and then the chunks the engine gives this path, and rings the peer's doorbell only when the
// peer went to sleep.
//
// What travels: every frame is a kFrame record (its header, and inline what the frame
// carries); a payload too long for one record goes on in kPiece records. Acknowledgements go
// between records of a chunk at any time. Large chunks of a channel whose peer reads this
// side's memory (tcp/direct_read.h) go as DATA-REF: the record holds the address and the
// receiver copies the chunk straight out of the sender's buffer, one copy. Otherwise the
// payload is copied into the ring and out of it (two copies in user space, no system call).
//
// Why no sealing: the bytes never leave the host, and whoever can read the segment (this
// user; it is mode 0600) can read either process's memory anyway. MERIDIAN_WIRE_SECURITY
// applies to what crosses a network. What the peer writes is still checked: a record or
// counter that breaks the ring's bounds, a frame that does not decode, a payload longer than
// its header says, all fail the path with a peer error; nothing is trusted to be in bounds.
//
// Failure: a goodbye (kClose) ends the path gracefully; a peer process that is gone (its
// pidfd, watched by the caller, or a look every kAliveCheckUs; what it wrote before is read
// first) or a broken record fails it, and the engine moves its chunks to the channel's other
// paths (its TCP paths, on standby while this one is up).
//
// Threads: pump() and the rest from the backend's progress (one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>

#include "core/fd.h"
#include "core/metrics.h"
#include "transport/engine.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"

namespace meridian::transport::shm {

// Each direction's ring (a power of two): every chunk streams through it, so a larger ring
// lets the writer run further ahead of the reader (measured on 2 ranks, 16 MiB broadcast:
// 4.1-4.4 ms with 2 MiB rings, about 10 ms with 512 KiB, where the writer waits for room
// every few records). The size shrinks with the number of peers on the host, so /dev/shm
// holds about 8 MiB per rank with every pair connected (container /dev/shm is often 64 MiB).
inline constexpr std::size_t kMaxPathRingBytes = 2u << 20;
inline constexpr std::size_t kMinPathRingBytes = 128u << 10;
inline constexpr std::size_t pathRingBytes(int sameHostPeers) {
  std::size_t cap = kMaxPathRingBytes;
  while (cap > kMinPathRingBytes && static_cast<std::size_t>(sameHostPeers > 1 ? sameHostPeers : 1) * cap > (4u << 20)) {
    cap /= 2;
  }
  return cap;
}
// A pair's segment: the header page and two rings.
inline constexpr std::size_t pathSegmentBytes(std::size_t ringCapacity) {
  return kSegmentHeaderBytes + 2 * ringBytes(ringCapacity);
}
// The ring capacity a segment of `bytes` holds (the largest power of two that fits; 0: none).
std::size_t ringCapacityOf(std::size_t bytes);

struct ShmPathConfig {
  std::size_t index = 0;            // the channel's path index
  std::int32_t peerPid = 0;         // its exit fails the path (0: not watched)
  // The caller watches the peer's exit (a pidfd) and calls peerExited(); otherwise the path
  // looks at the process every kAliveCheckUs.
  bool exitWatched = false;
  // Reads `n` bytes at the peer's address into dst (the backend's same-host reads,
  // tcp/direct_read.h); empty: the peer may not send DATA-REF chunks on this path.
  std::function<Status(std::uint8_t* dst, std::uint64_t address, std::size_t n)> readPeer;
  UniqueFd peerDoorbell;            // the peer's progress doorbell (an eventfd); -1: the peer polls
  std::size_t ringCapacity = kMaxPathRingBytes;  // ringCapacityOf(the segment's size)
  Counter* directReadBytes = nullptr;  // may be null
};

class ShmPath {
 public:
  static constexpr std::int64_t kAliveCheckUs = 100'000;

  // The path over `segment` (of pathSegmentBytes(config.ringCapacity) bytes at least).
  // `creator`: this side created the segment and writes its first ring.
  ShmPath(ShmSegment segment, bool creator, ChannelEngine& engine, ShmPathConfig config);
  ShmPath(const ShmPath&) = delete;
  ShmPath& operator=(const ShmPath&) = delete;

  // Reads what the peer wrote (acknowledgements open the engine's windows: the backend
  // schedules after this), then writes acknowledgements and chunks; each returns how many
  // records it moved. pump() is both.
  std::size_t receive(std::int64_t nowUs);
  std::size_t send(std::int64_t nowUs);
  std::size_t pump(std::int64_t nowUs);
  // Before the backend's thread sleeps: false when there is work now (or room came back for
  // work that waited). Otherwise the peer rings the doorbell when it has some.
  bool readyToSleep();
  // The thread that slept (readyToSleep() said yes) is up again: the flags go down. Only that
  // thread may call it: a waiting thread's pump that took them down would leave the sleeper
  // to its timeout when the peer writes next.
  void awake();
  // Queues the goodbye; no chunk goes out after it. pump() until !hasUnsentFrames().
  void sayGoodbye();
  bool hasUnsentFrames() const { return !controls_.empty() && !failed_; }
  void fail(const Status& why);
  bool failed() const { return failed_; }
  // The peer's process exited (seen here or by the caller): what it wrote before is read,
  // then the path fails unless that ended it (a goodbye).
  void peerExited();
  // The peer can ring this side's doorbell (it said so in its ring); false: poll.
  bool peerRings() const { return rx_.producerRings(); }
  // Chunks written and not yet acknowledged, a chunk half read or half written, or a full
  // ring: the backend sleeps at most a moment (a safety net under the doorbells).
  bool busy() const { return unacked_ > 0 || reading_ || writing_ || blocked_; }

 private:
  void end(const Status& why);
  // Both ends of the path: the engine hears of it once, graceful (a goodbye) or not.
  void stop(const Status& why, bool graceful);
  void ring();
  // Writes queued control frames, then chunks; false when the ring was full.
  bool write(std::int64_t nowUs, std::size_t* moved);
  bool writeControls(std::size_t* moved);
  bool writeChunks(std::int64_t nowUs, std::size_t* moved);
  bool writeChunkPieces();
  std::size_t read();
  void take(const Record& r);
  void beginData(const FrameHeader& h, std::span<const std::uint8_t> inlinePayload);
  void payload(std::span<const std::uint8_t> bytes);
  void finishData();
  void failPeer(const Status& why);

  ShmSegment segment_;
  ChannelEngine& engine_;
  ShmPathConfig config_;
  RingWriter tx_;
  RingReader rx_;
  std::deque<FrameHeader> controls_;  // acknowledgements (and a goodbye) to write
  // The chunk being written (its header went out; `written` payload bytes so far).
  bool writing_ = false;
  OutChunk chunk_;
  std::uint32_t chunkBytes_ = 0;
  std::uint32_t written_ = 0;
  // The chunk being read.
  bool reading_ = false;
  RecvTarget target_;
  std::uint64_t got_ = 0;
  bool blocked_ = false;   // the last pump found the ring full with work to write
  std::uint64_t unacked_ = 0;  // chunks written whose acknowledgement has not come
  bool closing_ = false;
  bool failed_ = false;
  std::int64_t lastAliveCheckUs_ = 0;
};

}  // namespace meridian::transport::shm
