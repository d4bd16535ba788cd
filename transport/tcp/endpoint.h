// The TCP device's endpoint name (device.h's EndpointName): every path's listening IPv4
// address and port, as peers connect to them. Layout: version u8 (1), path count u8, then
// per path the address (4 bytes, network order) and the port (u16 little-endian); 74 bytes
// for 12 paths, so it fits an NCCL connection handle. Decoding bounds everything first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/device.h"

namespace meridian::transport::tcp {

inline constexpr std::uint8_t kEndpointVersion = 1;
inline constexpr std::size_t kMaxEndpointPaths = 64;

// "ip:port" per path -> the name. invalidArgument for an address that is not IPv4 ip:port,
// port 0, or more than kMaxEndpointPaths paths.
Result<EndpointName> encodeEndpoint(const std::vector<std::string>& addresses);
// The name -> "ip:port" per path. invalidArgument naming the problem: empty, unknown
// version, a path count of 0 or over the bound, a length that disagrees with the count, port 0.
Result<std::vector<std::string>> decodeEndpoint(std::span<const std::uint8_t> name);

}  // namespace meridian::transport::tcp
