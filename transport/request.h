// Request: the completion handle of one isend or irecv. Completed exactly once by the
// transport's progress thread; waited on or tested by any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "core/clock.h"
#include "core/status.h"

namespace meridian::transport {

class Request {
 public:
  // True once the operation finished (successfully or not). Never blocks.
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Blocks until done or until `deadline`; returns the operation's status, or kTimeout
  // when the deadline passed first (the operation keeps running; wait again later).
  Status wait(TimePoint deadline);
  Status wait() { return wait(TimePoint::max()); }
  // Valid once done(): the final status and the bytes moved (for a receive, the size of
  // the message that arrived, which may be smaller than the buffer).
  const Status& status() const { return status_; }
  std::size_t bytes() const { return bytes_; }

  // Transport side: completes the request once; later calls are ignored.
  void complete(Status status, std::size_t bytes);

 private:
  std::atomic<bool> done_{false};
  Status status_;
  std::size_t bytes_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool waiting_ = false;
};

using RequestPtr = std::shared_ptr<Request>;

// Waits for every request, returning the first non-ok status (all are waited for anyway,
// so no buffer is still in use when this returns, unless the deadline passed).
Status waitAll(std::initializer_list<const RequestPtr*> requests, TimePoint deadline);

}  // namespace meridian::transport
