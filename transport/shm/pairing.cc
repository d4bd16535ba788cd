#include "transport/shm/pairing.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "core/log.h"

namespace meridian::transport::shm {
namespace {

// The first space-separated field of `text` (moved past it).
std::string_view field(std::string_view* text) {
  const std::size_t end = std::min(text->find(' '), text->size());
  std::string_view f = text->substr(0, end);
  text->remove_prefix(std::min(end + 1, text->size()));
  return f;
}

template <typename T>
bool number(std::string_view f, T* v) {
  if (f.empty() || f.size() > 12) return false;
  auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), *v);
  return ec == std::errc() && p == f.data() + f.size();
}

bool printable(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::string encodePairing(const PairingMessage& m) {
  switch (m.kind) {
    case PairingKind::kHello:
      return fmt::format("hello {} {} {}", m.pid, m.doorbell, m.hostKey);
    case PairingKind::kOffer:
      return fmt::format("offer {} {}", m.doorbell, encodeSegmentOffer(m.segment));
    case PairingKind::kAttached:
      return "attached";
    case PairingKind::kRefused:
      break;
  }
  std::string why = m.reason.substr(0, kMaxReasonBytes);
  for (char& c : why) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return "refused " + why;
}

Result<PairingMessage> decodePairing(std::span<const std::uint8_t> bytes, std::uint64_t maxSegmentBytes) {
  const std::string_view all(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto bad = [&](std::string_view why) {
    return peerError("a shared-memory pairing message that {}: '{}'", why, all.substr(0, 120));
  };
  if (all.size() > 1024) return bad("is too long");
  if (!printable(all)) return bad("is not printable text");
  std::string_view rest = all;
  const std::string_view kind = field(&rest);
  PairingMessage m;
  if (kind == "hello") {
    m.kind = PairingKind::kHello;
    if (!number(field(&rest), &m.pid) || m.pid <= 0) return bad("names no process");
    if (!number(field(&rest), &m.doorbell) || m.doorbell < -1) return bad("names no doorbell");
    if (rest.empty() || rest.size() > 256 || rest.find(' ') != std::string_view::npos) return bad("names no host");
    m.hostKey = std::string(rest);
    return m;
  }
  if (kind == "offer") {
    m.kind = PairingKind::kOffer;
    if (!number(field(&rest), &m.doorbell) || m.doorbell < -1) return bad("names no doorbell");
    auto segment = decodeSegmentOffer(rest, maxSegmentBytes);
    if (!segment) return segment.status();
    m.segment = std::move(segment).value();
    return m;
  }
  if (kind == "attached") {
    if (!rest.empty()) return bad("says more than 'attached'");
    m.kind = PairingKind::kAttached;
    return m;
  }
  if (kind == "refused") {
    if (rest.size() > kMaxReasonBytes) return bad("gives too long a reason");
    m.kind = PairingKind::kRefused;
    m.reason = std::string(rest);
    return m;
  }
  return bad("is of no known kind");
}

Result<UniqueFd> takePeerFd(std::int32_t pid, int fd) {
  if (pid <= 0 || fd < 0) return pathError("no descriptor to take (process {}, fd {})", pid, fd);
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (pidfd.get() < 0) return pathError("pidfd_open({}): {}", pid, errnoText(errno));
  UniqueFd copy(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
  if (copy.get() < 0) return pathError("pidfd_getfd(process {}, fd {}): {}", pid, fd, errnoText(errno));
  return copy;
#else
  return pathError("this system has no pidfd_getfd");
#endif
}

}  // namespace meridian::transport::shm
