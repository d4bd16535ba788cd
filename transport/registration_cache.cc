// The registration cache (registration_cache.h).
#include "transport/registration_cache.h"

#include <algorithm>
#include <limits>

namespace meridian::transport {

RegistrationCache::~RegistrationCache() {
  for (const auto& [base, e] : byBase_) deregister_(e.key);
}

Result<RegistrationCache::Entry> RegistrationCache::acquire(const void* base, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  if (bytes == 0) return invalidArgument("registering an empty range at {:#x}", start);
  if (start > std::numeric_limits<std::uintptr_t>::max() - bytes) {
    return invalidArgument("the range at {:#x} of {} bytes wraps around the address space", start, bytes);
  }
  if (Entry* e = coveringEntry(start, bytes)) {
    ++e->users;
    return *e;
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::uint64_t key, register_(start, bytes));
  ++registrations_;
  if (byKey_.count(key) != 0) {
    deregister_(key);
    return internalError("the backend handed out key {:#x} twice", key);
  }
  largestBytes_ = std::max(largestBytes_, bytes);
  auto it = byBase_.emplace(start, Entry{start, bytes, key, 1});
  byKey_[key] = it;
  return it->second;
}

Status RegistrationCache::release(std::uint64_t key) {
  auto k = byKey_.find(key);
  if (k == byKey_.end()) return invalidArgument("no registration with key {:#x}", key);
  if (--k->second->second.users > 0) return Status::ok();
  deregister_(key);
  byBase_.erase(k->second);
  byKey_.erase(k);
  return Status::ok();
}

RegistrationCache::Entry* RegistrationCache::coveringEntry(std::uintptr_t start, std::size_t bytes) const {
  // Candidates start at or below `start`, and no lower than the largest entry reaches back
  // from `start + bytes`: a lookup that finds nothing (a fabric path asking about every chunk
  // of unregistered memory) stops there instead of walking every entry.
  const std::uintptr_t end = start + bytes;
  for (auto it = byBase_.upper_bound(start); it != byBase_.begin();) {
    --it;
    if (end - it->first > largestBytes_) break;
    const Entry& e = it->second;
    if (e.base + e.bytes >= start + bytes) return const_cast<Entry*>(&e);
  }
  return nullptr;
}

const RegistrationCache::Entry* RegistrationCache::covering(const void* base, std::size_t bytes) const {
  const auto start = reinterpret_cast<std::uintptr_t>(base);
  if (bytes == 0 || start > std::numeric_limits<std::uintptr_t>::max() - bytes) return nullptr;
  return coveringEntry(start, bytes);
}

const RegistrationCache::Entry* RegistrationCache::find(std::uint64_t key, std::uintptr_t address,
                                                        std::size_t bytes) const {
  auto k = byKey_.find(key);
  if (k == byKey_.end()) return nullptr;
  const Entry& e = k->second->second;
  if (address < e.base || bytes > e.bytes || address - e.base > e.bytes - bytes) return nullptr;
  return &e;
}

}  // namespace meridian::transport
