// ChannelEngine: the multipath protocol as a backend drives it. A backend (tcp/, memory/,
// later fabric/ and shm/) owns the paths to one peer and moves frames on them; the engine
// decides which chunk goes on which path, where an arriving chunk goes, what to acknowledge,
// and what to send again when a path fails or stalls. Callers of the channel never see this
// side: they hold the user-facing Channel (channel.h) of the same channel.
//
// A backend's loop, per channel:
//   drainPosted(); schedule(now);                       take new sends/receives, assign chunks
//   while (nextChunk(path, &c)) write chunkHeader(c) + chunkPayload(c, ...) or chunkRef(c),
//                                then onChunkWritten(path, c, now)
//   on a DATA/DATA-REF header:   t = onDataHeader(h, path); fill targetPointer(t, ...);
//                                ack = onDataComplete(t, path); send ack on that path
//   on an ACK header:            onAck(h, path, now)
//   on a dead path:              onPathFailed(path, why, graceful)
//   now and then:                checkStalls(now); setPathTelemetry(path, figures)
//
// Threads: every method only from the thread that runs the backend's progress (its progress
// thread, or a waiting thread that holds the backend's progress lock), except failed() and
// pathLabels(), which any thread may call. Times are microseconds on one monotonic clock
// (core/clock.h's nowUs(), or a test's own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/status.h"
#include "transport/channel.h"
#include "transport/frame.h"

namespace meridian::transport {

struct PathEndpoints {
  std::string localAddress;   // for people and metrics: the backend's name of each end
  std::string remoteAddress;
  // A relay slot: a path through a third node, down until onPathUp (the device opens and
  // closes it while the channel runs; see Device::openRelay).
  bool relay = false;
  // A fabric path (libfabric rail) or a shared-memory path: down until onPathUp, like a relay
  // slot (its peer has not named its rail or paired yet), but a direct path once up; probes
  // do not reach it, so routing judges it by its measured rate alone (probesReach).
  PathKind kind = PathKind::kTcp;
  // Carries data only while no path without it is usable, control frames always (a TCP path
  // beside fabric paths under MERIDIAN_FABRIC_TCP=standby): the fabric takes the data, TCP
  // takes it over when the fabric fails or stalls.
  bool standby = false;
};

// The protocol's settings; the backend fills them from its knobs.
struct MultipathConfig {
  std::uint32_t chunkBytes = 512 * 1024;
  std::uint64_t eagerMaxBytes = 64 * 1024;        // sends up to this size are copied (eager)
  std::uint64_t eagerBudgetBytes = 16u << 20;     // eager copies not yet acknowledged, at most
  std::uint64_t pathWindowBytes = 16u << 20;      // unacknowledged bytes per path
  // ... on a path whose rate is still a guess: no rate sample yet and less than this much
  // acknowledged (adaptive scheduling; see PathLoad::cold). Every rate starts as the same
  // guess; without this a job's first messages are split evenly across a fast and a
  // congested plane and wait for the congested one's half (docs/transport.md has the figures).
  std::uint64_t coldWindowBytes = 1u << 20;
  std::int64_t pathStallUs = 3'000'000;
  std::uint64_t maxUnexpectedBytes = 1ull << 30;
  std::string deviceName = "0";                    // metrics label
  std::string peerLabel;                           // metrics "peer" label; empty: the peer's rank
  // false (MERIDIAN_ROUTING=static): fixed even striping, as NCCL splits over several NICs:
  // every live path gets the same share of the bytes whatever its rate or weight, and a
  // chunk waits for its path's window rather than move to another path.
  bool adaptive = true;
  // The peer reads this side's large messages straight from its memory (a backend with
  // remote reads, e.g. tcp/direct_read.h on one host): every message that is not eager goes
  // as DATA-REF chunks, a RemoteRef in place of the payload.
  bool peerReadsDirect = false;
};

struct OutMessage;
struct InMessage;

// One chunk handed to a path for writing.
struct OutChunk {
  std::shared_ptr<OutMessage> msg;
  std::uint32_t index = 0;
};

// Where an arriving chunk's payload goes.
struct RecvTarget {
  std::shared_ptr<InMessage> msg;  // null: drain and drop (duplicate of a finished message)
  FrameHeader header;
};

class ChannelEngine {
 public:
  virtual ~ChannelEngine() = default;

