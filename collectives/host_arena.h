// HostArena: the ranks of a group that share one host, each with a shared-memory segment
// (transport/shm/segment.h) that every other maps, and collectives that use that memory the way
// memory wants to be used: no sockets, no progress thread, no copies a CPU need not make.
//
// Segment of rank r (one per rank, mapped by all):
//   header page   identity (SegmentHeader), then r's flags, each on its own 128-byte line:
//                 `arrived` (r's input for op s is in place), `reduced` (r's slice of op s
//                 is reduced), `waiters` (peers asleep on r's flags), `aborted` (r left:
//                 its communicator broke)
//   inputs        two windows of kWindowBytes, alternating by op number
//   results       two windows of kWindowBytes, alternating by op number
//
// Allreduce, window by window (each window one op number s, the same on every rank since
// collectives run in the same order everywhere):
//   1. copy my window of the input into my inputs[s % 2], publish arrived = s;
//   2. small windows (<= kEveryoneReducesBytes): wait for every rank's arrived, then reduce
//      all n inputs into my output, in rank order (every rank computes the same bits): one
//      synchronisation, nothing else;
//   3. otherwise: wait for every rank's arrived, reduce my 1/n slice of all n inputs in one
//      vectorised pass (kernels::reduce) into my results[s % 2], publish reduced = s, wait
//      for every rank's reduced, copy the n slices into my output.
// Why two windows suffice without a "done reading" flag: a rank writes inputs[s % 2] again
// at op s + 2, after it saw every rank's arrived for s + 1, which each rank publishes only
// once it finished op s (its reads of everyone's window s included); results likewise.
//
// Waiting: spin on the flag for a few microseconds (a peer on another core publishes within
// that), then sleep on it with a futex (FUTEX_WAIT on the shared page; the publisher wakes
// sleepers when the owner's `waiters` says there are any), waking every millisecond to check
// the deadline and that the peer's process still exists: a peer that died fails the op with
// a peer error naming it, within a millisecond of its death being visible, never a hang. A
// rank whose communicator broke sets its `aborted` flag and wakes its sleepers: they fail
// at once rather than at their deadline.
// With more ranks than cores, the peer may need this very core to get there: waiters yield
// instead of spinning, as long as yielding pays (ShareCoresWait; each flag carries the time
// it was published, so a waiter knows how late it saw it).
//
// Threads: one op at a time (the communicator's worker); the arena itself is not shared
// between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "kernels/types.h"
#include "transport/device.h"
#include "transport/shm/segment.h"

namespace meridian::collectives {

// How a waiter that shares its core with more threads than there are cores waits: by yielding
// while yielding pays (the threads it yields to are peers that publish and yield back within
// microseconds), by sleeping on the futex at once when yielding waits keep seeing the flag
// late (a yield handed the core to a thread that kept it for a time slice). While sleeping
// is the rule, every kProbeEvery-th wait yields again to look.
class ShareCoresWait {
 public:
  static constexpr std::uint64_t kLateNs = 50'000;
  static constexpr double kWeight = 1.0 / 32;  // a moving share over about 32 waits
  static constexpr double kShareToSleep = 0.05;
  static constexpr std::uint32_t kProbeEvery = 64;

  // Called once before each wait: true to sleep at once, false to yield first.
  bool sleepFirst() {
    return lateShare_ > kShareToSleep && ++waitsSinceProbe_ % kProbeEvery != 0;
  }
  // A yielding wait saw the flag `sinceNs` after its publisher stamped it.
  void saw(std::uint64_t sinceNs) { lateShare_ += ((sinceNs > kLateNs ? 1.0 : 0.0) - lateShare_) * kWeight; }
  double lateShare() const { return lateShare_; }

 private:
  double lateShare_ = 0;
  std::uint32_t waitsSinceProbe_ = 0;
};

class HostArena {
 public:
  static constexpr std::size_t kWindowBytes = std::size_t{1} << 20;
  static constexpr std::size_t kEveryoneReducesBytes = 16 * 1024;
  static constexpr int kMaxRanks = 64;
  // A segment's bytes: the header page, two input and two result windows.
  static constexpr std::size_t kSegmentBytes = transport::shm::kSegmentHeaderBytes + 4 * kWindowBytes;

  // Every rank of `exchange`'s group calls it at the same point. When all of them share
  // this host (the same boot, user and namespaces), have segments and mapped everyone's,
  // returns the arena, the same decision on every rank; otherwise nullptr, with the reason
  // in *why (each rank's own view; a malformed offer from a peer is one such reason). Errors
  // only for a failed exchange (the deadline). `secret` and `sessionId` name the segments.
  static Result<std::unique_ptr<HostArena>> join(transport::GroupExchange& exchange, std::string_view secret,
                                                 std::uint64_t sessionId, TimePoint deadline, std::string* why);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(segments_.size()); }

  // recv[i] = op over ranks of send[i] (send == recv: in place). `op` is a reduction the
  // kernels apply element-wise (kAvg reduces as a sum; the caller divides). A peer that
  // died or missed the deadline: kPeerError or kTimeout naming it; the arena is then
  // unusable (broken()) because ranks may be at different ops.
  Status allreduce(const void* send, void* recv, std::size_t count, kernels::DataType dtype, kernels::ReduceOp op,
                   TimePoint deadline);
  // Returns once every rank called it.
  Status barrier(TimePoint deadline);
  const Status& broken() const { return broken_; }
  // This rank leaves: peers waiting on it (now or later) fail at once with a peer error
  // instead of waiting for their deadline, and so does this rank's own op in progress.
  // Any thread may call it (the communicator does when it breaks).
  void abort();

 private:
  HostArena() = default;
  struct Flags;
  Flags& flags(int r) const;
  std::uint8_t* input(int r, std::uint32_t op) const;
  std::uint8_t* result(int r, std::uint32_t op) const;
  static std::uint64_t& stampOf(Flags& f, std::uint32_t Flags::*which);
  void publish(std::uint32_t Flags::*which, std::uint32_t value);
  Status waitAll(std::uint32_t Flags::*which, std::uint32_t value, TimePoint deadline, const char* what);
  Status waitOne(int peer, std::uint32_t Flags::*which, std::uint32_t value, TimePoint deadline, const char* what);
  Status fail(Status st);

  int rank_ = 0;
  std::vector<transport::shm::ShmSegment> segments_;  // [rank_] is this rank's own
  std::uint32_t op_ = 0;              // the number of the last op (window) run
  bool shareCores_ = false;           // more ranks than cores: waiters yield, not spin
  ShareCoresWait shareCoresWait_;
  bool sleepFirstShown_ = false;  // what meridian_collectives_shm_sleep_first says for this rank
  Status broken_;
};

}  // namespace meridian::collectives
