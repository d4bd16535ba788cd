// Small blocking-with-deadline socket helpers for set-up paths (bootstrap store,
// connection handshakes). The data path never uses these; it lives in tcp_device.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/clock.h"
#include "core/fd.h"
#include "core/host_port.h"
#include "core/status.h"

namespace meridian::transport::tcp {

using meridian::HostPort;

// Parses "host:port" (IPv4 literal or a resolvable name; core/host_port.h). kInvalidArgument
// on garbage.
inline Result<HostPort> parseHostPort(const std::string& text) { return splitHostPort(text); }

// Listens on ip:port (port 0: the kernel picks one). Non-blocking when `nonBlocking`. Every
// socket accepted from it has TCP_NODELAY set.
Result<UniqueFd> listenOn(const std::string& ip, std::uint16_t port, bool nonBlocking, int backlog = 512);
// Connects (retrying refused connections until the deadline, as peers start at
// different times), optionally binding the local side to `localIp` first. The returned
// socket is blocking, with TCP_NODELAY set.
Result<UniqueFd> connectTo(const HostPort& remote, const std::string& localIp, TimePoint deadline);
// Starts a non-blocking connect (bound to `localIp` first when given): the socket is
// connected or connecting (poll it for writability, then read SO_ERROR); TCP_NODELAY set.
Result<UniqueFd> startConnect(const HostPort& remote, const std::string& localIp);
// Local or remote "ip:port" of a socket.
std::string localAddress(int fd);
std::string peerAddress(int fd);

// Whole-buffer send/receive on a blocking socket, giving up at the deadline.
Status sendAll(int fd, const void* data, std::size_t bytes, TimePoint deadline);
Status recvAll(int fd, void* data, std::size_t bytes, TimePoint deadline);

// Socket options for data streams.
Status setNonBlocking(int fd, bool on);
// TCP_NOTSENT_LOWAT: unsent bytes the kernel may hold before the socket stops being writable.
bool setNotsentLowat(int fd, int bytes);
// TCP_NODELAY; SO_SNDBUF and SO_RCVBUF when `bufferBytes` > 0.
Status tuneDataSocket(int fd, int bufferBytes);
// setsockopt of an int option; `what` names it in the error.
Status setIntOption(int fd, int level, int name, int value, const char* what);

}  // namespace meridian::transport::tcp
