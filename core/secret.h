// The job secret and HMAC-SHA256 (OpenSSL). Every connection proves it holds the secret.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace meridian {

using Hmac256 = std::array<std::uint8_t, 32>;

// The job secret: MERIDIAN_SECRET, else the contents of MERIDIAN_SECRET_FILE (trailing
// newline removed), else a fixed development secret with a loud warning (once).
// kInvalidArgument when the file cannot be read or is empty.
Result<std::string> readJobSecret();
// The same; throws ConfigError with the same message (set-up entry points).
std::string loadJobSecret();

Hmac256 hmacSha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);
// Constant-time comparison.
bool equalDigests(const Hmac256& a, const Hmac256& b);
// Cryptographically random bytes (OpenSSL RAND_bytes). Throws on failure.
void randomBytes(std::span<std::uint8_t> out);

}  // namespace meridian
