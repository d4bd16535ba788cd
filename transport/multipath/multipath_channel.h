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
// It is both sides of a channel: the user-facing Channel and the backend-facing
// ChannelEngine (engine.h). Backends create it through makeMultipathChannel and see only
// the engine; this header is for the implementation and its tests.
//
// Threads: isend/irecv/pathStats/health from any thread (posting takes a short lock);
// the engine's methods only from the backend's progress thread, which owns all state.
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
#include "transport/engine.h"
#include "transport/frame.h"
#include "transport/multipath/scheduler.h"

namespace meridian::transport {

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

class MultipathChannel final : public Channel,
                               public ChannelEngine,
                               public std::enable_shared_from_this<MultipathChannel> {
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
  bool peerLeft() const override { return peerLeft_.load(std::memory_order_acquire); }

  // ChannelEngine (progress thread; see engine.h).
  std::size_t pathCount() const override { return paths_.size(); }
  MetricLabels pathLabels(std::size_t path) const override;
  void drainPosted() override;
  void schedule(std::int64_t nowUs) override;
  bool nextChunk(std::size_t path, OutChunk* out) override;
  FrameHeader chunkHeader(const OutChunk& c) const override;
  RemoteRef chunkRef(const OutChunk& c) const override;
  const std::uint8_t* chunkPayload(const OutChunk& c, std::uint64_t progress, std::size_t* bytes) const override;
  void onChunkWritten(std::size_t path, const OutChunk& c, std::int64_t nowUs) override;
  Result<RecvTarget> onDataHeader(const FrameHeader& h, std::size_t path) override;
  std::uint8_t* targetPointer(const RecvTarget& t, std::uint64_t progress) const override;
  Result<FrameHeader> onDataComplete(const RecvTarget& t, std::size_t path) override;
  Status onAck(const FrameHeader& h, std::size_t path, std::int64_t nowUs) override;
  void onPathFailed(std::size_t path, const Status& why, bool graceful) override;
  void onPathUp(std::size_t path, int via) override;
  void checkStalls(std::int64_t nowUs) override;
  void setPathTelemetry(std::size_t path, const PathTelemetry& figures) override;
  void fail(const Status& why) override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  void refuseNewPosts(const Status& why) override;
  bool hasUnackedEagerSends() const override;

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
  // How long a path with bytes in flight may go without an acknowledgement (checkStalls);
  // `idleElsewhere`: another usable path has nothing in flight.
  std::int64_t stallLimitUs(const PathState& p, bool idleElsewhere) const;
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
  std::atomic<bool> peerLeft_{false};  // the last path closed gracefully with nothing outstanding
  Status closing_;  // non-ok once the device refuses new posts

  // Progress-thread state: sending.
  std::vector<PathLoad> loads_;  // scratch for schedule()
  std::vector<std::uint64_t> assignedBytes_;  // static striping: bytes ever assigned per path
  std::atomic<bool> rerateAny_{false};         // some path's weight went up (setPathWeights)
  bool anyStandby_ = false;                    // some path is PathEndpoints::standby (fixed at creation)
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
