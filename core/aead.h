// Sealed records: what every byte on a Meridian connection travels in after the handshake.
//
// A connection carries, in each direction, a sequence of records. Each record is sealed
// with AES-256-GCM (OpenSSL EVP) under that direction's key; its nonce is the direction's
// 12-byte IV XOR the record's number (0, 1, 2, ... as in TLS 1.3), so the sequence number is
// implicit: a record that is dropped, replayed, reordered or forged fails its tag. The
// record's length is authenticated too (as additional data), so a record cannot be cut or
// stretched. After kRekeyBytes under one key both ends step to the next key (HKDF-Expand of
// the current one), so no key seals more than the bound GCM's security margin allows.
//
// Three modes (MERIDIAN_WIRE_SECURITY):
//   encrypt       the payload is encrypted and authenticated (the default);
//   authenticate  the payload travels in clear but is authenticated (GMAC): cheaper, and the
//                 receiver can still place bytes straight where they belong;
//   off           no tag, no check ("insecure": for trusted, isolated networks only).
//
// A record is sealed either whole (seal/open) or streamed (begin, update..., finish*), so a
// large chunk need not be buffered: the receiver places bytes as they arrive and learns at
// finishOpen() whether they were genuine. A caller must not act on streamed bytes before
// finishOpen() says true. Pure and deterministic given the keys; unit-tested and fuzzed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "core/status.h"

namespace meridian {

enum class WireSecurity : std::uint8_t { kOff = 0, kAuthenticate = 1, kEncrypt = 2 };

Result<WireSecurity> parseWireSecurity(std::string_view text);
std::string_view wireSecurityName(WireSecurity mode);
// MERIDIAN_WIRE_SECURITY (encrypt unless set); `off` logs an "insecure" warning once.
Result<WireSecurity> wireSecurityFromKnob();

inline constexpr std::size_t kAeadKeyBytes = 32;
inline constexpr std::size_t kAeadIvBytes = 12;
inline constexpr std::size_t kAeadTagBytes = 16;
// Bytes sealed under one key before both ends step to the next (2^36: 64 GiB; TLS 1.3's
// AES-GCM limit of 2^24.5 full records is 2^38.5 bytes).
inline constexpr std::uint64_t kRekeyBytes = 1ull << 36;

struct DirectionKey {
  std::array<std::uint8_t, kAeadKeyBytes> key{};
  std::array<std::uint8_t, kAeadIvBytes> iv{};
};

// One direction of one connection: seals (sender) or opens (receiver) its records in order.
class RecordCipher {
 public:
  enum class Role : std::uint8_t { kSeal, kOpen };
  // rekeyBytes: bytes under one key before the next (tests set it small).
  RecordCipher(WireSecurity mode, Role role, const DirectionKey& key, std::uint64_t rekeyBytes = kRekeyBytes);
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;

  WireSecurity mode() const { return mode_; }
  // Bytes a record adds on the wire (the tag): 0 when off.
  std::size_t tagBytes() const { return mode_ == WireSecurity::kOff ? 0 : kAeadTagBytes; }
  // Records sealed or opened so far (the next record's number).
  std::uint64_t records() const { return records_; }

  // A whole record. `out` receives in.size() bytes (it may be `in` itself); seal writes
  // tagBytes() at `tag`, open checks them. open false: the record is not genuine (nothing
  // in `out` may be used, and the connection must be dropped).
  void seal(std::span<const std::uint8_t> in, std::uint8_t* out, std::uint8_t* tag);
  bool open(std::span<const std::uint8_t> in, std::uint8_t* out, const std::uint8_t* tag);

  // A streamed record of `length` bytes: update() as bytes come (out may equal in), then
  // finishSeal writes the tag, finishOpen checks it. update() with out == nullptr is allowed
  // when the mode does not encrypt (the bytes are authenticated where they lie).
  void begin(std::uint64_t length);
  void update(const std::uint8_t* in, std::uint8_t* out, std::size_t n);
  void finishSeal(std::uint8_t* tag);
  bool finishOpen(const std::uint8_t* tag);

 private:
  void finish();
  WireSecurity mode_;
  DirectionKey key_;
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  std::uint64_t records_ = 0;
  std::uint64_t bytesUnderKey_ = 0;
  std::uint64_t rekeyBytes_;
  std::uint64_t remaining_ = 0;
  std::uint64_t length_ = 0;
  bool open_ = false;
};

// Numbered records, for datagram transports (fabric paths), where messages may complete out
// of order: the record's number travels with it instead of being implied by its position.
// The sender numbers its records 0, 1, 2, ... and never uses a number twice; the receiver
// checks each number against a ReplayWindow before it acts on the record. The nonce is the
// direction's IV XOR the number, the length is authenticated, and the key is that of the
// number's epoch (number >> kNumberedEpochShift), HKDF-Expanded from the direction's key, so
// no key seals more than 2^kNumberedEpochShift records (at most kMaxNumberedRecordBytes each:
// within kRekeyBytes). Modes as for RecordCipher.
inline constexpr int kNumberedEpochShift = 12;
inline constexpr std::uint64_t kMaxNumberedRecordBytes = kRekeyBytes >> kNumberedEpochShift;  // 16 MiB

class NumberedCipher {
 public:
  using Role = RecordCipher::Role;
  NumberedCipher(WireSecurity mode, Role role, const DirectionKey& key);
  ~NumberedCipher();
  NumberedCipher(const NumberedCipher&) = delete;
  NumberedCipher& operator=(const NumberedCipher&) = delete;

  WireSecurity mode() const { return mode_; }
  std::size_t tagBytes() const { return mode_ == WireSecurity::kOff ? 0 : kAeadTagBytes; }

  // A streamed record numbered `number` of `length` bytes (at most kMaxNumberedRecordBytes):
  // update() as for RecordCipher, then finishSeal or finishOpen.
  void begin(std::uint64_t number, std::uint64_t length);
  void update(const std::uint8_t* in, std::uint8_t* out, std::size_t n);
  void finishSeal(std::uint8_t* tag);
  bool finishOpen(const std::uint8_t* tag);
  // A whole record.
  void seal(std::uint64_t number, std::span<const std::uint8_t> in, std::uint8_t* out, std::uint8_t* tag);
  bool open(std::uint64_t number, std::span<const std::uint8_t> in, std::uint8_t* out, const std::uint8_t* tag);

 private:
  WireSecurity mode_;
  DirectionKey base_;
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  std::uint64_t epoch_ = ~0ull;  // the epoch whose key ctx_ holds
  std::uint64_t remaining_ = 0;
  bool open_ = false;
};

// Which record numbers a receiver has taken, so none is taken twice: numbers more than
// kWindow behind the highest seen are refused as too old (a sender's numbers only grow, and
// a datagram transport reorders within a few messages, far less than the window).
class ReplayWindow {
 public:
  static constexpr std::uint64_t kWindow = 1024;
  // True when `number` was not taken and is not too old. Check before acting on a record.
  bool fresh(std::uint64_t number) const;
  // Marks `number` taken (after its tag checked).
  void take(std::uint64_t number);

 private:
  std::uint64_t highest_ = 0;  // highest number taken + 1 (0: none yet)
  std::array<std::uint64_t, kWindow / 64> bits_{};
};

// HKDF-SHA256 (RFC 5869): Extract(salt, ikm) then Expand(info) into out.
void hkdfSha256(std::span<const std::uint8_t> salt, std::span<const std::uint8_t> ikm,
                std::span<const std::uint8_t> info, std::span<std::uint8_t> out);

}  // namespace meridian
