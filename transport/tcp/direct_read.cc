// Same-host direct reads.
#include "transport/tcp/direct_read.h"

#include "transport/shm/segment.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/secret.h"

namespace meridian::transport::tcp {

namespace {

constexpr std::size_t kMaxOfferBytes = 256;
constexpr std::size_t kMaxHostKeyBytes = 160;

const std::uint64_t& cookie() {
  static const std::uint64_t value = [] {
    std::uint64_t v = 0;
    while (v == 0) {
      std::array<std::uint8_t, 8> b{};
      randomBytes(b);
      std::memcpy(&v, b.data(), sizeof(v));
    }
    return v;
  }();
  return value;
}

template <typename T>
bool parseNumber(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

DirectReadOffer localDirectReadOffer() {
  DirectReadOffer o;
  o.hostKey = shm::localHostKey();
  o.pid = ::getpid();
  o.cookieAddress = reinterpret_cast<std::uintptr_t>(&cookie());
  o.cookie = cookie();
  return o;
}

std::string encodeDirectReadOffer(const DirectReadOffer& o) {
  return fmt::format("v1 {} {} {} {}", o.hostKey, o.pid, o.cookieAddress, o.cookie);
}

Result<DirectReadOffer> decodeDirectReadOffer(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > kMaxOfferBytes) {
    return peerError("direct-read offer of {} bytes (at most {})", bytes.size(), kMaxOfferBytes);
  }
  std::string_view s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::vector<std::string_view> parts;
  while (!s.empty() && parts.size() < 6) {
    std::size_t sp = s.find(' ');
    parts.push_back(s.substr(0, sp));
    s = sp == std::string_view::npos ? std::string_view() : s.substr(sp + 1);
  }
  if (parts.size() != 5 || !s.empty() || parts[0] != "v1") {
    return peerError("direct-read offer is not 'v1 <host> <pid> <address> <cookie>'");
  }
  DirectReadOffer o;
  if (parts[1].empty() || parts[1].size() > kMaxHostKeyBytes) return peerError("direct-read offer: bad host key");
  o.hostKey.assign(parts[1].data(), parts[1].size());
  if (!parseNumber(parts[2], &o.pid) || o.pid <= 0) return peerError("direct-read offer: bad pid '{}'", parts[2]);
  if (!parseNumber(parts[3], &o.cookieAddress) || o.cookieAddress == 0) {
    return peerError("direct-read offer: bad address '{}'", parts[3]);
  }
  if (!parseNumber(parts[4], &o.cookie)) return peerError("direct-read offer: bad cookie '{}'", parts[4]);
  return o;
}

bool canReadDirect(const DirectReadOffer& offer) {
  if (offer.hostKey != shm::localHostKey() || offer.pid == ::getpid()) return false;
  std::uint64_t got = 0;
  if (!readDirect(offer.pid, reinterpret_cast<std::uint8_t*>(&got), offer.cookieAddress, sizeof(got)).isOk()) {
    return false;
  }
  return got == offer.cookie;
}

Status readDirect(std::int64_t pid, std::uint8_t* dst, std::uint64_t remoteAddress, std::size_t bytes) {
  std::size_t done = 0;
  while (done < bytes) {
    iovec local{dst + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remoteAddress + done)), bytes - done};
    ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return peerError("direct read of {} bytes at 0x{:x} from pid {}: {}", bytes, remoteAddress, pid,
                       errnoText(errno));
    }
    if (n == 0) return peerError("direct read of {} bytes at 0x{:x} from pid {} read nothing", bytes, remoteAddress, pid);
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

}  // namespace meridian::transport::tcp