  virtual std::size_t pathCount() const = 0;
  // The metric labels of a path's series (device, peer, path), for a backend's own gauges.
  virtual MetricLabels pathLabels(std::size_t path) const = 0;

  // ---- sending ----
  // Takes newly posted sends and receives into the protocol state.
  virtual void drainPosted() = 0;
  // Assigns pending chunks to paths.
  virtual void schedule(std::int64_t nowUs) = 0;
  // The next chunk `path` should write; false when there is none.
  virtual bool nextChunk(std::size_t path, OutChunk* out) = 0;
  // The chunk's header (type kData, or kDataRef when the peer reads it itself).
  virtual FrameHeader chunkHeader(const OutChunk& c) const = 0;
  // Where a kDataRef chunk's first byte lies in this process (key 0: a backend whose reads
  // need a key fills in its registration's).
  virtual RemoteRef chunkRef(const OutChunk& c) const = 0;
  // The chunk's payload from byte `progress` on (at most `*bytes` back); once the message
  // completed elsewhere the payload reads as zeros (the peer drops it).
  virtual const std::uint8_t* chunkPayload(const OutChunk& c, std::uint64_t progress, std::size_t* bytes) const = 0;
  virtual void onChunkWritten(std::size_t path, const OutChunk& c, std::int64_t nowUs) = 0;

  // ---- receiving ----
  // A chunk's header arrived on `path` (a peer error fails the channel: the caller closes it).
  virtual Result<RecvTarget> onDataHeader(const FrameHeader& h, std::size_t path) = 0;
  // Destination for payload byte `progress` of the chunk, or nullptr to drop it.
  virtual std::uint8_t* targetPointer(const RecvTarget& t, std::uint64_t progress) const = 0;
  // The chunk is fully in; returns the acknowledgement to send back on that path.
  virtual Result<FrameHeader> onDataComplete(const RecvTarget& t, std::size_t path) = 0;
  virtual Status onAck(const FrameHeader& h, std::size_t path, std::int64_t nowUs) = 0;

  // ---- paths ----
  // A path died. `graceful`: the peer closed it on purpose. Its chunks move to other paths.
  virtual void onPathFailed(std::size_t path, const Status& why, bool graceful) = 0;
  // A relay slot is connected (through rank `via`): it carries chunks from now on.
  virtual void onPathUp(std::size_t path, int via) = 0;
  // Paths with bytes in flight and no acknowledgement for too long count as stalled.
  virtual void checkStalls(std::int64_t nowUs) = 0;
  // The backend's own figures of a path (PathStats::telemetry).
  virtual void setPathTelemetry(std::size_t path, const PathTelemetry& figures) = 0;

  // ---- the channel as a whole ----
  // Fails every outstanding request and all later calls with `why`.
  virtual void fail(const Status& why) = 0;
  virtual bool failed() const = 0;
  // From now on isend/irecv fail with `why` (the device is closing); what was posted goes on.
  virtual void refuseNewPosts(const Status& why) = 0;
  // Eager sends (complete for their callers) the peer has not acknowledged yet.
  virtual bool hasUnackedEagerSends() const = 0;
};

// Both sides of one multipath channel: what the device hands its caller, and what it drives.
struct EngineChannel {
  ChannelPtr channel;
  std::shared_ptr<ChannelEngine> engine;
};

// A channel to `peerRank` over `paths`. `wakeProgress` rings the backend's progress thread
// (posting calls it when there is new work and no waiting thread can run the engine);
// `progressor` (may be null) lets waiting threads run the backend's progress themselves.
EngineChannel makeMultipathChannel(int peerRank, std::vector<PathEndpoints> paths, MultipathConfig config,
                                   std::function<void()> wakeProgress, std::shared_ptr<Progressor> progressor);

}  // namespace meridian::transport
