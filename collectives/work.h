// Work: the completion handle of one asynchronous collective or point-to-point op.
// Completed once by the communicator (its worker thread, or the caller's thread for an
// op run inline); waited on or tested by any thread, any number of times.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "transport/request.h"

namespace meridian::collectives {

class Work {
 public:
  explicit Work(std::uint64_t sequence) : sequence_(sequence) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // The op's sequence number within its communicator (issue order, from 0).
  std::uint64_t sequence() const { return sequence_; }

  // True once the op finished, successfully or not. Never blocks.
  bool done() const;
  // Blocks until the op finished or `deadline` passed; returns the op's status, or
  // kTimeout when the deadline passed first (the op keeps running; wait again later).
  // The op's buffers may be reused once this returned anything but kTimeout.
  Status wait(TimePoint deadline);
  Status wait() { return wait(TimePoint::max()); }

  // Communicator side: finishes the op's body with `status`. When the body left
  // transport requests in flight (point-to-point ops), they are attached first with
  // `deferUntil`, and the op is done once they all are.
  void deferUntil(std::vector<transport::RequestPtr> requests);
  void complete(Status status);

 private:
  Status requestsStatus(TimePoint deadline);

  const std::uint64_t sequence_;
  std::atomic<bool> bodyDone_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status status_;                                 // guarded by mu_; final once bodyDone_
  std::vector<transport::RequestPtr> requests_;   // set before bodyDone_, then read-only
};

}  // namespace meridian::collectives
