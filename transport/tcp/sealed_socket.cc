// Sealed records over a blocking socket.
#include "transport/tcp/sealed_socket.h"

#include <algorithm>
#include <cstring>

#include "core/wire.h"
#include "transport/tcp/socket.h"

namespace meridian::transport::tcp {

SealedSocket::SealedSocket(int fd, const SessionKeys& keys)
    : fd_(fd),
      tx_(keys.mode, RecordCipher::Role::kSeal, keys.send),
      rx_(keys.mode, RecordCipher::Role::kOpen, keys.recv) {}

Status SealedSocket::send(std::span<const std::uint8_t> bytes, TimePoint deadline) {
  const std::size_t tag = tx_.tagBytes();
  out_.clear();
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(bytes.size() - at, kMaxSealedRecordBytes);
    const std::size_t base = out_.size();
    out_.resize(base + 4 + n + tag);
    wire::store<std::uint32_t>(&out_[base], static_cast<std::uint32_t>(n));
    tx_.seal(bytes.subspan(at, n), out_.data() + base + 4, out_.data() + base + 4 + n);
    at += n;
  } while (at < bytes.size());
  return sendAll(fd_, out_.data(), out_.size(), deadline);
}

Status SealedSocket::read(std::span<std::uint8_t> dst, TimePoint deadline) {
  for (std::size_t got = 0; got < dst.size();) {
    if (inPos_ == in_.size()) {
      std::uint8_t len[4];
      MERIDIAN_RETURN_IF_ERROR(recvAll(fd_, len, sizeof(len), deadline));
      const std::uint32_t n = wire::load<std::uint32_t>(len);
      if (n > kMaxSealedRecordBytes) {
        return peerError("integrity: a record states {} bytes, more than the {} a record may hold", n,
                         kMaxSealedRecordBytes);
      }
      in_.resize(n + rx_.tagBytes());
      inPos_ = 0;
      MERIDIAN_RETURN_IF_ERROR(recvAll(fd_, in_.data(), in_.size(), deadline));
      if (!rx_.open(std::span<const std::uint8_t>(in_.data(), n), in_.data(), in_.data() + n)) {
        in_.clear();
        return peerError("integrity: a record failed its tag (changed, forged, replayed or reordered on the way)");
      }
      in_.resize(n);
    }
    const std::size_t take = std::min(dst.size() - got, in_.size() - inPos_);
    std::memcpy(dst.data() + got, in_.data() + inPos_, take);
    inPos_ += take;
    got += take;
  }
  return Status::ok();
}

}  // namespace meridian::transport::tcp
