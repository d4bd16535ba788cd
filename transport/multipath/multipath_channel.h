// MultipathChannel: the backend-independent protocol of a channel to one peer. It cuts
// each message into chunks, schedules every chunk on the path expected to finish it first
// (scheduler.h), places received chunks by offset, acknowledges them, resends chunks in
// flight on a path that fails or stalls on another path, drops duplicates, and completes
// each message exactly once (or fails it with a peer error when no path is left).
//
// Matching: the sender numbers messages per channel (seq) and tells, for each, the seq of
// its previous message with the same tag (or that it is the first with its tag, or a
// bound on earlier ones once the tag was forgotten); the receiver matches a message to the
// next receive posted for its tag as soon as every earlier message with that tag is
// matched, so tags stay FIFO across paths and nothing waits for other tags.
//
// Threads: isend/irecv/pathStats/health from any thread (posting takes a short lock);
// every other method only from the backend's progress thread, which owns all state.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/metrics.h"
#include "transport/channel.h"
#include "transport/frame.h"
#include "transport/multipath/scheduler.h"

namespace meridian::transport {

struct MultipathConfig {
  std::uint32_t chunkBytes = 512 * 1024;
  std::uint64_t eagerMaxBytes = 64 * 1024;        // sends up to this size are copied (eager)
  std::uint64_t eagerBudgetBytes = 16u << 20;     // eager copies not yet acknowledged, at most
  std::uint64_t pathWindowBytes = 16u << 20;      // unacknowledged bytes per path
  // ... on a path whose rate is still a guess: no rate sample yet and less than this much
  // acknowledged (adaptive scheduling; see PathLoad::cold). Every rate starts as the same
  // guess; without this, a job's first messages were split evenly across a fast and a
  // congested plane and waited for the congested one's half (three lab regions starting into
  // an 8 Mbit/s plane next to 40 Mbit/s ones: the first 16 MiB allreduce took 10.3 s without
  // it and 4.1 s with it; later ones 2.5-3 s).
  std::uint64_t coldWindowBytes = 1u << 20;
  std::int64_t pathStallUs = 3'000'000;
  std::uint64_t maxUnexpectedBytes = 1ull << 30;
  std::string deviceName = "0";                    // metrics label
  std::string peerLabel;                           // metrics "peer" label; empty: the peer's rank
  // false (MERIDIAN_ROUTING=static): fixed even striping, as NCCL splits over several NICs:
  // every live path gets the same share of the bytes whatever its rate or weight, and a
  // chunk waits for its path's window rather than move to another path.
  bool adaptive = true;
  // The peer reads this side's large messages straight from its memory (same host; see
  // tcp/direct_read.h): every message that is not eager goes as kDataRef chunks, addresses
  // in place of payload.
  bool peerReadsDirect = false;
};

struct PathEndpoints {
  std::string localAddress;
  std::string remoteAddress;
  // A relay slot: a path through a third node, down until onPathUp (the device opens and
  // closes it while the channel runs; see TcpDevice::openRelay).
  bool relay = false;
};

// Buffers for messages that arrive before their receive, kept for reuse (up to a bound)
// so the data path does not fault in fresh pages for each one. Progress thread only.
class BufferPool {
 public:
  struct Buffer {
    std::unique_ptr<std::uint8_t[]> data;
    std::uint64_t capacity = 0;
  };
  explicit BufferPool(std::uint64_t maxCachedBytes) : maxCachedBytes_(maxCachedBytes) {}
  Buffer take(std::uint64_t bytes);
  void give(Buffer b);

 private:
  std::uint64_t maxCachedBytes_;
  std::uint64_t cachedBytes_ = 0;
  std::multimap<std::uint64_t, std::unique_ptr<std::uint8_t[]>> free_;
};

struct OutMessage;
struct InMessage;

// One chunk handed to a stream of a path for writing.
struct OutChunk {
  std::shared_ptr<OutMessage> msg;
  std::uint32_t index = 0;
};

// Where an arriving chunk's payload goes.
struct RecvTarget {
  std::shared_ptr<InMessage> msg;  // null: drain and drop (duplicate of a finished message)
  FrameHeader header;
};

class MultipathChannel : public Channel, public std::enable_shared_from_this<MultipathChannel> {
 public:
  MultipathChannel(int peerRank, std::vector<PathEndpoints> paths, MultipathConfig config,
                   std::function<void()> wakeProgress, std::shared_ptr<Progressor> progressor = nullptr);
  ~MultipathChannel() override;

  // Channel (any thread).
  Result<RequestPtr> isend(const void* data, std::size_t bytes, std::uint64_t tag) override;
  Result<RequestPtr> irecv(void* data, std::size_t capacityBytes, std::uint64_t tag) override;
  int peerRank() const override { return peerRank_; }
  std::vector<PathStats> pathStats() const override;
  void setPathWeights(std::span<const double> weights) override;
  Status health() const override;

