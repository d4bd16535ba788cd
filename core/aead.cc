// Sealed records over OpenSSL's AES-256-GCM; HKDF over OpenSSL's EVP_KDF.
#include "core/aead.h"

#include <cstring>
#include <mutex>
#include <stdexcept>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include "core/knobs.h"
#include "core/log.h"
#include "core/wire.h"

namespace meridian {

Result<WireSecurity> parseWireSecurity(std::string_view text) {
  if (text == "encrypt") return WireSecurity::kEncrypt;
  if (text == "authenticate") return WireSecurity::kAuthenticate;
  if (text == "off") return WireSecurity::kOff;
  return invalidArgument("MERIDIAN_WIRE_SECURITY='{}': want encrypt, authenticate or off", text);
}

std::string_view wireSecurityName(WireSecurity mode) {
  switch (mode) {
    case WireSecurity::kEncrypt: return "encrypt";
    case WireSecurity::kAuthenticate: return "authenticate";
    case WireSecurity::kOff: return "off";
  }
  return "unknown";
}

Result<WireSecurity> wireSecurityFromKnob() {
  auto text = readKnobChoice(knobs::kWireSecurity);
  if (!text) return text.status();
  auto mode = parseWireSecurity(text.value());
  if (mode && mode.value() == WireSecurity::kOff) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      MLOG_WARN(kCore,
                "MERIDIAN_WIRE_SECURITY=off: INSECURE. Frames after the handshake carry no integrity tag and no "
                "encryption: anyone on the path can read and change gradients, weights and control messages.");
    });
  }
  return mode;
}

namespace {

void check(int ok, const char* what) {
  if (ok != 1) throw std::runtime_error(fmt::format("OpenSSL {} failed", what));
}

int asInt(std::size_t n) { return static_cast<int>(n); }

// Starts a record numbered `number` of `length` bytes on a GCM context holding its key: the
// nonce (IV XOR number) and the length as additional data.
void startRecord(EVP_CIPHER_CTX* c, const std::array<std::uint8_t, kAeadIvBytes>& iv, std::uint64_t number,
                 std::uint64_t length) {
  std::array<std::uint8_t, kAeadIvBytes> nonce = iv;
  for (int i = 0; i < 8; ++i) nonce[4 + i] ^= static_cast<std::uint8_t>(number >> (8 * i));
  check(EVP_CipherInit_ex(c, nullptr, nullptr, nullptr, nonce.data(), -1), "GCM nonce");
  std::uint8_t aad[8];
  wire::store<std::uint64_t>(aad, length);
  int outl = 0;
  check(EVP_CipherUpdate(c, nullptr, &outl, aad, sizeof(aad)), "GCM length");
}

// Feeds n bytes of a record: encrypts or decrypts into out (encrypt), authenticates them
// where they lie and copies them to out when asked (authenticate), or copies (off).
void feedRecord(EVP_CIPHER_CTX* c, WireSecurity mode, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  if (n == 0) return;
  if (mode != WireSecurity::kEncrypt && out != nullptr && out != in) std::memmove(out, in, n);
  if (mode == WireSecurity::kOff) return;
  if (mode == WireSecurity::kEncrypt && out == nullptr) throw std::logic_error("sealed record: encrypt needs an output");
  constexpr std::size_t kStep = std::size_t{1} << 30;
  for (std::size_t done = 0; done < n;) {
    const std::size_t step = std::min(kStep, n - done);
    int outl = 0;
    if (mode == WireSecurity::kEncrypt) {
      check(EVP_CipherUpdate(c, out + done, &outl, in + done, asInt(step)), "GCM update");
    } else {
      check(EVP_CipherUpdate(c, nullptr, &outl, in + done, asInt(step)), "GMAC update");
    }
    done += step;
  }
}

void writeTag(EVP_CIPHER_CTX* c, std::uint8_t* tag) {
  int outl = 0;
  std::uint8_t sink[16];
  check(EVP_CipherFinal_ex(c, sink, &outl), "GCM final");
  check(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, asInt(kAeadTagBytes), tag), "GCM tag");
}

bool checkTag(EVP_CIPHER_CTX* c, const std::uint8_t* tag) {
  std::uint8_t copy[kAeadTagBytes];
  std::memcpy(copy, tag, sizeof(copy));
  check(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, asInt(kAeadTagBytes), copy), "GCM set tag");
  int outl = 0;
  std::uint8_t sink[16];
  return EVP_CipherFinal_ex(c, sink, &outl) == 1;
}

