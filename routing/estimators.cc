// Path figures from probe echoes.
#include "routing/estimators.h"

#include <algorithm>
#include <cmath>

namespace meridian::routing {

double PathFigures::queueingUs() const { return std::max(0.0, srttUs - minRttUs); }

PathEstimator::PathEstimator(std::int64_t minRttWindowUs, std::size_t lossWindow)
    : minRttWindowUs_(std::max<std::int64_t>(minRttWindowUs, 0)),
      // A zero window would make loss undefined; one probe is the least that means anything.
      outcomes_(std::max<std::size_t>(lossWindow, 1), 0) {}

void PathEstimator::recordOutcome(bool lost) {
  if (outcomeCount_ == outcomes_.size()) {
    lostInWindow_ -= outcomes_[outcomeNext_];
  } else {
    ++outcomeCount_;
  }
  outcomes_[outcomeNext_] = lost ? 1 : 0;
  lostInWindow_ += lost ? 1 : 0;
  outcomeNext_ = (outcomeNext_ + 1) % outcomes_.size();
  lostInARow_ = lost ? lostInARow_ + 1 : 0;
  echoedInARow_ = lost ? 0 : echoedInARow_ + 1;
}

void PathEstimator::popResolvedFront() {
  while (!outstanding_.empty() && outstanding_.front().echoed) outstanding_.pop_front();
}

void PathEstimator::onProbeSent(std::uint64_t seq, std::int64_t nowUs) {
  if (anySent_ && seq <= lastSeq_) return;
  anySent_ = true;
  lastSeq_ = seq;
  ++sent_;
  if (outstanding_.size() == kMaxOutstanding) {
    // The front is never an answered probe (those are popped eagerly), so this drops the
    // oldest outstanding one.
    recordOutcome(true);
    outstanding_.pop_front();
    popResolvedFront();
  }
  outstanding_.push_back(Probe{seq, nowUs, false});
}

bool PathEstimator::onEcho(std::uint64_t seq, std::int64_t nowUs) {
  auto it = std::lower_bound(outstanding_.begin(), outstanding_.end(), seq,
                             [](const Probe& p, std::uint64_t s) { return p.seq < s; });
  if (it == outstanding_.end() || it->seq != seq || it->echoed) return false;
  it->echoed = true;
  // A clock that stepped back would give a negative RTT; zero is the nearest truth.
  double rtt = static_cast<double>(std::max<std::int64_t>(nowUs - it->sentUs, 0));
  popResolvedFront();

  ++received_;
  recordOutcome(false);

  if (!haveRtt_) {
    srttUs_ = rtt;
    rttvarUs_ = rtt / 2;
    jitterUs_ = 0;
    haveRtt_ = true;
  } else {
    // RFC 6298 2.3: rttvar first, from the old srtt.
    rttvarUs_ = 0.75 * rttvarUs_ + 0.25 * std::abs(srttUs_ - rtt);
    srttUs_ = 0.875 * srttUs_ + 0.125 * rtt;
    jitterUs_ += (std::abs(rtt - lastRttUs_) - jitterUs_) / 16;
  }
  lastRttUs_ = rtt;

  // Monotonic deque: a new sample makes every older, larger one useless as a future minimum.
  while (!minRtt_.empty() && minRtt_.back().rttUs >= rtt) minRtt_.pop_back();
  minRtt_.push_back(RttSample{nowUs, rtt});
  // Keep the latest sample even when it is itself outside the window: figures() falls back to it.
  while (minRtt_.size() > 1 &&
         (minRtt_.front().atUs < nowUs - minRttWindowUs_ || minRtt_.size() > kMaxMinRttSamples)) {
    minRtt_.pop_front();
  }
  return true;
}

void PathEstimator::expire(std::int64_t nowUs, std::int64_t timeoutUs) {
  // Send times are in deque order, so the expired probes are a prefix.
  while (!outstanding_.empty() && nowUs - outstanding_.front().sentUs > timeoutUs) {
    recordOutcome(true);
    outstanding_.pop_front();
    popResolvedFront();
  }
}

PathFigures PathEstimator::figures(std::int64_t nowUs) const {
  PathFigures f;
  f.sent = sent_;
  f.received = received_;
  f.lostInARow = lostInARow_;
  f.echoedInARow = echoedInARow_;
  f.loss = outcomeCount_ == 0 ? 0.0 : static_cast<double>(lostInWindow_) / static_cast<double>(outcomeCount_);
  if (!haveRtt_) return f;
  f.valid = true;
  f.srttUs = srttUs_;
  f.rttvarUs = rttvarUs_;
  f.lastRttUs = lastRttUs_;
  f.jitterUs = jitterUs_;
  // The first sample still inside the window is the window's minimum (the deque is sorted);
  // onEcho already dropped most stale ones, this skips those that aged since. The back is the
  // latest echo, the stand-in when the whole window is empty.
  auto it = std::find_if(minRtt_.begin(), minRtt_.end(),
                         [&](const RttSample& s) { return s.atUs >= nowUs - minRttWindowUs_; });
  f.minRttUs = it == minRtt_.end() ? minRtt_.back().rttUs : it->rttUs;
  return f;
}

}  // namespace meridian::routing
