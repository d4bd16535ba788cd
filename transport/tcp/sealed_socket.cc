// Sealed records: the pure codec, and a blocking socket over it.
#include "transport/tcp/sealed_socket.h"

#include <algorithm>
#include <cstring>

#include "core/wire.h"
#include "transport/tcp/socket.h"

namespace meridian::transport::tcp {

RecordWriter::RecordWriter(WireSecurity mode, const DirectionKey& key)
    : cipher_(mode, RecordCipher::Role::kSeal, key) {}

void RecordWriter::append(std::span<const std::uint8_t> bytes, std::vector<std::uint8_t>& out) {
  const std::size_t tag = cipher_.tagBytes();
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(bytes.size() - at, kMaxSealedRecordBytes);
    const std::size_t base = out.size();
    out.resize(base + kSealedRecordPrefixBytes + n + tag);
    std::uint8_t* body = out.data() + base + kSealedRecordPrefixBytes;
    wire::store<std::uint32_t>(out.data() + base, static_cast<std::uint32_t>(n));
    cipher_.seal(bytes.subspan(at, n), body, body + n);
    at += n;
  } while (at < bytes.size());
}

RecordReader::RecordReader(WireSecurity mode, const DirectionKey& key)
    : cipher_(mode, RecordCipher::Role::kOpen, key) {}

std::span<std::uint8_t> RecordReader::space() {
  if (plainPos_ < plainEnd_) return {};
  if (prefixGot_ < kSealedRecordPrefixBytes) return {prefix_ + prefixGot_, kSealedRecordPrefixBytes - prefixGot_};
  return std::span(body_).subspan(bodyGot_);
}

Status RecordReader::commit(std::size_t n) {
  if (prefixGot_ < kSealedRecordPrefixBytes) {
    prefixGot_ += n;
    if (prefixGot_ < kSealedRecordPrefixBytes) return Status::ok();
    const auto length = wire::load<std::uint32_t>(prefix_);
    if (length > kMaxSealedRecordBytes) {
      return peerError("integrity: a record states {} bytes, more than the {} a record may hold", length,
                       kMaxSealedRecordBytes);
    }
    body_.resize(length + cipher_.tagBytes());
    bodyGot_ = 0;
    plainPos_ = plainEnd_ = 0;
    return body_.empty() ? open() : Status::ok();  // an empty record without a tag is whole already
  }
  bodyGot_ += n;
  return bodyGot_ == body_.size() ? open() : Status::ok();
}

Status RecordReader::open() {
  const std::size_t length = body_.size() - cipher_.tagBytes();
  prefixGot_ = 0;
  if (!cipher_.open(std::span<const std::uint8_t>(body_.data(), length), body_.data(), body_.data() + length)) {
    body_.clear();
    return peerError("integrity: a record failed its tag (changed, forged, replayed or reordered on the way)");
  }
  plainPos_ = 0;
  plainEnd_ = length;
  return Status::ok();
}

SealedSocket::SealedSocket(int fd, const SessionKeys& keys) : fd_(fd), tx_(keys.mode, keys.send), rx_(keys.mode, keys.recv) {}

Status SealedSocket::send(std::span<const std::uint8_t> bytes, TimePoint deadline) {
  out_.clear();
  tx_.append(bytes, out_);
  return sendAll(fd_, out_.data(), out_.size(), deadline);
}

Status SealedSocket::read(std::span<std::uint8_t> dst, TimePoint deadline) {
  for (std::size_t got = 0; got < dst.size();) {
    const std::span<const std::uint8_t> plain = rx_.plaintext();
    if (plain.empty()) {
      const std::span<std::uint8_t> space = rx_.space();
      MERIDIAN_RETURN_IF_ERROR(recvAll(fd_, space.data(), space.size(), deadline));
      MERIDIAN_RETURN_IF_ERROR(rx_.commit(space.size()));
      continue;
    }
    const std::size_t take = std::min(dst.size() - got, plain.size());
    std::memcpy(dst.data() + got, plain.data(), take);
    rx_.consume(take);
    got += take;
  }
  return Status::ok();
}

}  // namespace meridian::transport::tcp