std::span<const std::uint8_t> label(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

}  // namespace

void hkdfSha256(std::span<const std::uint8_t> salt, std::span<const std::uint8_t> ikm,
                std::span<const std::uint8_t> info, std::span<std::uint8_t> out) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) throw std::runtime_error("OpenSSL has no HKDF");
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (ctx == nullptr) throw std::runtime_error("OpenSSL EVP_KDF_CTX_new failed");
  char digest[] = "SHA256";
  OSSL_PARAM params[5];
  std::size_t n = 0;
  params[n++] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::uint8_t*>(ikm.data()), ikm.size());
  if (!salt.empty()) {
    params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<std::uint8_t*>(salt.data()),
                                                    salt.size());
  }
  params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<std::uint8_t*>(info.data()),
                                                  info.size());
  params[n] = OSSL_PARAM_construct_end();
  const int ok = EVP_KDF_derive(ctx, out.data(), out.size(), params);
  EVP_KDF_CTX_free(ctx);
  check(ok, "HKDF");
}

struct RecordCipher::Ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

RecordCipher::RecordCipher(WireSecurity mode, Role role, const DirectionKey& key, std::uint64_t rekeyBytes)
    : mode_(mode), key_(key), rekeyBytes_(rekeyBytes) {
  if (mode_ == WireSecurity::kOff) return;
  ctx_ = std::make_unique<Ctx>();
  if (ctx_->c == nullptr) throw std::runtime_error("OpenSSL EVP_CIPHER_CTX_new failed");
  check(EVP_CipherInit_ex(ctx_->c, EVP_aes_256_gcm(), nullptr, key_.key.data(), nullptr, role == Role::kSeal ? 1 : 0),
        "AES-256-GCM init");
}

RecordCipher::~RecordCipher() = default;

void RecordCipher::begin(std::uint64_t length) {
  if (open_) throw std::logic_error("RecordCipher: a record began before the last one finished");
  open_ = true;
  remaining_ = length;
  length_ = length;
  if (mode_ == WireSecurity::kOff) return;
  startRecord(ctx_->c, key_.iv, records_, length);
}

void RecordCipher::update(const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  if (n > remaining_) throw std::logic_error("RecordCipher: more bytes than the record's length");
  remaining_ -= n;
  feedRecord(ctx_ ? ctx_->c : nullptr, mode_, in, out, n);
}

void RecordCipher::finish() {
  open_ = false;
  ++records_;
  bytesUnderKey_ += length_;
  if (bytesUnderKey_ < rekeyBytes_ || mode_ == WireSecurity::kOff) return;
  // Both ends step at the same record: lengths are authenticated, so they count alike.
  std::array<std::uint8_t, kAeadKeyBytes> next{};
  hkdfSha256({}, key_.key, label("meridian rekey"), next);
  key_.key = next;
  bytesUnderKey_ = 0;
  check(EVP_CipherInit_ex(ctx_->c, nullptr, nullptr, key_.key.data(), nullptr, -1), "AES-256-GCM rekey");
}

void RecordCipher::finishSeal(std::uint8_t* tag) {
  if (remaining_ != 0) throw std::logic_error("RecordCipher: a record sealed short of its length");
  if (mode_ != WireSecurity::kOff) writeTag(ctx_->c, tag);
  finish();
}

bool RecordCipher::finishOpen(const std::uint8_t* tag) {
  if (remaining_ != 0) throw std::logic_error("RecordCipher: a record opened short of its length");
  const bool genuine = mode_ == WireSecurity::kOff || checkTag(ctx_->c, tag);
  finish();
  return genuine;
}

void RecordCipher::seal(std::span<const std::uint8_t> in, std::uint8_t* out, std::uint8_t* tag) {
  begin(in.size());
  update(in.data(), out, in.size());
  finishSeal(tag);
}

bool RecordCipher::open(std::span<const std::uint8_t> in, std::uint8_t* out, const std::uint8_t* tag) {
  begin(in.size());
  update(in.data(), out, in.size());
  return finishOpen(tag);
}

// ------------------------------------------------------------------ numbered records

struct NumberedCipher::Ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

