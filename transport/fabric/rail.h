// Rail: one libfabric reliable-datagram endpoint (FI_EP_RDM, tagged messages) on one
// provider and domain: the fabric, domain, address vector, completion queue and endpoint,
// memory registration with a cache, and manual progress. A fabric path of a multipath
// channel is a tag on a rail; many peers' paths share one rail.
//
// Providers: whatever libfabric offers for RDM + FI_TAGGED: `tcp;ofi_rxm` and `shm` run on
// any Linux machine; `verbs;ofi_rxm` (InfiniBand, RoCE) and `efa` need their hardware. The
// rail asks for the strictest memory-registration mode (every FI_MR_* bit a provider may
// demand) and honours exactly the bits the provider returns; it registers every buffer it
// sends from or receives into and passes its descriptor whatever the mode, so the code that
// verbs and EFA need runs with every provider.
//
// Progress is manual: nothing moves unless someone calls progress() (a device's progress
// thread, or a waiting thread holding the device's progress lock). A provider with an fd
// wait object (tcp;ofi_rxm) lets that thread sleep in epoll (waitFd(), readyToSleep());
// others (shm, efa) must be polled.
//
// Failures: an operation that fails completes with a non-ok status (its completion queue
// error entry, decoded); an error the provider reports for no operation fails the rail
// (failure()). A peer that vanished makes tcp;ofi_rxm answer sends with "try again" for
// ever: deadlines are the caller's (the path layer's stall limit).
//
// Threads: one thread at a time (FI_THREAD_DOMAIN); the owning device serialises calls.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::transport::fabric {

// The longest endpoint name a rail accepts from a peer (shm's names run to 256 bytes; IP
// providers' are sockaddrs, 16 or 28).
inline constexpr std::size_t kMaxRailNameBytes = 256;
// Tag bits a rail needs from its provider (paths put a connection id and a kind in them).
inline constexpr int kMinTagBits = 60;

struct RailOptions {
  std::string provider;       // libfabric provider: "tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "efa"
  std::string domain;         // domain (NIC) name, as fi_info lists it ("lo", "mlx5_0"); empty: the first
  std::string sourceAddress;  // IP providers: the local IPv4 address to listen on (a plane's); empty: any
};

struct RailInfo {
  std::string provider;
  std::string domain;
  std::string fabric;
  std::uint64_t mrMode = 0;       // the FI_MR_* bits the provider demands
  std::size_t mrKeyBytes = 0;
  std::size_t injectBytes = 0;
  std::size_t maxMessageBytes = 0;
  std::size_t iovLimit = 0;
  std::size_t txDepth = 0, rxDepth = 0;
  int tagBits = 0;
  bool waitFd = false;            // the completion queue can be slept on (waitFd())
  // "local|virt_addr|allocated|prov_key|endpoint|hmem" or "none".
  static std::string mrModeText(std::uint64_t bits);
};

// An operation the rail hands to the provider. The provider owns providerContext while the
// operation is posted (libfabric's FI_CONTEXT2 mode): keep the object alive and unmoved
// until its completion arrives, or until the rail is gone.
struct RailOp;
struct RailCompletion {
  Status status;            // not ok: the operation failed (canceled ones included)
  bool canceled = false;    // cancel() took it back
  std::size_t bytes = 0;    // received bytes (receives)
  std::uint64_t tag = 0;    // the message's tag (receives)
};
class RailOpHandler {
 public:
  virtual ~RailOpHandler() = default;
  virtual void onComplete(RailOp& op, const RailCompletion& completion) = 0;
};
struct RailOp {
  alignas(void*) unsigned char providerContext[64] = {};  // fi_context2; first: libfabric's pointer is ours
  RailOpHandler* handler = nullptr;
  std::uint64_t cookie = 0;  // the handler's own
};

// A peer on a rail (an index into its address vector).
using RailPeer = std::uint64_t;

// A registered range: what sends and receives from it pass as their descriptor.
struct RailMemory {
  void* desc = nullptr;      // fi_mr_desc
  std::uint64_t key = 0;     // what a peer would name it by (fi_mr_key)
  std::uint64_t handle = 0;  // releaseMemory's argument
};

class Rail {
 public:
  // kInvalidArgument naming the cause for an unknown provider, a provider without RDM
  // tagged messages, an unknown domain or too few tag bits; kPathError when the provider
  // refuses to open what it listed.
  static Result<std::unique_ptr<Rail>> open(const RailOptions& options);
  // The providers that offer RDM endpoints with tagged messages here, by name ("shm",
  // "tcp;ofi_rxm", ...), each once.
  static std::vector<std::string> providers();
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  const RailInfo& info() const;
  // This endpoint's name for peers (fi_getname), and a printable form of a name.
  const std::vector<std::uint8_t>& name() const;
  std::string describeName(std::span<const std::uint8_t> name) const;
  // "tcp;ofi_rxm on lo at fi_sockaddr_in://127.0.0.1:40211 (mr_mode none, inject 64 B, sleeps on an fd)".
  std::string describe() const;

  // Makes a peer's name addressable. kInvalidArgument for a name this provider cannot
  // take (wrong length or form, over kMaxRailNameBytes): a name from the wire is checked
  // before libfabric sees it.
  Result<RailPeer> addPeer(std::span<const std::uint8_t> name);
  Status removePeer(RailPeer peer);

  // Registers [base, base+bytes) for sends and receives (a range inside one registered
  // before costs nothing). The caller releases it before freeing the memory.
  Result<RailMemory> registerMemory(const void* base, std::size_t bytes);
  Status releaseMemory(std::uint64_t handle);
  // The registration covering [base, base+bytes) when someone registered it, without taking
  // a share of it (the owner's release still ends it); nullopt otherwise.
  std::optional<RailMemory> registeredMemory(const void* base, std::size_t bytes) const;
  std::uint64_t registrations() const;  // provider registrations so far (cache misses)

  // Posts a tagged send of the gathered `iov` (each entry inside memory registered here,
  // `desc` one per entry). kAgain: the provider has no room now; progress() and try again.
  Status postSend(RailPeer peer, std::uint64_t tag, std::span<const iovec> iov, std::span<void* const> desc,
                  RailOp& op);
  // Posts a tagged receive of a message from anyone whose tag equals `tag` in the bits
  // `ignore` leaves (tags name connections: see fabric paths). kAgain as for sends.
  Status postRecv(std::uint64_t tag, std::uint64_t ignore, void* buffer, std::size_t bytes, void* desc, RailOp& op);
  // Takes a posted receive back: it completes with canceled (unless it completed already).
  Status cancel(RailOp& op);
  // Keeps `memory` alive until the rail is gone: what operations that may never complete
  // (a send to a vanished peer) still point into, when its owner goes first.
  void retire(std::shared_ptr<void> memory);

  // Reads up to `maxCompletions` completions and runs their handlers; returns how many.
  // A failure of the rail itself (not of an operation) is kept in failure() and logged once.
  std::size_t progress(std::size_t maxCompletions = 256);
  // The rail's own failure (ok while it works).
  const Status& failure() const;

  // The fd to sleep on until completions may be there (-1: none; poll instead).
  int waitFd() const;
  // True when sleeping on waitFd() is safe now (fi_trywait); false: call progress() first.
  bool readyToSleep();

  struct Impl;

 private:
  explicit Rail(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian::transport::fabric
