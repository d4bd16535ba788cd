// RegistrationCache: registered memory ranges of one device, so that registering a range that
// lies inside one registered before costs no new registration (NCCL registers the same
// buffers, and sub-ranges of them, over and over). A backend whose remote reads need
// registration (RDMA's memory regions, the memory backend) keeps one; the registration itself
// is the backend's callback.
//
// Invalidation is the caller's contract: deregister a range before freeing its memory (the
// cache cannot see frees; a stale entry would hand out a key for memory that moved).
//
// Threads: not thread-safe; the owning device serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>

#include "core/status.h"

namespace meridian::transport {

class RegistrationCache {
 public:
  struct Entry {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    std::uint64_t key = 0;
    int users = 0;  // registerRange calls not yet matched by release
  };
  // Registers a range with the backend: returns its key, or an error.
  using RegisterFn = std::function<Result<std::uint64_t>(std::uintptr_t base, std::size_t bytes)>;
  // Undoes one registration of the backend.
  using DeregisterFn = std::function<void(std::uint64_t key)>;

  RegistrationCache(RegisterFn reg, DeregisterFn dereg) : register_(std::move(reg)), deregister_(std::move(dereg)) {}
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // The entry covering [base, base+bytes): an existing one that contains it (a hit, no
  // backend call), else a new registration. invalidArgument for an empty or wrapping range.
  Result<Entry> acquire(const void* base, std::size_t bytes);
  // One user of the entry with `key` is done; the last one deregisters it.
  // invalidArgument when no entry has that key.
  Status release(std::uint64_t key);
  // The entry with `key` when it covers [address, address+bytes) (what a remote read of that
  // range may use), else nullptr.
  const Entry* find(std::uint64_t key, std::uintptr_t address, std::size_t bytes) const;
  // A registered entry that covers [base, base+bytes), without becoming one of its users (a
  // sender asking whether a buffer may go out in place), else nullptr.
  const Entry* covering(const void* base, std::size_t bytes) const;

  std::size_t size() const { return byBase_.size(); }
  std::uint64_t registrations() const { return registrations_; }  // backend calls so far

 private:
  RegisterFn register_;
  DeregisterFn deregister_;
  // Entries may overlap (a larger range registered after a smaller one at the same start).
  std::multimap<std::uintptr_t, Entry> byBase_;
  std::map<std::uint64_t, std::multimap<std::uintptr_t, Entry>::iterator> byKey_;
  std::uint64_t registrations_ = 0;
  std::size_t largestBytes_ = 0;  // of any entry ever registered (bounds coveringEntry's walk)

  Entry* coveringEntry(std::uintptr_t start, std::size_t bytes) const;
};

}  // namespace meridian::transport
