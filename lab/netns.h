// Network namespaces and TUN devices for the lab. Namespaces are named ones (iproute2's
// /run/netns), so `ip netns exec NAME` works on them too; entering one affects only the
// calling thread, and sockets or TUN devices opened inside keep belonging to it.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

#include "core/fd.h"
#include "core/status.h"

namespace meridian::lab {

// Clear one-line errors for what the lab needs from the machine.
Status requireRoot();
Status requireTun(const std::string& device = "/dev/net/tun");

// Runs argv (no shell) and waits. On a non-zero exit the error holds the command and
// what it printed on stderr.
Status runCommand(const std::vector<std::string>& argv);

bool namespaceExists(const std::string& name);
Status createNamespace(const std::string& name);  // and brings its loopback up
Status deleteNamespace(const std::string& name);  // fine when already gone

// Enters a named namespace on the calling thread; the destructor returns to the one the
// thread was in before.
class NamespaceGuard {
 public:
  static Result<NamespaceGuard> enter(const std::string& name);
  NamespaceGuard(NamespaceGuard&&) noexcept = default;
  NamespaceGuard& operator=(NamespaceGuard&&) = delete;
  ~NamespaceGuard();

 private:
  explicit NamespaceGuard(UniqueFd original) : original_(std::move(original)) {}
  UniqueFd original_;
};

// Enters `name` for good (used in a child process before exec).
Status enterNamespaceForGood(const std::string& name);

// A socket (socket(2) arguments) that lives in namespace `name`.
Result<UniqueFd> socketIn(const std::string& name, int domain, int type, int protocol = 0);

// Creates TUN interface `ifName` (IFF_TUN, no packet-info header) inside namespace `ns`,
// sets its MTU and IPv4 address/24, turns IPv6 off on it and brings it up. The returned
// non-blocking fd reads the packets the namespace sends out of it and writes packets into
// it. The interface disappears when the fd is closed.
Result<UniqueFd> createTun(const std::string& ns, const std::string& ifName, int mtu, const std::string& address);

// An IPv4 socket address (the lab's addresses are always literal IPv4).
sockaddr_in ipv4Address(const std::string& address, int port);

// Sets a sysctl inside namespace `ns` (e.g. "net/ipv4/tcp_rmem").
Status setSysctlIn(const std::string& ns, const std::string& key, const std::string& value);

}  // namespace meridian::lab
