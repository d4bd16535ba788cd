// Plan checkpoints (plan_sync.h has the protocol).
#include "collectives/plan_sync.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/log.h"
#include "core/metrics.h"

namespace meridian::collectives {

namespace {

Gauge& epochGauge() {
  static Gauge& g = MetricsRegistry::global().gauge(
      "meridian_routing_plan_epoch", "Epoch of the collective plan in force (0: the built-in choice)");
  return g;
}

}  // namespace

PlanSync::PlanSync(int rank, int size, std::vector<transport::ChannelPtr> channels, std::size_t maxCheckpointOps)
    : rank_(rank), size_(size), channels_(std::move(channels)), maxCheckpointOps_(std::max<std::size_t>(1, maxCheckpointOps)) {}

PlanSync::~PlanSync() = default;

void PlanSync::propose(std::shared_ptr<const routing::PlanTable> table, std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++proposedEpoch_;
  proposed_ = std::move(table);
  proposedReason_ = std::move(reason);
}

std::shared_ptr<const routing::PlanTable> PlanSync::latestProposal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return proposed_;
}

PlanInForce PlanSync::inForce() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inForce_;
}

void PlanSync::adopt(std::uint64_t epoch, std::shared_ptr<const routing::PlanTable> table, std::string reason,
                     std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch == inForce_.epoch) return;
  MLOG_INFO(kRouting, "plan epoch {} in force from collective {}: {}", epoch, seq, reason);
  opTable_ = table;
  inForce_ = PlanInForce{epoch, std::move(table), std::move(reason), seq};
  epochGauge().set(static_cast<double>(epoch));
}

void PlanSync::fail(Status why) {
  if (why.isOk()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  failure_ = std::move(why);
  failed_.store(true, std::memory_order_release);
}

Result<std::shared_ptr<const routing::PlanTable>> PlanSync::atCollective(std::uint64_t seq, TimePoint deadline,
                                                                         double meanOpSec) {
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  if (size_ > 1 && seq >= nextCheckpoint_) {
    MERIDIAN_RETURN_IF_ERROR(rank_ == 0 ? announce(seq, meanOpSec) : receive(seq, deadline));
    firstCheckpoint_ = false;
  }
  return opTable_;  // adopt() runs on this thread too: no lock on the way of every collective
}

Status PlanSync::announce(std::uint64_t seq, double meanOpSec) {
  // What A_(i-1) announced for this checkpoint takes effect here, as on every other rank.
  if (!firstCheckpoint_) adopt(announcedEpoch_, announcedTable_, announcedReason_, seq);
  // Sends of earlier announcements: done ones are dropped, a failed one fails this op.
  for (auto& out : outgoing_) {
    for (const auto& req : out->sends) {
      if (req->done() && !req->status().isOk()) return req->status().withContext("plan announcement");
    }
  }
  std::erase_if(outgoing_, [](const auto& out) {
    return std::all_of(out->sends.begin(), out->sends.end(), [](const auto& r) { return r->done(); });
  });

  const double spacing = std::chrono::duration<double>(kCheckpointSpacing).count();
  const double ops = meanOpSec > 0 ? std::ceil(spacing / meanOpSec) : 1.0;
  const auto k = static_cast<std::uint64_t>(std::clamp(ops, 1.0, static_cast<double>(maxCheckpointOps_)));
  routing::PlanAnnouncement a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    a.epoch = proposedEpoch_;
    a.reason = proposedReason_;
    announcedEpoch_ = proposedEpoch_;
    announcedTable_ = proposed_;
    announcedReason_ = proposedReason_;
  }
  a.nextCheckpoint = afterNext_ + k;
  // The table travels once per epoch; later announcements only confirm the epoch.
  if (a.epoch != tableSentEpoch_ && announcedTable_) a.table = *announcedTable_;
  tableSentEpoch_ = a.epoch;
  auto out = std::make_unique<Outgoing>();
  out->bytes = routing::encodeAnnouncement(a);
  for (int r = 1; r < size_; ++r) {
    MERIDIAN_ASSIGN_OR_RETURN(transport::RequestPtr req,
                              channels_[static_cast<std::size_t>(r)]->isend(out->bytes.data(), out->bytes.size(), kPlanTag));
    out->sends.push_back(std::move(req));
  }
  outgoing_.push_back(std::move(out));
  nextCheckpoint_ = afterNext_;
  afterNext_ = a.nextCheckpoint;
  return Status::ok();
}

Status PlanSync::receive(std::uint64_t seq, TimePoint deadline) {
  if (firstCheckpoint_) {
    nextCheckpoint_ = 1;  // C1 is fixed: nothing was announced before C0
  } else {
    MERIDIAN_RETURN_IF_ERROR(pending_->wait(deadline).withContext("waiting for rank 0's plan announcement"));
    MERIDIAN_RETURN_IF_ERROR(pending_->status().withContext("plan announcement"));
    auto decoded = routing::decodeAnnouncement(std::span<const std::uint8_t>(inbox_.data(), pending_->bytes()), size_);
    if (!decoded.isOk()) return peerError("rank 0 sent a bad plan announcement: {}", decoded.status().toString());
    routing::PlanAnnouncement a = std::move(decoded).value();
    if (a.nextCheckpoint <= seq) {
      return peerError("plan announcement names checkpoint {} at collective {}", a.nextCheckpoint, seq);
    }
    const PlanInForce now = inForce();
    if (a.epoch < now.epoch || (a.epoch > now.epoch && !a.table)) {
      return peerError("plan announcement of epoch {} without its table (in force: {})", a.epoch, now.epoch);
    }
    if (a.epoch > now.epoch) {
      adopt(a.epoch, std::make_shared<const routing::PlanTable>(std::move(*a.table)), std::move(a.reason), seq);
    }
    nextCheckpoint_ = a.nextCheckpoint;
  }
  if (inbox_.empty()) inbox_.resize(routing::kMaxAnnouncementBytes);
  MERIDIAN_ASSIGN_OR_RETURN(pending_, channels_[0]->irecv(inbox_.data(), inbox_.size(), kPlanTag));
  return Status::ok();
}

}  // namespace meridian::collectives
