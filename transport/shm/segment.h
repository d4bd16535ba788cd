// ShmSegment: one rank's POSIX shared-memory segment, which the other ranks of its host map.
//
// Why POSIX shm (shm_open in /dev/shm) and not memfd passed over a Unix socket: the name is
// the only thing a peer needs, it travels over the job's authenticated, sealed store like
// every other set-up fact, and opening it needs no socket, no ptrace permission (which
// containers often withhold) and no extra listener that could be attacked. What named
// segments cost, a name that outlives a crash, is handled twice: every rank unlinks its
// name as soon as all its peers mapped the segment (HostArena::join), so a running job
// holds nothing in /dev/shm; and a job that died before that point leaves a segment whose
// header names a dead process, which removeStaleSegments() deletes at the next start.
//
// Security: a segment is created O_EXCL|O_NOFOLLOW, mode 0600, by the job's user, under a
// name that carries a tag derived from the job secret and the session and 64 random bits
// (nobody without the secret can predict it, so nobody can plant it first). Its header
// holds a 128-bit token that went to the peers over the authenticated store; a peer maps
// the segment only after fstat says it belongs to this user, has mode 0600 and exactly the
// announced size, and then checks magic, version, size, owner pid and token before it
// uses a byte of it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meridian::transport::shm {

inline constexpr std::uint64_t kSegmentMagic = 0x4d52534847454d31ull;  // "MRSHGEM1"
inline constexpr std::uint32_t kSegmentVersion = 1;
inline constexpr std::string_view kSegmentPrefix = "meridian-";
// The header page: identity, then the owner's flags (each on its own cache line).
inline constexpr std::size_t kSegmentHeaderBytes = 4096;

struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::int32_t ownerPid;
  std::uint64_t bytes;  // the whole segment, header included
  std::array<std::uint8_t, 16> token;
};

// What a peer needs to map a segment (sent over the authenticated store).
struct SegmentOffer {
  std::string name;  // shm_open name, "/meridian-..."
  std::uint64_t bytes = 0;
  std::int32_t ownerPid = 0;
  std::array<std::uint8_t, 16> token{};
};
std::string encodeSegmentOffer(const SegmentOffer& o);
// kPeerError naming what is wrong: a bad form, a name not under kSegmentPrefix or with a
// '/' past the first character, a size out of [kSegmentHeaderBytes, maxBytes].
Result<SegmentOffer> decodeSegmentOffer(std::string_view text, std::uint64_t maxBytes);

// The tag of a job's segment names for one session: 16 hex digits of HMAC(secret, session),
// which nobody without the job secret can predict.
std::string jobSegmentTag(std::string_view secret, std::uint64_t sessionId);

class ShmSegment {
 public:
  // Creates, sizes, touches (no page faults later) and maps a new segment of `bytes`
  // (rounded up to a page) named kSegmentPrefix + tag + random. kInvalidArgument for a tag
  // that is not [0-9a-f] or too long; kPathError (the caller goes on without shared memory)
  // when /dev/shm refuses, naming how much was asked (a container's /dev/shm is often 64 MiB).
  static Result<ShmSegment> create(std::string_view tag, std::size_t bytes);
  // Maps a peer's segment after the checks above; kPeerError naming the check that failed
  // (owner, mode, size, magic, version, pid, token) or the system call.
  static Result<ShmSegment> open(const SegmentOffer& offer);

  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  std::uint8_t* data() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  const SegmentHeader& header() const { return *reinterpret_cast<const SegmentHeader*>(base_); }
  SegmentOffer offer() const;
  // Removes the name (the mapping stays). Idempotent; only the creator's call unlinks.
  void unlink();
  bool linked() const { return linked_; }

 private:
  std::string name_;
  std::uint8_t* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool owner_ = false;
  bool linked_ = false;
};

// True while process `pid` exists and is not a zombie (kill(pid, 0) still succeeds on a
// zombie nobody reaped yet: a dead peer would look alive).
bool processAlive(std::int32_t pid);
// The same host as far as shared memory and process ids go: boot, user, and network and PID
// namespaces. Ranks with equal keys may map each other's segments and read each other.
std::string localHostKey();

// Deletes segments in `dir` (normally /dev/shm) whose name starts with kSegmentPrefix,
// owned by this user, whose header names a process that no longer exists. Returns how
// many it removed; logs each at INFO. Segments of live processes and of other users stay.
int removeStaleSegments(const std::string& dir = "/dev/shm");
// removeStaleSegments() the first time a process calls it (every user of segments calls it
// before it creates its first: the host arena, and the TCP device's shared-memory paths).
void removeStaleSegmentsOnce();

}  // namespace meridian::transport::shm
