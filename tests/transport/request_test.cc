// Request::whenDone: the completion callback a control loop sleeps on.
#include "transport/request.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace meridian::transport {
namespace {

TEST(RequestTest, WhenDoneRunsOnceOnTheCompletingThreadAfterTheResultIsSet) {
  auto req = std::make_shared<Request>();
  std::atomic<int> calls{0};
  std::thread::id ranOn;
  std::size_t bytesSeen = 0;
  req->whenDone([&] {
    ++calls;
    ranOn = std::this_thread::get_id();
    bytesSeen = req->bytes();  // the result is in place when the callback runs
  });
  EXPECT_EQ(calls.load(), 0) << "not done yet";
  std::thread completer([&] {
    req->complete(Status::ok(), 42);
    req->complete(peerError("late"), 7);  // ignored, and no second call
  });
  const std::thread::id completerId = completer.get_id();
  completer.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(ranOn, completerId);
  EXPECT_EQ(bytesSeen, 42u);
  EXPECT_TRUE(req->status().isOk());
}

TEST(RequestTest, WhenDoneOnAFinishedRequestRunsAtOnceAndALaterOneReplacesAnEarlier) {
  auto done = std::make_shared<Request>();
  done->complete(peerError("channel ended"), 0);
  int calls = 0;
  done->whenDone([&] { ++calls; });
  EXPECT_EQ(calls, 1);

  auto pending = std::make_shared<Request>();
  int first = 0, second = 0;
  pending->whenDone([&] { ++first; });
  pending->whenDone([&] { ++second; });
  pending->complete(Status::ok(), 0);
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
}

TEST(RequestTest, AWaiterAndACallbackBothSeeTheCompletion) {
  auto req = std::make_shared<Request>();
  std::atomic<bool> called{false};
  req->whenDone([&] { called = true; });
  std::thread completer([&] { req->complete(Status::ok(), 1); });
  EXPECT_TRUE(req->wait().isOk());
  completer.join();
  EXPECT_TRUE(called.load());
}

}  // namespace
}  // namespace meridian::transport