NumberedCipher::NumberedCipher(WireSecurity mode, Role role, const DirectionKey& key) : mode_(mode), base_(key) {
  if (mode_ == WireSecurity::kOff) return;
  ctx_ = std::make_unique<Ctx>();
  if (ctx_->c == nullptr) throw std::runtime_error("OpenSSL EVP_CIPHER_CTX_new failed");
  check(EVP_CipherInit_ex(ctx_->c, EVP_aes_256_gcm(), nullptr, nullptr, nullptr, role == Role::kSeal ? 1 : 0),
        "AES-256-GCM init");
}

NumberedCipher::~NumberedCipher() = default;

void NumberedCipher::begin(std::uint64_t number, std::uint64_t length) {
  if (open_) throw std::logic_error("NumberedCipher: a record began before the last one finished");
  if (length > kMaxNumberedRecordBytes) throw std::logic_error("NumberedCipher: a record over its size bound");
  open_ = true;
  remaining_ = length;
  if (mode_ == WireSecurity::kOff) return;
  const std::uint64_t epoch = number >> kNumberedEpochShift;
  if (epoch != epoch_) {
    // The epoch's key: HKDF-Expand of the direction's key by the epoch's number (epochs do
    // not chain, so a record from the last epoch that arrives late still opens).
    std::uint8_t info[sizeof("meridian epoch") - 1 + 8];
    std::memcpy(info, "meridian epoch", sizeof("meridian epoch") - 1);
    wire::store<std::uint64_t>(info + sizeof("meridian epoch") - 1, epoch);
    std::array<std::uint8_t, kAeadKeyBytes> key{};
    hkdfSha256({}, base_.key, info, key);
    check(EVP_CipherInit_ex(ctx_->c, nullptr, nullptr, key.data(), nullptr, -1), "AES-256-GCM epoch key");
    epoch_ = epoch;
  }
  startRecord(ctx_->c, base_.iv, number, length);
}

void NumberedCipher::update(const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  if (n > remaining_) throw std::logic_error("NumberedCipher: more bytes than the record's length");
  remaining_ -= n;
  feedRecord(ctx_ ? ctx_->c : nullptr, mode_, in, out, n);
}

void NumberedCipher::finishSeal(std::uint8_t* tag) {
  if (remaining_ != 0) throw std::logic_error("NumberedCipher: a record sealed short of its length");
  open_ = false;
  if (mode_ != WireSecurity::kOff) writeTag(ctx_->c, tag);
}

bool NumberedCipher::finishOpen(const std::uint8_t* tag) {
  if (remaining_ != 0) throw std::logic_error("NumberedCipher: a record opened short of its length");
  open_ = false;
  return mode_ == WireSecurity::kOff || checkTag(ctx_->c, tag);
}

void NumberedCipher::seal(std::uint64_t number, std::span<const std::uint8_t> in, std::uint8_t* out,
                          std::uint8_t* tag) {
  begin(number, in.size());
  update(in.data(), out, in.size());
  finishSeal(tag);
}

bool NumberedCipher::open(std::uint64_t number, std::span<const std::uint8_t> in, std::uint8_t* out,
                          const std::uint8_t* tag) {
  begin(number, in.size());
  update(in.data(), out, in.size());
  return finishOpen(tag);
}

bool ReplayWindow::fresh(std::uint64_t number) const {
  if (number >= highest_) return number != ~0ull;
  const std::uint64_t behind = highest_ - 1 - number;
  if (behind >= kWindow) return false;
  const std::uint64_t slot = number % kWindow;
  return (bits_[slot / 64] >> (slot % 64) & 1) == 0;
}

void ReplayWindow::take(std::uint64_t number) {
  // Numbers that fall out of the window as the highest moves up are forgotten (their slots
  // serve the new numbers).
  for (std::uint64_t n = highest_; n <= number && n < highest_ + kWindow; ++n) {
    const std::uint64_t slot = n % kWindow;
    bits_[slot / 64] &= ~(std::uint64_t{1} << (slot % 64));
  }
  if (number >= highest_ + kWindow) bits_.fill(0);
  if (number >= highest_) highest_ = number + 1;
  const std::uint64_t slot = number % kWindow;
  bits_[slot / 64] |= std::uint64_t{1} << (slot % 64);
}

}  // namespace meridian
