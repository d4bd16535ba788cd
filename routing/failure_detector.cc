#include "routing/failure_detector.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/check.h"

namespace meridian::routing {

FailureDetector::FailureDetector(int self, int worldSize, std::chrono::milliseconds timeout, TimePoint start)
    : self_(self), timeout_(timeout), peers_(static_cast<std::size_t>(std::max(worldSize, 0))) {
  MERIDIAN_CHECK_MSG(self >= 0 && self < worldSize, "rank {} of {}", self, worldSize);
  MERIDIAN_CHECK_MSG(timeout.count() > 0, "peer timeout {} ms", timeout.count());
  for (Peer& p : peers_) p.lastHeard = start;
}

void FailureDetector::heard(int peer, TimePoint at) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == self_) return;
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  p.lastHeard = std::max(p.lastHeard, at);
}

void FailureDetector::failed(int peer, std::string why) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == self_) return;
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (!p.failure) p.failure = std::move(why);
}

void FailureDetector::left(int peer) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == self_) return;
  peers_[static_cast<std::size_t>(peer)].gone = true;
}

std::vector<FailureDetector::Lost> FailureDetector::tick(TimePoint now) {
  std::vector<Lost> out;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    if (p.gone || static_cast<int>(i) == self_) continue;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.lastHeard);
    if (p.failure) {
      p.lost = p.gone = true;
      out.push_back({static_cast<int>(i), fmt::format("its channel failed: {}", *p.failure)});
    } else if (silent >= timeout_) {
      p.lost = p.gone = true;
      out.push_back({static_cast<int>(i), fmt::format("nothing heard from it for {:.1f} s (MERIDIAN_PEER_TIMEOUT_MS={})",
                                                      static_cast<double>(silent.count()) / 1e3, timeout_.count())});
    }
  }
  return out;
}

int FailureDetector::lostCount() const {
  return static_cast<int>(std::count_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.lost; }));
}

}  // namespace meridian::routing
