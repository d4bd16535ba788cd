// Socket helpers for set-up paths.
#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace meridian::transport::tcp {

namespace {

Result<sockaddr_in> resolve(const std::string& host, std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (host.empty() || host == "*" || host == "0.0.0.0") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    return addr;
  }
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalidArgument("cannot resolve host '{}': {}", host, gai_strerror(rc));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

std::string formatAddr(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return fmt::format("{}:{}", buf, ntohs(a.sin_port));
}

int remainingMs(TimePoint deadline) {
  if (deadline == TimePoint::max()) return -1;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1 << 30));
}

}  // namespace

Status setNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return internalError("fcntl(F_GETFL): {}", errnoText(errno));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) < 0) return internalError("fcntl(F_SETFL): {}", errnoText(errno));
  return Status::ok();
}

bool setNotsentLowat(int fd, int bytes) {
  return setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof(bytes)) == 0;
}

Status setIntOption(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return internalError("setsockopt({}, {}): {}", what, value, errnoText(errno));
  }
  return Status::ok();
}

Status tuneDataSocket(int fd, int bufferBytes) {
  MERIDIAN_RETURN_IF_ERROR(setIntOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
  if (bufferBytes > 0) {
    MERIDIAN_RETURN_IF_ERROR(setIntOption(fd, SOL_SOCKET, SO_SNDBUF, bufferBytes, "SO_SNDBUF"));
    MERIDIAN_RETURN_IF_ERROR(setIntOption(fd, SOL_SOCKET, SO_RCVBUF, bufferBytes, "SO_RCVBUF"));
  }
  return Status::ok();
}

Result<UniqueFd> listenOn(const std::string& ip, std::uint16_t port, bool nonBlocking, int backlog) {
  auto addr = resolve(ip, port);
  if (!addr) return addr.status();
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonBlocking ? SOCK_NONBLOCK : 0), 0));
  if (!fd.valid()) return internalError("socket(): {}", errnoText(errno));
  MERIDIAN_RETURN_IF_ERROR(setIntOption(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  // Linux passes it on to every accepted socket: answers leave as they are written, never
  // held for the acknowledgement of the last one (a client that pipelines two requests would
  // wait for its delayed ACK, ~40 ms, on the second answer).
  MERIDIAN_RETURN_IF_ERROR(setIntOption(fd.get(), IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.value()), sizeof(sockaddr_in)) != 0) {
    return invalidArgument("cannot bind {}:{}: {}", ip, port, errnoText(errno));
  }
  if (::listen(fd.get(), backlog) != 0) return internalError("listen({}:{}): {}", ip, port, errnoText(errno));
  return fd;
}

namespace {
// A non-blocking TCP socket, bound to `localIp` when given.
Result<UniqueFd> socketBoundTo(const std::string& localIp) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return internalError("socket(): {}", errnoText(errno));
  if (!localIp.empty()) {
    auto local = resolve(localIp, 0);
    if (!local) return local.status();
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&local.value()), sizeof(sockaddr_in)) != 0) {
      return invalidArgument("cannot bind local address {}: {}", localIp, errnoText(errno));
    }
  }
  return fd;
}
}  // namespace

Result<UniqueFd> startConnect(const HostPort& remote, const std::string& localIp) {
  auto addr = resolve(remote.host, remote.port);
  if (!addr) return addr.status();
  MERIDIAN_ASSIGN_OR_RETURN(UniqueFd fd, socketBoundTo(localIp));
  MERIDIAN_RETURN_IF_ERROR(setIntOption(fd.get(), IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.value()), sizeof(sockaddr_in)) != 0 &&
      errno != EINPROGRESS) {
    return peerError("connect to {}: {}", remote.toString(), errnoText(errno));
  }
  return fd;
}

Result<UniqueFd> connectTo(const HostPort& remote, const std::string& localIp, TimePoint deadline) {
  auto addr = resolve(remote.host, remote.port);
  if (!addr) return addr.status();
  std::string lastError = "deadline passed before the first attempt";
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    MERIDIAN_ASSIGN_OR_RETURN(UniqueFd fd, socketBoundTo(localIp));
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.value()), sizeof(sockaddr_in));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int prc = ::poll(&p, 1, remainingMs(deadline));
      if (prc == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      MERIDIAN_RETURN_IF_ERROR(setNonBlocking(fd.get(), false));
      MERIDIAN_RETURN_IF_ERROR(setIntOption(fd.get(), IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY"));
      return fd;
    }
    lastError = errnoText(errno);
    bool retryable = errno == ECONNREFUSED || errno == ETIMEDOUT || errno == EAGAIN || errno == ECONNRESET ||
                     errno == EHOSTUNREACH || errno == ENETUNREACH;
    if (!retryable) return peerError("connect to {}: {}", remote.toString(), lastError);
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return timeoutError("connect to {}: {} (gave up at the deadline)", remote.toString(), lastError);
}

std::string localAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  return formatAddr(a);
}

std::string peerAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  return formatAddr(a);
}

namespace {
template <typename Op>
Status transferAll(int fd, std::size_t bytes, TimePoint deadline, short events, const char* what, Op op) {
  std::size_t done = 0;
  while (done < bytes) {
    pollfd p{fd, events, 0};
    int prc = ::poll(&p, 1, remainingMs(deadline));
    if (prc == 0) return timeoutError("{}: timed out after {} of {} bytes", what, done, bytes);
    if (prc < 0) {
      if (errno == EINTR) continue;
      return peerError("{}: poll: {}", what, errnoText(errno));
    }
    ssize_t n = op(done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return peerError("{}: connection closed by peer after {} of {} bytes", what, done, bytes);
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return peerError("{}: {}", what, errnoText(errno));
    }
  }
  return Status::ok();
}
}  // namespace

Status sendAll(int fd, const void* data, std::size_t bytes, TimePoint deadline) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  return transferAll(fd, bytes, deadline, POLLOUT, "send", [&](std::size_t done) {
    return ::send(fd, p + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
  });
}

Status recvAll(int fd, void* data, std::size_t bytes, TimePoint deadline) {
  auto* p = static_cast<std::uint8_t*>(data);
  return transferAll(fd, bytes, deadline, POLLIN, "receive", [&](std::size_t done) {
    return ::recv(fd, p + done, bytes - done, MSG_DONTWAIT);
  });
}

}  // namespace meridian::transport::tcp
