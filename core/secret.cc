// Job secret loading and HMAC via OpenSSL.
#include "core/secret.h"

#include <array>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "core/knob_list.h"
#include "core/knobs.h"
#include "core/log.h"

namespace meridian {

Result<std::string> readJobSecret(int worldSize) {
  if (knobIsSet(knobs::kSecret)) return knobString(knobs::kSecret);
  if (knobIsSet(knobs::kSecretFile)) {
    std::string path = knobString(knobs::kSecretFile);
    std::ifstream in(path, std::ios::binary);
    if (!in) return invalidArgument("MERIDIAN_SECRET_FILE='{}': cannot read it", path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) return invalidArgument("MERIDIAN_SECRET_FILE='{}': the file is empty", path);
    return s;
  }
  if (worldSize == 1) return randomHex(32);
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t insecure, readKnobInt(knobs::kInsecure, 0, 1));
  if (insecure == 0) {
    return invalidArgument(
        "no job secret: set MERIDIAN_SECRET (or MERIDIAN_SECRET_FILE) to the same value on every rank, e.g. "
        "MERIDIAN_SECRET=$(openssl rand -hex 32) (meridian-train --ranks N and meridian-lab make one themselves), or "
        "MERIDIAN_INSECURE=1 to run on a well-known development secret that lets anyone who reaches the job's ports "
        "join it");
  }
  static std::once_flag warned;
  std::call_once(warned, [] {
    MLOG_WARN(kCore,
              "INSECURE: MERIDIAN_INSECURE=1 and no MERIDIAN_SECRET, so connections are authenticated with a "
              "well-known development secret. Anyone who can reach this job's ports can join it, read what it "
              "sends and change it. Set MERIDIAN_SECRET for any real run.");
  });
  return std::string("meridian-insecure-development-secret");
}

std::string loadJobSecret(int worldSize) {
  Result<std::string> secret = readJobSecret(worldSize);
  if (!secret.isOk()) throw ConfigError(secret.status().message());
  return std::move(secret).value();
}

Hmac256 hmacSha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
  Hmac256 out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(), data.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    throw std::runtime_error("HMAC-SHA256 failed in OpenSSL");
  }
  return out;
}

bool equalDigests(const Hmac256& a, const Hmac256& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

void randomBytes(std::span<std::uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed in OpenSSL");
  }
}

std::string hexOf(std::span<const std::uint8_t> bytes) { return fmt::format("{:02x}", fmt::join(bytes, "")); }

std::string randomHex(std::size_t bytes) {
  std::vector<std::uint8_t> raw(bytes);
  randomBytes(raw);
  return hexOf(raw);
}

}  // namespace meridian
