// PendingConnections: caps and deadlines of unauthenticated connections.
#include "transport/tcp/pending.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

namespace meridian::transport::tcp {

PendingConnections::Admitted PendingConnections::admit(int fd, std::uint32_t source, TimePoint now) {
  Admitted out;
  if (fromSource(source) >= std::max<std::size_t>(limits_.perSource, 1)) {
    auto oldest = std::find_if(order_.begin(), order_.end(), [&](const Entry& e) { return e.source == source; });
    out.evictedFd = oldest->fd;
    out.why = Eviction::kSourceFull;
    erase(oldest);
  } else if (order_.size() >= std::max<std::size_t>(limits_.perListener, 1)) {
    out.evictedFd = order_.front().fd;
    out.why = Eviction::kListenerFull;
    erase(order_.begin());
  }
  remove(fd);  // a number reused without remove(): count it once
  out.deadline = now + limits_.handshakeTimeout;
  order_.push_back(Entry{fd, source, out.deadline});
  byFd_[fd] = std::prev(order_.end());
  ++perSource_[source];
  return out;
}

void PendingConnections::erase(std::list<Entry>::iterator it) {
  auto count = perSource_.find(it->source);
  if (count != perSource_.end() && --count->second == 0) perSource_.erase(count);
  byFd_.erase(it->fd);
  order_.erase(it);
}

void PendingConnections::remove(int fd) {
  if (auto it = byFd_.find(fd); it != byFd_.end()) erase(it->second);
}

std::vector<int> PendingConnections::expire(TimePoint now) {
  std::vector<int> out;
  while (!order_.empty() && order_.front().deadline <= now) {
    out.push_back(order_.front().fd);
    erase(order_.begin());
  }
  return out;
}

TimePoint PendingConnections::nextDeadline() const {
  return order_.empty() ? TimePoint::max() : order_.front().deadline;
}

std::size_t PendingConnections::fromSource(std::uint32_t source) const {
  auto it = perSource_.find(source);
  return it == perSource_.end() ? 0 : it->second;
}

const char* toString(PendingConnections::Eviction why) {
  switch (why) {
    case PendingConnections::Eviction::kNone: return "none";
    case PendingConnections::Eviction::kSourceFull: return "too many pending handshakes from that address";
    case PendingConnections::Eviction::kListenerFull: return "too many pending handshakes on this listener";
  }
  return "?";
}

std::uint32_t peerIpv4(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) return 0;
  return ntohl(a.sin_addr.s_addr);
}

}  // namespace meridian::transport::tcp
