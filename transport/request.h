// Request: the completion handle of one isend or irecv. Completed exactly once by the
// transport's progress thread; waited on or tested by any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>

#include "core/clock.h"
#include "core/status.h"

namespace meridian::transport {

// Lets a waiting thread drive its transport's progress itself instead of sleeping until
// the progress thread has done it (saves thread hand-offs on small messages).
class Progressor {
 public:
  virtual ~Progressor() = default;
  // One non-blocking round of progress, unless another thread is making progress right
  // now; true when it found work (events, commands). `*ran` (when given) says whether the
  // round ran at all.
  virtual bool pollOnce(bool* ran = nullptr) = 0;
  // A thread starts or stops polling (the progress thread stands aside meanwhile, so the
  // two do not wake each other for the same events).
  virtual void beginPolling() {}
  // `handOver`: the caller is about to sleep, so the progress thread must take over now
  // (otherwise it looks in on its own within a couple of milliseconds).
  virtual void endPolling(bool handOver) { (void)handOver; }
};

class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<Progressor> progressor) : progressor_(std::move(progressor)) {}

  // True once the operation finished (successfully or not). Never blocks.
  bool done() const { return done_.load(std::memory_order_acquire); }
  // done(), after one non-blocking round of the transport's progress from this thread when
  // not yet (for callers that poll, such as NCCL's proxy thread through the net plugin).
  bool test();
  // Blocks until done or until `deadline`; returns the operation's status, or kTimeout
  // when the deadline passed first (the operation keeps running; wait again later).
  // While the transport has work it polls it from this thread; once it goes quiet for
  // kIdleSpin it sleeps and leaves progress to the transport's own thread.
  Status wait(TimePoint deadline);
  Status wait() { return wait(TimePoint::max()); }
  static constexpr std::chrono::microseconds kIdleSpin{1000};
  // Valid once done(): the final status and the bytes moved (for a receive, the size of
  // the message that arrived, which may be smaller than the buffer).
  const Status& status() const { return status_; }
  std::size_t bytes() const { return bytes_; }

  // Calls `fn` once the request is done: at once, on this thread, when it is already;
  // otherwise on the thread that completes it (a transport's progress thread, which may hold
  // the transport's locks: `fn` only notes the news and wakes whoever acts on it). One per
  // request; a later call replaces an earlier one not yet called.
  void whenDone(std::function<void()> fn);

  // Transport side: completes the request once; later calls are ignored.
  void complete(Status status, std::size_t bytes);

 private:
  std::atomic<bool> done_{false};
  Status status_;
  std::size_t bytes_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool waiting_ = false;
  std::function<void()> whenDone_;  // guarded by mu_
  std::shared_ptr<Progressor> progressor_;
};

using RequestPtr = std::shared_ptr<Request>;

// How waiting threads spin in this process. `shareCores`: more ranks run on this host than it
// has cores, so a thread that polls its transport yields the core between rounds (other
// ranks need it) instead of spinning on it. Set once at set-up by whoever knows how ranks
// were placed (the communicator, the NCCL plugin); false until then.
void setWaitersShareCores(bool shareCores);

// Waits for every request, returning the first non-ok status (all are waited for anyway,
// so no buffer is still in use when this returns, unless the deadline passed).
Status waitAll(std::initializer_list<const RequestPtr*> requests, TimePoint deadline);

}  // namespace meridian::transport
