// HostArena: same-host collectives over shared memory (see host_arena.h).
#include "collectives/host_arena.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sched.h>
#include <unistd.h>

#include <thread>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "core/log.h"
#include "core/metrics.h"
#include "core/secret.h"
#include "kernels/reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MERIDIAN_CPU_RELAX() _mm_pause()
#else
#define MERIDIAN_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace meridian::collectives {

using transport::shm::SegmentHeader;
using transport::shm::SegmentOffer;
using transport::shm::ShmSegment;
using transport::shm::kSegmentHeaderBytes;

struct HostArena::Flags {
  alignas(128) std::uint32_t arrived;
  std::uint64_t arrivedAtNs;  // when `arrived` was last published (CLOCK_MONOTONIC, host-wide)
  alignas(128) std::uint32_t reduced;
  std::uint64_t reducedAtNs;
  alignas(128) std::uint32_t waiters;
  alignas(128) std::uint32_t aborted;
};

namespace {

constexpr std::size_t kFlagsOffset = 256;
static_assert(sizeof(SegmentHeader) <= kFlagsOffset);
constexpr int kSpinRounds = 4000;        // ~10-40 us of pause before sleeping
constexpr int kYieldRounds = 200;        // ranks outnumber cores: yield instead, then sleep
constexpr long kSleepSliceNs = 1'000'000;  // a sleeper looks at the deadline and the peer this often

template <typename T>
std::atomic_ref<T> at(T& word) {
  return std::atomic_ref<T>(word);
}

// The arena's figures, one set per process (every communicator's arena adds to them).
struct ArenaMetrics {
  Histogram& inputWait;
  Histogram& reducedWait;
  Gauge& sleepFirst;
  static ArenaMetrics& get() {
    static ArenaMetrics m = [] {
      auto& reg = MetricsRegistry::global();
      auto wait = [&](const char* phase) -> Histogram& {
        return reg.histogram("meridian_collectives_shm_wait_seconds",
                             "Waits for every peer's flag in a shared-memory window that found a peer not there yet: 'input' for "
                             "their inputs (skew between ranks), 'reduced' for their slices",
                             {{"phase", phase}}, exponentialBuckets(1e-6, 4, 12));
      };
      return ArenaMetrics{wait("input"), wait("reduced"),
                          reg.gauge("meridian_collectives_shm_sleep_first",
                                    "1 while shared-memory waiters sleep at once: ranks outnumber cores and yielding "
                                    "handed the core to threads that kept it (docs/transport.md)")};
    }();
    return m;
  }
};

// A publish stamp: the steady clock (CLOCK_MONOTONIC, one clock for every process of the host).
std::uint64_t stampNow() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// Op numbers wrap: "reached" is a signed distance, as TCP's sequence numbers.
bool reached(std::uint32_t flag, std::uint32_t value) { return static_cast<std::int32_t>(flag - value) >= 0; }

std::span<const std::uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace

Result<std::unique_ptr<HostArena>> HostArena::join(transport::GroupExchange& exchange, std::string_view secret,
                                                   std::uint64_t sessionId, TimePoint deadline, std::string* why) {
  const int n = exchange.size();
  const int rank = exchange.rank();
  transport::shm::removeStaleSegmentsOnce();

  // Every rank takes part in both exchanges whatever happens here, so that all reach the
  // same verdict instead of some waiting for an offer that never comes.
  std::unique_ptr<HostArena> arena(new HostArena());
  arena->rank_ = rank;
  arena->shareCores_ = static_cast<unsigned>(n) > std::max(1u, std::thread::hardware_concurrency());
  std::string mine;
  std::string reason;
  if (n < 2 || n > kMaxRanks) {
    reason = fmt::format("{} ranks (shared memory serves 2 to {})", n, kMaxRanks);
  } else {
    auto seg = ShmSegment::create(transport::shm::jobSegmentTag(secret, sessionId), kSegmentBytes);
    if (seg.isOk()) {
      mine = transport::shm::localHostKey() + "\n" + transport::shm::encodeSegmentOffer(seg->offer());
      arena->segments_.resize(static_cast<std::size_t>(n));
      arena->segments_[static_cast<std::size_t>(rank)] = std::move(seg).value();
    } else {
      reason = seg.status().message();
    }
  }
  MERIDIAN_ASSIGN_OR_RETURN(auto offers, exchange.allGather("shm-offer", bytesOf(mine), deadline));
  if (offers.size() != static_cast<std::size_t>(n)) {
    return internalError("the exchange returned {} shared-memory offers for {} ranks", offers.size(), n);
  }
  std::string mapped(static_cast<std::size_t>(n), '1');
  const std::string hostKey = transport::shm::localHostKey();
  for (int p = 0; p < n && reason.empty(); ++p) {
    if (p == rank) continue;
    const std::string_view o(reinterpret_cast<const char*>(offers[p].data()), offers[p].size());
    const std::size_t nl = o.find('\n');
    if (o.empty() || nl == std::string_view::npos) {
      reason = fmt::format("rank {} has no shared-memory segment", p);
    } else if (o.substr(0, nl) != hostKey) {
      reason = fmt::format("rank {} runs on another host (or in other namespaces)", p);
    } else {
      auto decoded = transport::shm::decodeSegmentOffer(o.substr(nl + 1), kSegmentBytes + 65536);
      if (!decoded.isOk()) {
        // Said in the verdict, not returned: every rank must reach the second exchange.
        reason = fmt::format("rank {}: {}", p, decoded.status().message());
        continue;
      }
      const SegmentOffer& offer = decoded.value();
      if (offer.bytes != arena->segments_[static_cast<std::size_t>(rank)].bytes()) {
        reason = fmt::format("rank {} offers a segment of {} bytes, this build uses {}", p, offer.bytes,
                             arena->segments_[static_cast<std::size_t>(rank)].bytes());
        continue;
      }
      auto seg = ShmSegment::open(offer);
      if (!seg.isOk()) {
        reason = fmt::format("rank {}: {}", p, seg.status().message());
        continue;
      }
      arena->segments_[static_cast<std::size_t>(p)] = std::move(seg).value();
    }
  }
  if (!reason.empty()) mapped.assign(static_cast<std::size_t>(n), '0');
  MERIDIAN_ASSIGN_OR_RETURN(auto masks, exchange.allGather("shm-mapped", bytesOf(mapped), deadline));
  // Every rank has finished opening: the names are no longer needed by anyone.
  if (!arena->segments_.empty()) arena->segments_[static_cast<std::size_t>(rank)].unlink();
  for (int p = 0; p < n && reason.empty(); ++p) {
    const auto& m = masks[static_cast<std::size_t>(p)];
    if (m.size() != static_cast<std::size_t>(n) || std::count(m.begin(), m.end(), '1') != n) {
      reason = fmt::format("rank {} could not map every segment", p);
    }
  }
  if (!reason.empty()) {
    if (why != nullptr) *why = reason;
    return std::unique_ptr<HostArena>();
  }
  return arena;
}

HostArena::~HostArena() = default;

HostArena::Flags& HostArena::flags(int r) const {
  return *reinterpret_cast<Flags*>(segments_[static_cast<std::size_t>(r)].data() + kFlagsOffset);
}

std::uint8_t* HostArena::input(int r, std::uint32_t op) const {
  return segments_[static_cast<std::size_t>(r)].data() + kSegmentHeaderBytes + (op & 1) * kWindowBytes;
}

std::uint8_t* HostArena::result(int r, std::uint32_t op) const {
  return segments_[static_cast<std::size_t>(r)].data() + kSegmentHeaderBytes + (2 + (op & 1)) * kWindowBytes;
}

std::uint64_t& HostArena::stampOf(Flags& f, std::uint32_t Flags::*which) {
  return which == &Flags::arrived ? f.arrivedAtNs : f.reducedAtNs;
}

void HostArena::publish(std::uint32_t Flags::*which, std::uint32_t value) {
  Flags& f = flags(rank_);
  // Only waiters that share cores read the stamp (ShareCoresWait); the same on every rank.
  if (shareCores_) at(stampOf(f, which)).store(stampNow(), std::memory_order_relaxed);
  at(f.*which).store(value, std::memory_order_seq_cst);
  // Dekker with the sleeper: it counts itself in `waiters` and then checks the flag; we set
  // the flag and then check `waiters` (both seq_cst), so one of us sees the other.
  if (at(f.waiters).load(std::memory_order_seq_cst) != 0) {
    ::syscall(SYS_futex, &(f.*which), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void HostArena::abort() {
  Flags& f = flags(rank_);
  at(f.aborted).store(1, std::memory_order_seq_cst);
  if (at(f.waiters).load(std::memory_order_seq_cst) != 0) {
    ::syscall(SYS_futex, &f.arrived, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    ::syscall(SYS_futex, &f.reduced, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

Status HostArena::waitOne(int peer, std::uint32_t Flags::*which, std::uint32_t value, TimePoint deadline,
                          const char* what) {
  Flags& f = flags(peer);
  std::uint32_t& word = f.*which;
  const std::int32_t pid = segments_[static_cast<std::size_t>(peer)].header().ownerPid;
  auto left = [&]() -> Status {
    if (at(flags(rank_).aborted).load(std::memory_order_acquire) != 0) {
      return commError("this rank left the shared-memory group (its communicator broke) during op {}", value);
    }
    if (at(f.aborted).load(std::memory_order_acquire) != 0) {
      return peerError("rank {} (pid {}) left the shared-memory group (its communicator broke) before its {} for "
                       "op {}",
                       peer, pid, what, value);
    }
    return Status::ok();
  };
  if (shareCores_) {
    // More ranks than cores: the peer we wait for may need this very core to get there.
    // Yield while yielding pays (ShareCoresWait).
    const bool sleepFirst = shareCoresWait_.sleepFirst();
    for (int i = 0; !sleepFirst && i < kYieldRounds; ++i) {
      if (reached(at(word).load(std::memory_order_acquire), value)) {
        if (i > 0) {
          // A stamp past `now`: the peer published again meanwhile; it was not late.
          const std::uint64_t stamp = at(stampOf(f, which)).load(std::memory_order_relaxed), now = stampNow();
          shareCoresWait_.saw(now > stamp ? now - stamp : 0);
        }
        return Status::ok();
      }
      ::sched_yield();
    }
  } else {
    for (int i = 0; i < kSpinRounds; ++i) {
      if (reached(at(word).load(std::memory_order_acquire), value)) return Status::ok();
      MERIDIAN_CPU_RELAX();
    }
  }
  // The flag first: a peer that published and then left (it finished and closed) did its part.
  if (reached(at(word).load(std::memory_order_acquire), value)) return Status::ok();
  MERIDIAN_RETURN_IF_ERROR(left());
  for (;;) {
    at(f.waiters).fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = at(word).load(std::memory_order_seq_cst);
    if (!reached(seen, value)) {
      const timespec slice{0, kSleepSliceNs};
      ::syscall(SYS_futex, &word, FUTEX_WAIT, seen, &slice, nullptr, 0);
    }
    at(f.waiters).fetch_sub(1, std::memory_order_seq_cst);
    if (reached(at(word).load(std::memory_order_acquire), value)) return Status::ok();
    MERIDIAN_RETURN_IF_ERROR(left());
    if (!transport::shm::processAlive(pid)) {
      return peerError("rank {} (pid {}) died before its {} for shared-memory op {}", peer, pid, what, value);
    }
    if (Clock::now() >= deadline) {
      return timeoutError("rank {} (pid {}) did not publish its {} for shared-memory op {} before the deadline", peer,
                          pid, what, value);
    }
  }
}

Status HostArena::waitAll(std::uint32_t Flags::*which, std::uint32_t value, TimePoint deadline, const char* what) {
  // The clock and the metrics only for a wait that found a peer not there yet: an allreduce
  // of a few bytes takes a fraction of a microsecond, and nothing was waited for then.
  std::optional<TimePoint> start;
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    if (!start && !reached(at(flags(p).*which).load(std::memory_order_acquire), value)) start = Clock::now();
    MERIDIAN_RETURN_IF_ERROR(waitOne(p, which, value, deadline, what));
  }
  if (start) {
    ArenaMetrics& m = ArenaMetrics::get();
    (which == &Flags::arrived ? m.inputWait : m.reducedWait)
        .observe(std::chrono::duration<double>(Clock::now() - *start).count());
    const bool sleeping = shareCoresWait_.lateShare() > ShareCoresWait::kShareToSleep;
    if (shareCores_ && sleeping != sleepFirstShown_) {
      sleepFirstShown_ = sleeping;
      m.sleepFirst.set(sleeping ? 1 : 0);
    }
  }
  return Status::ok();
}

Status HostArena::fail(Status st) {
  broken_ = st;
  return st;
}

Status HostArena::barrier(TimePoint deadline) {
  if (!broken_.isOk()) return broken_;
  const std::uint32_t op = ++op_;
  publish(&Flags::arrived, op);
  if (Status st = waitAll(&Flags::arrived, op, deadline, "arrival"); !st.isOk()) return fail(st);
  publish(&Flags::reduced, op);  // in step, as in allreduce's small windows
  return Status::ok();
}

Status HostArena::allreduce(const void* send, void* recv, std::size_t count, kernels::DataType dtype,
                            kernels::ReduceOp op, TimePoint deadline) {
  if (!broken_.isOk()) return broken_;
  const std::size_t elem = kernels::dataTypeSize(dtype);
  const int n = size();
  const std::size_t windowElems = kWindowBytes / elem;
  const auto* in = static_cast<const std::uint8_t*>(send);
  auto* out = static_cast<std::uint8_t*>(recv);
  for (std::size_t done = 0; done < count;) {
    const std::size_t elems = std::min(windowElems, count - done);
    const std::size_t bytes = elems * elem;
    const std::uint32_t s = ++op_;
    std::memcpy(input(rank_, s), in + done * elem, bytes);
    publish(&Flags::arrived, s);
    if (Status st = waitAll(&Flags::arrived, s, deadline, "input"); !st.isOk()) return fail(st);
    std::uint8_t* dst = out + done * elem;
    if (bytes <= kEveryoneReducesBytes) {
      // In rank order, so every rank gets the same bits.
      kernels::reduce(dst, input(0, s), input(1, s), elems, dtype, op);
      for (int p = 2; p < n; ++p) kernels::reduceInto(dst, input(p, s), elems, dtype, op);
      // Unused by this op, but kept in step: op numbers wrap, and a flag 2^31 ops behind
      // would read as ahead (reached() is a signed distance).
      publish(&Flags::reduced, s);
    } else {
      // My slice: elements [lo, hi) of the window, reduced out of every rank's input.
      const std::size_t per = elems / static_cast<std::size_t>(n), extra = elems % static_cast<std::size_t>(n);
      auto lo = [&](int r) { return static_cast<std::size_t>(r) * per + std::min<std::size_t>(r, extra); };
      const std::size_t mineLo = lo(rank_), mineElems = lo(rank_ + 1) - mineLo;
      if (mineElems > 0) {
        std::uint8_t* res = result(rank_, s) + mineLo * elem;
        kernels::reduce(res, input(0, s) + mineLo * elem, input(1, s) + mineLo * elem, mineElems, dtype, op);
        for (int p = 2; p < n; ++p) kernels::reduceInto(res, input(p, s) + mineLo * elem, mineElems, dtype, op);
      }
      publish(&Flags::reduced, s);
      if (Status st = waitAll(&Flags::reduced, s, deadline, "reduced slice"); !st.isOk()) return fail(st);
      for (int p = 0; p < n; ++p) {
        const std::size_t pLo = lo(p), pElems = lo(p + 1) - pLo;
        if (pElems > 0) std::memcpy(dst + pLo * elem, result(p, s) + pLo * elem, pElems * elem);
      }
    }
    done += elems;
  }
  return Status::ok();
}

}  // namespace meridian::collectives
