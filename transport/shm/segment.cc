// ShmSegment: a rank's POSIX shared-memory segment (see segment.h).
#include "transport/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <utility>

#include "core/fd.h"
#include "core/log.h"
#include "core/secret.h"

namespace meridian::transport::shm {

namespace {

constexpr std::size_t kMaxTagBytes = 32;
constexpr std::size_t kMaxNameBytes = 1 + kSegmentPrefix.size() + kMaxTagBytes + 1 + 16;

std::size_t pageRounded(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

bool parseHex(std::string_view text, std::span<std::uint8_t> out) {
  if (text.size() != 2 * out.size()) return false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto [p, ec] = std::from_chars(text.data() + 2 * i, text.data() + 2 * i + 2, out[i], 16);
    if (ec != std::errc() || p != text.data() + 2 * i + 2) return false;
  }
  return true;
}

std::string namespaceId(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return "?";
  return fmt::format("{}:{}", static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino));
}

}  // namespace

std::string localHostKey() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  const std::string_view bootId = boot.empty() ? std::string_view("?") : std::string_view(boot);
  return fmt::format("{}/{}/{}/{}", bootId, static_cast<unsigned>(::getuid()), namespaceId("/proc/self/ns/net"),
                     namespaceId("/proc/self/ns/pid"));
}

bool processAlive(std::int32_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) return false;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: kill() is all we know
  char line[512] = {};
  const std::size_t n = std::fread(line, 1, sizeof(line) - 1, f);
  std::fclose(f);
  const char* close = std::strrchr(line, ')');  // the command name may hold spaces and parentheses
  if (n == 0 || close == nullptr || close[1] != ' ') return true;
  return close[2] != 'Z' && close[2] != 'X';
}

std::string jobSegmentTag(std::string_view secret, std::uint64_t sessionId) {
  std::string info = "meridian shm ";
  info.append(reinterpret_cast<const char*>(&sessionId), sizeof(sessionId));
  const Hmac256 mac = hmacSha256(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(secret.data()),
                                                               secret.size()),
                                 std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(info.data()),
                                                               info.size()));
  return hexOf(std::span<const std::uint8_t>(mac.data(), 8));
}

std::string encodeSegmentOffer(const SegmentOffer& o) {
  return fmt::format("v1 {} {} {} {}", o.name, o.bytes, o.ownerPid, hexOf(o.token));
}

Result<SegmentOffer> decodeSegmentOffer(std::string_view text, std::uint64_t maxBytes) {
  auto bad = [&](std::string_view why) {
    return peerError("a shared-memory offer that {}: '{}'", why, text.substr(0, 160));
  };
  if (text.size() > kMaxNameBytes + 96) return bad("is too long");
  std::string_view fields[5];
  std::size_t n = 0;
  for (std::size_t at = 0; at <= text.size() && n < 6;) {
    const std::size_t end = std::min(text.find(' ', at), text.size());
    if (n == 5) return bad("has more than five fields");
    fields[n++] = text.substr(at, end - at);
    at = end + 1;
  }
  if (n != 5 || fields[0] != "v1") return bad("is not 'v1 NAME BYTES PID TOKEN'");
  SegmentOffer o;
  const std::string_view name = fields[1];
  if (name.size() > kMaxNameBytes || name.size() < 2 + kSegmentPrefix.size() || name[0] != '/' ||
      name.substr(1, kSegmentPrefix.size()) != kSegmentPrefix || name.find('/', 1) != std::string_view::npos ||
      name.find('\0') != std::string_view::npos) {
    return bad("names no Meridian segment");
  }
  o.name = std::string(name);
  auto number = [](std::string_view f, auto* v) {
    auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), *v);
    return ec == std::errc() && p == f.data() + f.size();
  };
  if (!number(fields[2], &o.bytes) || o.bytes < kSegmentHeaderBytes || o.bytes > maxBytes) {
    return bad(fmt::format("states a size outside [{}, {}]", kSegmentHeaderBytes, maxBytes));
  }
  if (!number(fields[3], &o.ownerPid) || o.ownerPid <= 0) return bad("states no process id");
  if (!parseHex(fields[4], o.token)) return bad("has no 128-bit token");
  return o;
}

