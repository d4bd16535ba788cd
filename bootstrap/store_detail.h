// Helpers the store's files share (store.cc: codec, state, client; store_server.cc: the
// server). Private to bootstrap/.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meridian::bootstrap::detail {

// A key as it may appear in a message: printable, escaped, and short.
std::string printable(std::string_view key);
// MERIDIAN_TIMEOUT_MS: how long a store connection may stay silent mid-exchange.
Result<std::chrono::milliseconds> ioTimeoutFromKnob();

}  // namespace meridian::bootstrap::detail
