// Threads at the nice value a process had when this was made (the trainer's compute thread
// runs at a lower priority, and a thread inherits its creator's).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace meridian::trainer {

// Makes threads at the nice value the run started with. The compute thread runs at a lower
// priority (the trainer's lowerComputePriority); a new thread inherits its creator's, and so
// do the threads of a communicator built on it. One thread, started with the run (before
// the compute thread's priority drops), makes them on request and does nothing else.
class ThreadMaker {
 public:
  ThreadMaker() : maker_([this] { loop(); }) {}
  ~ThreadMaker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    maker_.join();
  }
  ThreadMaker(const ThreadMaker&) = delete;
  ThreadMaker& operator=(const ThreadMaker&) = delete;
  // A thread running `fn` (one caller at a time: the compute thread).
  std::thread make(std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mu_);
    request_ = std::move(fn);
    cv_.notify_all();
    cv_.wait(lock, [&] { return made_.joinable(); });
    return std::move(made_);
  }
  // Runs `fn` on such a thread and waits for it.
  void run(std::function<void()> fn) { make(std::move(fn)).join(); }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || request_ != nullptr; });
      if (stop_) return;
      made_ = std::thread(std::move(request_));
      request_ = nullptr;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> request_;  // guarded by mu_
  std::thread made_;               // guarded by mu_
  bool stop_ = false;              // guarded by mu_
  std::thread maker_;              // last: starts once the rest is ready
};

}  // namespace meridian::trainer