  // ---- progress thread only ----
  std::size_t pathCount() const { return paths_.size(); }
  // Takes newly posted sends and receives into the protocol state.
  void drainPosted();
  // Assigns pending chunks to paths.
  void schedule(std::int64_t nowUs);
  // The next chunk a stream of `path` should write; false when there is none.
  bool nextChunk(std::size_t path, OutChunk* out);
  // The chunk's header, and its payload from byte `progress` on (at most `maxBytes`);
  // once the message completed elsewhere the payload reads as zeros (the peer drops it).
  FrameHeader chunkHeader(const OutChunk& c) const;
  // Where a kDataRef chunk's first byte lies in this process (what the frame carries).
  std::uint64_t chunkAddress(const OutChunk& c) const;
  const std::uint8_t* chunkPayload(const OutChunk& c, std::uint64_t progress, std::size_t* bytes) const;
  void onChunkWritten(std::size_t path, const OutChunk& c, std::int64_t nowUs);

  Result<RecvTarget> onDataHeader(const FrameHeader& h, std::size_t path);
  // Destination for payload byte `progress` of the chunk, or nullptr to drop it.
  std::uint8_t* targetPointer(const RecvTarget& t, std::uint64_t progress) const;
  // The chunk is fully read; returns the acknowledgement to send back on that stream.
  Result<FrameHeader> onDataComplete(const RecvTarget& t, std::size_t path);
  Status onAck(const FrameHeader& h, std::size_t path, std::int64_t nowUs);

  // A path died (its streams are closed). `graceful`: the peer closed it on purpose.
  void onPathFailed(std::size_t path, const Status& why, bool graceful);
  // A relay slot's streams are connected (through rank `via`): the path carries chunks
  // from now on, starting from the best rate any path has.
  void onPathUp(std::size_t path, int via);
  void checkStalls(std::int64_t nowUs);
  // The kernel's figures for a path's streams (see PathStats).
  void setTcpFigures(std::size_t path, const TcpFigures& figures);
  // Fails every outstanding request and all later calls with `why`.
  void fail(const Status& why);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // From now on isend/irecv fail with `why` (the device is closing); what was posted goes on.
  void refuseNewPosts(const Status& why);
  // Eager sends (complete for their callers) the peer has not acknowledged yet.
  bool hasUnackedEagerSends() const;

 private:
  struct PathState;
  struct PostedRecv {
    std::uint8_t* data;
    std::size_t capacity;
    std::uint64_t tag;
    RequestPtr req;
  };

  void kick();
  // Takes newly posted receives in (binding those whose message came first).
  void drainPostedRecvs();
  void requeueChunksOf(std::size_t path);
  // How long a path with bytes in flight may go without an acknowledgement (checkStalls).
  std::int64_t stallLimitUs(const PathState& p) const;
  void matchReady(std::shared_ptr<InMessage> msg);
  bool canMatch(const InMessage& m) const;
  void markMatched(std::uint64_t seq);
  Status bind(InMessage& msg, PostedRecv recv);
  void finishIn(const std::shared_ptr<InMessage>& msg);
  bool isFinishedSeq(std::uint64_t seq) const;
  Status allocateBuffer(InMessage& msg);
  void releaseBuffer(InMessage& msg);

  const int peerRank_;
  const MultipathConfig config_;
  std::function<void()> wake_;
  std::shared_ptr<Progressor> progressor_;
  // Small sends are copied and complete at once (eager); bytes copied and not yet acked.
  std::atomic<std::uint64_t> eagerBytes_{0};
  std::vector<std::unique_ptr<PathState>> paths_;

  // Posting side (any thread), under postMu_.
  mutable std::mutex postMu_;
  std::uint64_t nextSendSeq_ = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> lastSentSeqByTag_;
  bool forgotTags_ = false;            // some tags were dropped from lastSentSeqByTag_
  std::uint64_t forgottenUpToSeq_ = 0;  // ... and their messages all have seq <= this
  std::vector<std::shared_ptr<OutMessage>> postedSends_;
  std::vector<PostedRecv> postedRecvs_;
  Status error_;
  std::atomic<bool> failed_{false};
  Status closing_;  // non-ok once the device refuses new posts

  // Progress-thread state: sending.
  std::vector<PathLoad> loads_;  // scratch for schedule()
  std::vector<std::uint64_t> assignedBytes_;  // static striping: bytes ever assigned per path
  std::atomic<bool> rerateAny_{false};         // some path's weight went up (setPathWeights)
  std::uint64_t drainedSendSeqEnd_ = 0;  // every seq below this was taken into sending_
  std::deque<std::shared_ptr<OutMessage>> sending_;
  std::unordered_map<std::uint64_t, std::shared_ptr<OutMessage>> sendingBySeq_;

  // Progress-thread state: receiving.
  std::map<std::uint64_t, std::shared_ptr<InMessage>> incoming_;  // seen, not finished (or unmatched)
  std::uint64_t nextMatchSeq_ = 0;
  std::set<std::uint64_t> matchedAhead_;
  std::unordered_map<std::uint64_t, std::uint64_t> lastMatchedByTag_;
  std::unordered_map<std::uint64_t, std::deque<PostedRecv>> recvsByTag_;
  std::unordered_map<std::uint64_t, std::deque<std::shared_ptr<InMessage>>> unexpectedByTag_;
  std::uint64_t bufferedBytes_ = 0;
  Counter* unexpectedBytes_ = nullptr;  // bytes that arrived before their receive was posted (then copied once)
  BufferPool pool_{64u << 20};
};

}  // namespace meridian::transport
