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
// newline removed). Without either, a job is closed: kInvalidArgument saying how to set one,
// unless it has one rank (worldSize 1: a fresh random secret, nobody else can join) or
// MERIDIAN_INSECURE=1 (a fixed, well-known development secret, with a loud warning once).
// worldSize 0: not known (the NCCL plugin, tools), treated as several ranks.
// kInvalidArgument too when the file cannot be read or is empty.
Result<std::string> readJobSecret(int worldSize = 0);
// The same; throws ConfigError with the same message (set-up entry points).
std::string loadJobSecret(int worldSize = 0);

Hmac256 hmacSha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);
// Constant-time comparison.
bool equalDigests(const Hmac256& a, const Hmac256& b);
// Cryptographically random bytes (OpenSSL RAND_bytes). Throws on failure.
void randomBytes(std::span<std::uint8_t> out);
// Bytes as lower-case hex.
std::string hexOf(std::span<const std::uint8_t> bytes);
// `bytes` random bytes as lower-case hex (secrets, keys and unpredictable names).
std::string randomHex(std::size_t bytes);

}  // namespace meridian
