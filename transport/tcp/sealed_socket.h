// A blocking connection whose bytes travel in sealed records (core/aead.h), for set-up paths
// that speak in messages over one socket (the store). Each send() becomes one or more
// records of at most kMaxSealedRecordBytes:
//
//   length u32 (little-endian, at most kMaxSealedRecordBytes) | body | tag
//
// The length is bounded before anything is allocated and is authenticated with the body;
// read() hands out only bytes of records whose tag has been checked.
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
  std::size_t buffered() const { return in_.size() - inPos_; }

 private:
  int fd_;
  RecordCipher tx_;
  RecordCipher rx_;
  std::vector<std::uint8_t> out_;
  std::vector<std::uint8_t> in_;
  std::size_t inPos_ = 0;
};

}  // namespace meridian::transport::tcp
