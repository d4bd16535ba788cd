// Work: completion of a communicator op, optionally followed by transport requests it
// left in flight (point-to-point ops complete when their request does).
#include "collectives/work.h"

#include <utility>

namespace meridian::collectives {

bool Work::done() const {
  if (!bodyDone_.load(std::memory_order_acquire)) return false;
  for (const auto& r : requests_) {
    if (!r->done()) return false;
  }
  return true;
}

void Work::deferUntil(std::vector<transport::RequestPtr> requests) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_ = std::move(requests);
}

void Work::complete(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bodyDone_.load(std::memory_order_relaxed)) return;
    status_ = std::move(status);
    bodyDone_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

Status Work::requestsStatus(TimePoint deadline) {
  Status first;
  for (const auto& r : requests_) {
    Status st = r->wait(deadline);
    if (st.code() == StatusCode::kTimeout && !r->done()) return st;
    if (!st.isOk() && first.isOk()) first = std::move(st);
  }
  return first;
}

Status Work::wait(TimePoint deadline) {
  Status body;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto finished = [&] { return bodyDone_.load(std::memory_order_relaxed); };
    if (deadline == TimePoint::max()) {
      cv_.wait(lock, finished);
    } else if (!cv_.wait_until(lock, deadline, finished)) {
      return timeoutError("op {} still running at the wait deadline", sequence_);
    }
    body = status_;
  }
  if (!body.isOk() || requests_.empty()) return body;
  return requestsStatus(deadline);
}

}  // namespace meridian::collectives
