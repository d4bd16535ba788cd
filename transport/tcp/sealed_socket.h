// Sealed records (core/aead.h) for set-up paths that speak in messages over one socket (the
// store). Each message becomes one or more records of at most kMaxSealedRecordBytes:
//
//   length u32 (little-endian, at most kMaxSealedRecordBytes) | body | tag
//
// The length is bounded before anything is allocated and is authenticated with the body;
// only bytes of records whose tag has been checked are handed out. The codec is pure
// (RecordWriter, RecordReader: no I/O), so that a blocking connection (SealedSocket) and a
// non-blocking event loop (the store's server) frame records the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/aead.h"
#include "core/clock.h"
#include "core/status.h"
#include "transport/tcp/handshake.h"

namespace meridian::transport::tcp {

inline constexpr std::size_t kMaxSealedRecordBytes = 64 * 1024;
inline constexpr std::size_t kSealedRecordPrefixBytes = 4;

// One direction's sealing side: appends `bytes` to `out` as records (an empty message is one
// empty record). Single-threaded, like the connection it serves.
class RecordWriter {
 public:
  RecordWriter(WireSecurity mode, const DirectionKey& key);
  void append(std::span<const std::uint8_t> bytes, std::vector<std::uint8_t>& out);

 private:
  RecordCipher cipher_;
};

// One direction's opening side, fed raw bytes as they come: write at most space().size()
// bytes at space(), commit() how many, and take the plaintext of opened records. space() is
// empty while opened plaintext waits to be taken, so at most one record (64 KiB and a tag)
// is ever buffered.
class RecordReader {
 public:
  RecordReader(WireSecurity mode, const DirectionKey& key);
  std::span<std::uint8_t> space();
  // `n` raw bytes were written at space(). kPeerError ("integrity") on a record that states a
  // length out of bounds or fails its tag; after an error the connection must be dropped.
  Status commit(std::size_t n);
  // Plaintext of opened records not yet taken, and taking some of it.
  std::span<const std::uint8_t> plaintext() const { return std::span(body_).subspan(plainPos_, plainEnd_ - plainPos_); }
  void consume(std::size_t n) { plainPos_ += n; }

 private:
  Status open();
  RecordCipher cipher_;
  std::uint8_t prefix_[kSealedRecordPrefixBytes] = {};
  std::size_t prefixGot_ = 0;
  std::vector<std::uint8_t> body_;  // the record being read (body and tag), then its plaintext
  std::size_t bodyGot_ = 0;
  std::size_t plainPos_ = 0, plainEnd_ = 0;
};

// A blocking connection over the codec above.
class SealedSocket {
 public:
  // fd stays owned by the caller and must outlive this.
  SealedSocket(int fd, const SessionKeys& keys);
  Status send(std::span<const std::uint8_t> bytes, TimePoint deadline);
  // Exactly dst.size() bytes of genuine plaintext; kPeerError ("integrity") on a record
  // that fails its tag or states a length out of bounds. After an error the connection
  // must be dropped.
  Status read(std::span<std::uint8_t> dst, TimePoint deadline);
  // Bytes of an opened record not yet read.
  std::size_t buffered() const { return rx_.plaintext().size(); }

 private:
  int fd_;
  RecordWriter tx_;
  RecordReader rx_;
  std::vector<std::uint8_t> out_;
};

}  // namespace meridian::transport::tcp
