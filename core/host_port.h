// "host:port" text as every layer takes it (store and peer addresses, probe endpoints,
// metrics addresses): one splitter, so that they agree on what is valid.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace meridian {

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  std::string toString() const;
};

// Splits at the last ':' into a non-empty host (not checked further: callers resolve or
// parse it as they need) and a port of decimal digits in 0..65535. kInvalidArgument naming
// the text and what is wrong with it.
Result<HostPort> splitHostPort(const std::string& text);

}  // namespace meridian
