#include "lab/link_model.h"

#include <algorithm>
#include <cmath>

namespace meridian::lab {

LinkParams scaled(const LinkParams& world, double timeScale) {
  LinkParams p = world;
  p.delayUs *= timeScale;
  p.jitterUs *= timeScale;
  return p;
}

LinkModel::LinkModel(const LinkParams& effective, std::uint64_t seed) : p_(effective), rng_(seed) {}

void LinkModel::configure(const LinkParams& effective, std::int64_t nowNs) {
  const std::uint64_t backlog = backlogBytes(nowNs);
  p_ = effective;
  if (backlog > 0 && p_.rateBitsPerSec > 0) {
    busyUntilNs_ = nowNs + static_cast<std::int64_t>(static_cast<double>(backlog) * 8e9 / p_.rateBitsPerSec);
  } else if (p_.rateBitsPerSec <= 0) {
    busyUntilNs_ = 0;  // unlimited: nothing waits for the limiter
  }
}

std::uint64_t LinkModel::backlogBytes(std::int64_t nowNs) const {
  if (p_.rateBitsPerSec <= 0 || busyUntilNs_ <= nowNs) return 0;
  double seconds = static_cast<double>(busyUntilNs_ - nowNs) * 1e-9;
  return static_cast<std::uint64_t>(seconds * p_.rateBitsPerSec / 8.0);
}

std::optional<std::int64_t> LinkModel::admit(std::int64_t nowNs, std::size_t bytes) {
  if (p_.cut) {
    ++c_.lossDrops;
    return std::nullopt;
  }
  if (p_.loss > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p_.loss) {
    ++c_.lossDrops;
    return std::nullopt;
  }
  std::int64_t sentNs = nowNs;
  if (p_.rateBitsPerSec > 0) {
    const std::uint64_t backlog = backlogBytes(nowNs);
    const std::uint64_t limit = p_.queueBytes > 0 ? p_.queueBytes : defaultQueueBytes(p_.rateBitsPerSec);
    // An idle link always takes one packet, however small the queue.
    if (backlog > 0 && backlog + bytes > limit) {
      ++c_.queueDrops;
      return std::nullopt;
    }
    c_.maxBacklogBytes = std::max<std::uint64_t>(c_.maxBacklogBytes, backlog + bytes);
    const auto txNs = static_cast<std::int64_t>(static_cast<double>(bytes) * 8.0 * 1e9 / p_.rateBitsPerSec);
    busyUntilNs_ = std::max(busyUntilNs_, nowNs) + txNs;
    sentNs = busyUntilNs_;
  }
  double delayUs = p_.delayUs;
  if (p_.jitterUs > 0) {
    // Normal jitter, clipped to +-3 sigma and at zero; order is kept below, as on a real
    // path where jitter comes from queues rather than from packets overtaking each other.
    double j = std::normal_distribution<double>(0.0, p_.jitterUs)(rng_);
    delayUs = std::max(0.0, delayUs + std::clamp(j, -3 * p_.jitterUs, 3 * p_.jitterUs));
  }
  std::int64_t deliverNs = sentNs + static_cast<std::int64_t>(delayUs * 1e3);
  deliverNs = std::max(deliverNs, lastDeliveryNs_);
  lastDeliveryNs_ = deliverNs;
  ++c_.packets;
  c_.bytes += bytes;
  return deliverNs;
}

}  // namespace meridian::lab