Result<ShmSegment> ShmSegment::create(std::string_view tag, std::size_t bytes) {
  if (tag.empty() || tag.size() > kMaxTagBytes ||
      tag.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
    return invalidArgument("shared-memory tag '{}' is not 1-{} lower-case hex digits", tag, kMaxTagBytes);
  }
  ShmSegment s;
  s.bytes_ = pageRounded(std::max(bytes, kSegmentHeaderBytes));
  s.name_ = fmt::format("/{}{}-{}", kSegmentPrefix, tag, randomHex(8));
  UniqueFd fd(::shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return pathError("shm_open {} (create): {}", s.name_, errnoText(errno));
  s.owner_ = true;
  s.linked_ = true;  // from here on the destructor unlinks
  // fchmod: a umask cannot widen 0600, but say exactly what the peers will check.
  if (::fchmod(fd.get(), 0600) != 0 || ::ftruncate(fd.get(), static_cast<off_t>(s.bytes_)) != 0) {
    return pathError("sizing shared-memory segment {} to {} bytes: {}", s.name_, s.bytes_, errnoText(errno));
  }
  // posix_fallocate reserves the pages now: a full /dev/shm is an error here, not a SIGBUS
  // in the middle of a collective.
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(s.bytes_)); err != 0) {
    return pathError("reserving {} bytes of /dev/shm for {}: {} (is /dev/shm large enough? a container's "
                     "default is 64 MiB)",
                     s.bytes_, s.name_, errnoText(err));
  }
  void* p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return pathError("mapping shared-memory segment {}: {}", s.name_, errnoText(errno));
  s.base_ = static_cast<std::uint8_t*>(p);
  auto* h = reinterpret_cast<SegmentHeader*>(s.base_);
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->ownerPid = static_cast<std::int32_t>(::getpid());
  h->bytes = s.bytes_;
  randomBytes(h->token);
  return s;
}

Result<ShmSegment> ShmSegment::open(const SegmentOffer& offer) {
  UniqueFd fd(::shm_open(offer.name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0));
  if (fd.get() < 0) return peerError("shm_open {}: {}", offer.name, errnoText(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return peerError("fstat {}: {}", offer.name, errnoText(errno));
  if (st.st_uid != ::geteuid()) {
    return peerError("refused shared-memory segment {}: it belongs to uid {}, not this job's uid {}", offer.name,
                     st.st_uid, ::geteuid());
  }
  if ((st.st_mode & 07777) != 0600) {
    return peerError("refused shared-memory segment {}: mode {:o}, not 600", offer.name, st.st_mode & 07777);
  }
  if (static_cast<std::uint64_t>(st.st_size) != offer.bytes) {
    return peerError("refused shared-memory segment {}: {} bytes, announced {}", offer.name, st.st_size,
                     offer.bytes);
  }
  ShmSegment s;
  s.name_ = offer.name;
  s.bytes_ = static_cast<std::size_t>(offer.bytes);
  void* p = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return peerError("mapping shared-memory segment {}: {}", offer.name, errnoText(errno));
  s.base_ = static_cast<std::uint8_t*>(p);
  const SegmentHeader& h = s.header();
  if (h.magic != kSegmentMagic || h.version != kSegmentVersion) {
    return peerError("refused shared-memory segment {}: not a version-{} Meridian segment", offer.name,
                     kSegmentVersion);
  }
  if (h.bytes != offer.bytes || h.ownerPid != offer.ownerPid) {
    return peerError("refused shared-memory segment {}: its header says {} bytes of pid {}, the offer {} of {}",
                     offer.name, h.bytes, h.ownerPid, offer.bytes, offer.ownerPid);
  }
  // Constant time is not needed (the token is no secret once the segment is readable), but
  // a byte-wise compare of fixed length costs nothing.
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < h.token.size(); ++i) diff = static_cast<std::uint8_t>(diff | (h.token[i] ^ offer.token[i]));
  if (diff != 0) return peerError("refused shared-memory segment {}: its token is not the one offered", offer.name);
  return s;
}

ShmSegment::~ShmSegment() {
  if (owner_) unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : name_(std::move(o.name_)),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      owner_(std::exchange(o.owner_, false)),
      linked_(std::exchange(o.linked_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    new (this) ShmSegment(std::move(o));
  }
  return *this;
}

SegmentOffer ShmSegment::offer() const {
  SegmentOffer o;
  o.name = name_;
  o.bytes = bytes_;
  o.ownerPid = header().ownerPid;
  o.token = header().token;
  return o;
}

void ShmSegment::unlink() {
  if (!owner_ || !linked_) return;
  linked_ = false;
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    MLOG_WARN(kTransport, "shm_unlink {}: {}", name_, errnoText(errno));
  }
}

void removeStaleSegmentsOnce() {
  static std::once_flag sweep;
  std::call_once(sweep, [] { (void)removeStaleSegments(); });
}

int removeStaleSegments(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d.get())) {
    const std::string_view name(e->d_name);
    if (name.substr(0, kSegmentPrefix.size()) != kSegmentPrefix) continue;
    const std::string path = dir + "/" + std::string(name);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (fd.get() < 0) continue;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
        st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
      continue;
    }
    SegmentHeader h{};
    if (::pread(fd.get(), &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)) || h.magic != kSegmentMagic) continue;
    if (processAlive(h.ownerPid)) continue;
    if (::unlink(path.c_str()) == 0) {
      ++removed;
      MLOG_INFO(kTransport, "removed {}: a shared-memory segment left by process {}, which is gone", path, h.ownerPid);
    }
  }
  return removed;
}

}  // namespace meridian::transport::shm
