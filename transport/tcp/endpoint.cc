// The TCP endpoint name codec (endpoint.h).
#include "transport/tcp/endpoint.h"

#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

#include "core/wire.h"
#include "transport/tcp/socket.h"

namespace meridian::transport::tcp {

namespace {
constexpr std::size_t kHeaderBytes = 2;
constexpr std::size_t kPathBytes = 6;
}  // namespace

Result<EndpointName> encodeEndpoint(const std::vector<std::string>& addresses) {
  if (addresses.empty() || addresses.size() > kMaxEndpointPaths) {
    return invalidArgument("an endpoint has 1 to {} paths, not {}", kMaxEndpointPaths, addresses.size());
  }
  EndpointName out(kHeaderBytes + kPathBytes * addresses.size());
  out[0] = kEndpointVersion;
  out[1] = static_cast<std::uint8_t>(addresses.size());
  for (std::size_t p = 0; p < addresses.size(); ++p) {
    MERIDIAN_ASSIGN_OR_RETURN(const HostPort hp, parseHostPort(addresses[p]));
    in_addr a{};
    if (::inet_pton(AF_INET, hp.host.c_str(), &a) != 1) {
      return invalidArgument("path {} address '{}' is not an IPv4 address", p, addresses[p]);
    }
    if (hp.port == 0) return invalidArgument("path {} address '{}' has port 0", p, addresses[p]);
    std::uint8_t* at = &out[kHeaderBytes + p * kPathBytes];
    std::memcpy(at, &a.s_addr, 4);
    wire::store<std::uint16_t>(at + 4, hp.port);
  }
  return out;
}

Result<std::vector<std::string>> decodeEndpoint(std::span<const std::uint8_t> name) {
  if (name.size() < kHeaderBytes) return invalidArgument("TCP endpoint of {} bytes (at least {})", name.size(), kHeaderBytes);
  if (name[0] != kEndpointVersion) {
    return invalidArgument("TCP endpoint version {} (this build speaks {})", name[0], kEndpointVersion);
  }
  const std::size_t paths = name[1];
  if (paths == 0 || paths > kMaxEndpointPaths) {
    return invalidArgument("TCP endpoint with {} paths (1 to {})", paths, kMaxEndpointPaths);
  }
  if (name.size() != kHeaderBytes + paths * kPathBytes) {
    return invalidArgument("TCP endpoint of {} bytes for {} paths (want {})", name.size(), paths,
                           kHeaderBytes + paths * kPathBytes);
  }
  std::vector<std::string> out;
  for (std::size_t p = 0; p < paths; ++p) {
    const std::uint8_t* at = &name[kHeaderBytes + p * kPathBytes];
    in_addr a{};
    std::memcpy(&a.s_addr, at, 4);
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a, ip, sizeof(ip));
    const auto port = wire::load<std::uint16_t>(at + 4);
    if (port == 0) return invalidArgument("TCP endpoint path {} has port 0", p);
    out.push_back(fmt::format("{}:{}", ip, port));
  }
  return out;
}

}  // namespace meridian::transport::tcp
