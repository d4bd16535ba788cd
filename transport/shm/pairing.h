// Pairing a shared-memory path between two ranks of one channel. The messages travel on
// the channel's first TCP stream (frame kShmPairing), which the handshake authenticated:
// nothing of a peer is mapped before it proved the job secret and said where to look.
//
//   initiator -> responder  hello PID DOORBELL HOSTKEY     "I am here, on this host"
//   responder -> initiator  offer DOORBELL SEGMENT-OFFER   it created the pair's segment
//                        or refused REASON                  not on this host, shm off, ...
//   initiator -> responder  attached                        it mapped it (the name goes now)
//                        or refused REASON
//
// DOORBELL is the number of the sender's progress eventfd in its own process (-1: none);
// the other side takes a copy with pidfd_getfd (takePeerFd), which the kernel allows only to
// a process that could ptrace the owner: exactly who can read its memory anyway. Without it
// the path still works and the side that got none polls its rings (at most 1 ms asleep).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/fd.h"
#include "core/status.h"
#include "transport/shm/segment.h"

namespace meridian::transport::shm {

enum class PairingKind { kHello, kOffer, kAttached, kRefused };

struct PairingMessage {
  PairingKind kind = PairingKind::kRefused;
  std::int32_t pid = 0;    // hello
  int doorbell = -1;       // hello, offer
  std::string hostKey;     // hello: localHostKey()
  SegmentOffer segment;    // offer
  std::string reason;      // refused (at most kMaxReasonBytes)
};
inline constexpr std::size_t kMaxReasonBytes = 512;

std::string encodePairing(const PairingMessage& m);
// kPeerError naming what is wrong; a segment larger than maxSegmentBytes is refused.
Result<PairingMessage> decodePairing(std::span<const std::uint8_t> bytes, std::uint64_t maxSegmentBytes);

// A copy of descriptor `fd` of process `pid` (pidfd_open + pidfd_getfd); kPathError saying
// why not (an old kernel, no ptrace permission, the process gone).
Result<UniqueFd> takePeerFd(std::int32_t pid, int fd);

}  // namespace meridian::transport::shm
