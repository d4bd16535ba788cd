// The host:port splitter (host_port.h).
#include "core/host_port.h"

#include <fmt/format.h>

namespace meridian {

std::string HostPort::toString() const { return fmt::format("{}:{}", host, port); }

Result<HostPort> splitHostPort(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return invalidArgument("'{}' is not host:port", text);
  }
  HostPort hp;
  hp.host = text.substr(0, colon);
  const std::string portText = text.substr(colon + 1);
  unsigned long port = 0;
  for (char c : portText) {
    if (c < '0' || c > '9') return invalidArgument("'{}': port '{}' is not a number", text, portText);
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535) return invalidArgument("'{}': port {} is out of range 0..65535", text, portText);
  }
  hp.port = static_cast<std::uint16_t>(port);
  return hp;
}

}  // namespace meridian
