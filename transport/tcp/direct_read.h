// Same-host direct reads (Linux cross-memory attach, process_vm_readv): when two ranks
// share a host, the receiver copies a large chunk straight out of the sender's buffer,
// one copy where loopback TCP makes two (into the socket, out of it) and pays the stack
// on top. Only the chunk's address travels on the stream (a RemoteRef with key 0); the
// acknowledgement is the usual one, so the sender's buffer stays untouched until the receiver has read it.
//
// Who may read whom is settled once, at set-up: each rank offers its host key and pid
// with the address of a random cookie in its memory; a peer that finds the same host key
// test-reads the cookie, and uses direct reads only when that returns the cookie. The
// kernel allows such reads to processes of the same user that may ptrace each other (see
// ptrace(2) and Yama's ptrace_scope): exactly who could read this memory anyway.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace meridian::transport::tcp {

struct DirectReadOffer {
  std::string hostKey;  // shm::localHostKey() of the offering process
  std::int64_t pid = 0;
  std::uint64_t cookieAddress = 0;
  std::uint64_t cookie = 0;
};

// hostKey: shm::localHostKey(), the boot id, user id, and the network and PID namespaces (lab
// nodes on one machine live in separate network namespaces and must keep talking through
// their emulated links).
// This process's offer (the cookie lives for the life of the process).
DirectReadOffer localDirectReadOffer();

// "v1 <hostKey> <pid> <cookieAddress> <cookie>"; decoding bounds every field.
std::string encodeDirectReadOffer(const DirectReadOffer& offer);
Result<DirectReadOffer> decodeDirectReadOffer(std::span<const std::uint8_t> bytes);

// True when this process may read the offering one: same host key, another process, and
// a test read of its cookie returns the cookie.
bool canReadDirect(const DirectReadOffer& offer);

// Copies `bytes` bytes at `remoteAddress` in process `pid` into `dst`; a peer error when
// the kernel refuses or the range is not mapped there.
Status readDirect(std::int64_t pid, std::uint8_t* dst, std::uint64_t remoteAddress, std::size_t bytes);

}  // namespace meridian::transport::tcp
