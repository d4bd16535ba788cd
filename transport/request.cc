// Request completion and waiting.
#include "transport/request.h"

#include <algorithm>
#include <thread>


namespace meridian::transport {

namespace {

std::atomic<bool> waitersShareCores{false};

void cpuRelax() {
  for (int i = 0; i < 64; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

}  // namespace

void setWaitersShareCores(bool shareCores) { waitersShareCores.store(shareCores, std::memory_order_relaxed); }

bool Request::test() {
  if (done()) return true;
  if (progressor_) progressor_->pollOnce();
  return done();
}

void Request::whenDone(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      whenDone_ = std::move(fn);
      return;
    }
  }
  if (fn) fn();
}

void Request::complete(Status status, std::size_t bytes) {
  std::function<void()> then;
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    status_ = std::move(status);
    bytes_ = bytes;
    done_.store(true, std::memory_order_release);
    if (waiting_) cv_.notify_all();
    then.swap(whenDone_);
  }
  if (then) then();
}

Status Request::wait(TimePoint deadline) {
  if (progressor_) {
    // Drive the transport from here while it has work; completions microseconds away
    // then cost no sleep and no wake-up.
    TimePoint lastWork = Clock::now();
    progressor_->beginPolling();
    struct End {
      Progressor* p;
      const Request* r;
      ~End() { p->endPolling(!r->done()); }
    } end{progressor_.get(), this};
    while (!done()) {
      bool worked = progressor_->pollOnce();
      if (done()) break;
      TimePoint now = Clock::now();
      if (now >= deadline) return timeoutError("request not complete at its deadline");
      if (worked) {
        lastWork = now;
      } else if (now - lastWork > kIdleSpin) {
        break;
      } else if (waitersShareCores.load(std::memory_order_relaxed) ||
                 now - lastWork > std::chrono::microseconds(20)) {
        std::this_thread::yield();  // let other ranks sharing this core run
      } else {
        cpuRelax();
      }
    }
  } else {
    for (int i = 0; i < 200 && !done(); ++i) std::this_thread::yield();
  }
  if (!done()) {
    std::unique_lock lock(mu_);
    waiting_ = true;
    if (deadline == TimePoint::max()) {
      cv_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
    } else if (!cv_.wait_until(lock, deadline, [&] { return done_.load(std::memory_order_relaxed); })) {
      return timeoutError("request not complete at its deadline");
    }
  }
  return status_;
}

Status waitAll(std::initializer_list<const RequestPtr*> requests, TimePoint deadline) {
  Status first;
  for (const RequestPtr* r : requests) {
    if (r == nullptr || !*r) continue;
    Status st = (*r)->wait(deadline);
    if (first.isOk() && !st.isOk()) first = st;
  }
  return first;
}

}  // namespace meridian::transport
