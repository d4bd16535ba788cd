// The algorithms' shared plumbing: scratch arena, tagged send/receive helpers and the
// queue of outstanding sends.
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "collectives/algorithms/algorithm.h"

namespace meridian::collectives {

namespace {
constexpr std::size_t kScratchAlignBytes = 4096;
}  // namespace

PipelineWindows pipelineWindows(const AlgoContext& ctx) {
  const std::size_t seg = ctx.segmentElems() * ctx.elemBytes;
  auto clampSegs = [&](std::size_t bytes) {
    std::size_t n = bytes / seg;
    if (n < 4) n = 4;
    return n > PipelineWindows::kMaxSegments ? PipelineWindows::kMaxSegments : n;
  };
  return {clampSegs(std::size_t{8} << 20), clampSegs(std::size_t{16} << 20), clampSegs(std::size_t{64} << 20)};
}

void ScratchArena::Free::operator()(std::byte* p) const { std::free(p); }

std::byte* ScratchArena::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return data_.get();
  std::size_t cap = capacity_ * 2 > bytes ? capacity_ * 2 : bytes;
  cap = (cap + kScratchAlignBytes - 1) / kScratchAlignBytes * kScratchAlignBytes;
  data_.reset();  // give the old pages back first; nothing in it is live between ops
  capacity_ = 0;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kScratchAlignBytes, cap));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, cap);  // pre-touch: page faults here, not in the data path
  data_.reset(p);
  capacity_ = cap;
  return p;
}

void RequestTracker::add(transport::RequestPtr req) {
  if (reqs_.size() >= pruneAt_) prune();
  reqs_.push_back(std::move(req));
}

void RequestTracker::prune() {
  std::erase_if(reqs_, [](const transport::RequestPtr& r) { return r->done(); });
  pruneAt_ = reqs_.size() * 2 > 64 ? reqs_.size() * 2 : 64;
}

std::vector<transport::RequestPtr> RequestTracker::takeUnfinished() {
  prune();
  std::vector<transport::RequestPtr> out;
  out.swap(reqs_);
  pruneAt_ = 64;
  return out;
}

namespace {
Result<transport::RequestPtr> tracked(const AlgoContext& ctx, Result<transport::RequestPtr> req) {
  if (req.isOk() && ctx.tracker != nullptr) ctx.tracker->add(req.value());
  return req;
}
}  // namespace

Result<transport::RequestPtr> postSend(const AlgoContext& ctx, int peer, const void* data, std::size_t bytes,
                                       std::uint64_t phase) {
  const transport::ChannelPtr& ch = ctx.channels[static_cast<std::size_t>(peer)];
  if (!ch) return internalError("no channel from rank {} to rank {}", ctx.rank, peer);
  return tracked(ctx, ch->isend(data, bytes, ctx.tagBase + phase));
}

Result<transport::RequestPtr> postRecv(const AlgoContext& ctx, int peer, void* data, std::size_t bytes,
                                       std::uint64_t phase) {
  const transport::ChannelPtr& ch = ctx.channels[static_cast<std::size_t>(peer)];
  if (!ch) return internalError("no channel from rank {} to rank {}", ctx.rank, peer);
  return tracked(ctx, ch->irecv(data, bytes, ctx.tagBase + phase));
}

Status waitRequest(const AlgoContext& ctx, const transport::RequestPtr& req, std::size_t expectBytes,
                   const char* what) {
  Status st = req->wait(ctx.deadline);
  if (!st.isOk()) {
    if (st.code() == StatusCode::kTimeout && !req->done()) {
      return timeoutError("{}: rank {} timed out (op timeout: CommOptions::timeout or MERIDIAN_TIMEOUT_MS)", what,
                          ctx.rank);
    }
    return st.withContext(what);
  }
  if (expectBytes != kAnyBytes && req->bytes() != expectBytes) {
    return commError("{}: rank {} received {} bytes where {} were expected (ranks disagree about the op)", what,
                     ctx.rank, req->bytes(), expectBytes);
  }
  return Status::ok();
}

Status sendRecv(const AlgoContext& ctx, int sendPeer, const void* sendData, std::size_t sendBytes, int recvPeer,
                void* recvData, std::size_t recvBytes, std::uint64_t phase) {
  MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr r, postRecv(ctx, recvPeer, recvData, recvBytes, phase));
  auto s = postSend(ctx, sendPeer, sendData, sendBytes, phase);
  if (!s.isOk()) {
    // The receive stays posted; the caller marks the communicator broken.
    return s.status();
  }
  Status rs = waitRequest(ctx, r, recvBytes, "receive");
  Status ss = waitRequest(ctx, s.value(), kAnyBytes, "send");
  return rs.isOk() ? ss : rs;
}

void SendQueue::push(transport::RequestPtr req) { reqs_.push_back(std::move(req)); }

std::size_t SendQueue::inFlight() {
  while (!reqs_.empty() && reqs_.front()->done()) {
    const Status& st = reqs_.front()->status();
    if (!st.isOk() && firstError_.isOk()) firstError_ = st.withContext("send");
    reqs_.pop_front();
  }
  return reqs_.size();
}

Status SendQueue::waitOldest() {
  if (reqs_.empty()) return firstError_;
  transport::RequestPtr req = std::move(reqs_.front());
  reqs_.pop_front();
  Status st = waitRequest(ctx_, req, kAnyBytes, "send");
  if (!st.isOk() && firstError_.isOk()) firstError_ = st;
  return firstError_;
}

Status SendQueue::waitAll() {
  while (!reqs_.empty()) {
    Status st = waitOldest();
    if (st.code() == StatusCode::kTimeout) break;  // the rest cannot finish sooner
  }
  return firstError_;
}

SubContext::SubContext(const AlgoContext& parent, const std::vector<int>& members, std::uint64_t phaseOffset)
    : channels_(members.size()), ctx_(parent) {
  ctx_.size = static_cast<int>(members.size());
  ctx_.rank = -1;
  ctx_.tagBase = parent.tagBase + phaseOffset;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r < 0 || r >= parent.size) {
      status_ = invalidArgument("sub-context names rank {} of {}", r, parent.size);
      return;
    }
    if (r == parent.rank) {
      ctx_.rank = static_cast<int>(i);
    } else {
      channels_[i] = parent.channels[static_cast<std::size_t>(r)];
    }
  }
  if (ctx_.rank < 0) status_ = invalidArgument("rank {} is not in its sub-context", parent.rank);
  ctx_.channels = channels_;
}

}  // namespace meridian::collectives
