#include "transport/tcp/splice.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/status.h"

namespace meridian::transport::tcp {

Splice::Splice(UniqueFd a, UniqueFd b, std::size_t bufferBytes) : a_(std::move(a)), b_(std::move(b)) {
  for (Direction* d : {&ab_, &ba_}) {
    d->buf = std::make_unique_for_overwrite<std::uint8_t[]>(bufferBytes);
    d->cap = bufferBytes;
  }
  ab_.from = a_.get();
  ab_.to = b_.get();
  ba_.from = b_.get();
  ba_.to = a_.get();
}

std::uint32_t Splice::interest(const Direction& readFromMe, const Direction& writeToMe) {
  std::uint32_t ev = 0;
  if (!readFromMe.eof && readFromMe.tail < readFromMe.cap) ev |= EPOLLIN;
  if (writeToMe.head < writeToMe.tail) ev |= EPOLLOUT;
  return ev;
}

std::uint32_t Splice::interestB() const { return connecting_ ? std::uint32_t{EPOLLOUT} : interest(ba_, ab_); }

bool Splice::move(Direction& d, std::size_t budget) {
  std::size_t done = 0;
  while (done < budget) {
    bool progressed = false;
    if (!d.eof && d.tail < d.cap) {
      ssize_t n = ::recv(d.from, d.buf.get() + d.tail, d.cap - d.tail, 0);
      if (n > 0) {
        d.tail += static_cast<std::size_t>(n);
        progressed = true;
      } else if (n == 0) {
        d.eof = true;
        progressed = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        error_ = fmt::format("receive: {}", errnoText(errno));
        return false;
      }
    }
    if (d.head < d.tail) {
      ssize_t n = ::send(d.to, d.buf.get() + d.head, d.tail - d.head, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        d.head += static_cast<std::size_t>(n);
        d.moved += static_cast<std::uint64_t>(n);
        done += static_cast<std::size_t>(n);
        progressed = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        error_ = fmt::format("send: {}", errnoText(errno));
        return false;
      }
    }
    if (d.head == d.tail) d.head = d.tail = 0;
    if (d.eof && d.head == d.tail && !d.shutDown) {
      if (::shutdown(d.to, SHUT_WR) != 0 && errno != ENOTCONN) {
        error_ = fmt::format("shutdown: {}", errnoText(errno));
        return false;
      }
      d.shutDown = true;
    }
    if (!progressed) break;
  }
  return true;
}

Splice::State Splice::pump(std::size_t budgetBytes) {
  if (!error_.empty()) return State::kFailed;
  if (connecting_) {
    pollfd p{b_.get(), POLLOUT, 0};
    if (::poll(&p, 1, 0) != 1) return State::kRunning;
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(b_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      error_ = fmt::format("connect: {}", errnoText(err));
      return State::kFailed;
    }
    connecting_ = false;
  }
  if (!move(ab_, budgetBytes) || !move(ba_, budgetBytes)) return State::kFailed;
  return ab_.shutDown && ba_.shutDown ? State::kDone : State::kRunning;
}

}  // namespace meridian::transport::tcp
