#include "transport/shm/ring.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/wire.h"

namespace meridian::transport::shm {
namespace {

constexpr std::size_t alignUp(std::size_t n) { return (n + kRingAlign - 1) & ~(kRingAlign - 1); }

void checkGeometry(const std::uint8_t* memory, std::size_t capacity) {
  if (memory == nullptr || capacity < 4096 || (capacity & (capacity - 1)) != 0 ||
      reinterpret_cast<std::uintptr_t>(memory) % kRingAlign != 0) {
    throw std::invalid_argument("shm ring: memory must be 64-byte aligned and the capacity a power of two >= 4096");
  }
}

// The sleep protocol's flag operations (ring.h, "Sleeping").
// Raise the flag, then a full fence before the caller looks again.
void raise(std::atomic<std::uint32_t>& flag) {
  flag.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
// Lowered by its owner only, once awake (a store only when it is up: the line stays shared).
void lower(std::atomic<std::uint32_t>& flag) {
  if (flag.load(std::memory_order_relaxed) != 0) flag.store(0, std::memory_order_relaxed);
}
// The other side, after it published: a full fence, then the look.
bool isUp(const std::atomic<std::uint32_t>& flag) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return flag.load(std::memory_order_relaxed) != 0;
}

}  // namespace

RingWriter::RingWriter(std::uint8_t* memory, std::size_t capacity)
    : control_(std::launder(reinterpret_cast<RingControl*>(memory))),
      data_(memory + kRingControlBytes),
      capacity_(capacity) {
  checkGeometry(memory, capacity);
}

Result<std::uint8_t*> RingWriter::reserve(std::size_t min, std::size_t want, std::size_t* granted) {
  if (min > maxContent()) return internalError("shm ring: a record of {} bytes; at most {} fit", min, maxContent());
  const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
  if (tail > head_ || head_ - tail > capacity_ || tail % kRingAlign != 0) {
    return peerError("shm ring: the peer's read position {} is impossible (written up to {})", tail, head_);
  }
  std::size_t free = freeBytes(tail);
  std::size_t pos = static_cast<std::size_t>(head_ & (capacity_ - 1));
  std::size_t toEnd = capacity_ - pos;
  const std::size_t need = alignUp(kRecordHeaderBytes + min);
  if (toEnd < need) {
    // The record does not fit before the end: a pad fills the rest and it starts over at 0.
    if (free < toEnd + need) return static_cast<std::uint8_t*>(nullptr);
    wire::store<std::uint32_t>(data_ + pos, static_cast<std::uint32_t>(toEnd - kRecordHeaderBytes));
    wire::store<std::uint32_t>(data_ + pos + 4, static_cast<std::uint32_t>(RecordKind::kPad));
    head_ += toEnd;
    control_->head.store(head_, std::memory_order_release);
    free -= toEnd;
    pos = 0;
    toEnd = capacity_;
  }
  const std::size_t room = std::min(free, toEnd);
  if (room < need) return static_cast<std::uint8_t*>(nullptr);
  *granted = std::min({want, maxContent(), room - kRecordHeaderBytes});
  reservedAt_ = pos;
  return data_ + pos + kRecordHeaderBytes;
}

void RingWriter::commit(RecordKind kind, std::size_t bytes) {
  std::uint8_t* at = data_ + reservedAt_;
  wire::store<std::uint32_t>(at, static_cast<std::uint32_t>(bytes));
  wire::store<std::uint32_t>(at + 4, static_cast<std::uint32_t>(kind));
  head_ += alignUp(kRecordHeaderBytes + bytes);
  control_->head.store(head_, std::memory_order_release);
}

bool RingWriter::sleepUnlessRoom(std::size_t min) {
  raise(control_->producerSleeping);
  const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
  if (tail > head_ || head_ - tail > capacity_) return true;  // impossible: the next reserve() says so
  return freeBytes(tail) >= 2 * alignUp(kRecordHeaderBytes + min);
}

void RingWriter::awake() { lower(control_->producerSleeping); }

bool RingWriter::consumerNeedsWaking() { return isUp(control_->consumerSleeping); }

void RingWriter::announceDoorbell(bool canRing) {
  control_->producerRings.store(canRing ? 1 : 0, std::memory_order_release);
}

RingReader::RingReader(std::uint8_t* memory, std::size_t capacity)
    : control_(std::launder(reinterpret_cast<RingControl*>(memory))),
      data_(memory + kRingControlBytes),
      capacity_(capacity) {
  checkGeometry(memory, capacity);
}

Result<bool> RingReader::next(Record* out) {
  if (taking_ != 0) return internalError("shm ring: next() before the last record was released");
  while (true) {
    const std::uint64_t head = control_->head.load(std::memory_order_acquire);
    if (head < tail_ || head - tail_ > capacity_) {
      return peerError("shm ring: the peer's write position {} is impossible (read up to {})", head, tail_);
    }
    if (head == tail_) return false;
    const std::size_t pos = static_cast<std::size_t>(tail_ & (capacity_ - 1));
    // Copied out once: the peer may change the bytes while we look at them.
    const std::uint32_t bytes = wire::load<std::uint32_t>(data_ + pos);
    const std::uint32_t kind = wire::load<std::uint32_t>(data_ + pos + 4);
    const std::size_t toEnd = capacity_ - pos;
    if (bytes > toEnd - kRecordHeaderBytes) {
      return peerError("shm ring: a record of {} bytes at {} runs past the ring's end", bytes, pos);
    }
    const std::size_t size = alignUp(kRecordHeaderBytes + bytes);
    if (size > head - tail_) return peerError("shm ring: a record of {} bytes past what was published", bytes);
    if (kind == static_cast<std::uint32_t>(RecordKind::kPad)) {
      if (size != toEnd) return peerError("shm ring: a pad of {} bytes that does not reach the end", bytes);
      tail_ += size;
      control_->tail.store(tail_, std::memory_order_release);
      continue;
    }
    if (kind != static_cast<std::uint32_t>(RecordKind::kFrame) && kind != static_cast<std::uint32_t>(RecordKind::kPiece)) {
      return peerError("shm ring: a record of unknown kind {}", kind);
    }
    out->kind = static_cast<RecordKind>(kind);
    out->content = std::span<std::uint8_t>(data_ + pos + kRecordHeaderBytes, bytes);
    taking_ = tail_ + size;
    return true;
  }
}

void RingReader::release() {
  if (taking_ == 0) return;
  tail_ = taking_;
  taking_ = 0;
  control_->tail.store(tail_, std::memory_order_release);
}

bool RingReader::producerRings() const { return control_->producerRings.load(std::memory_order_acquire) == 1; }

bool RingReader::pending() const { return control_->head.load(std::memory_order_acquire) != tail_; }

bool RingReader::sleepUnlessPending() {
  raise(control_->consumerSleeping);
  return pending();
}

void RingReader::awake() { lower(control_->consumerSleeping); }

bool RingReader::producerNeedsWaking() { return isUp(control_->producerSleeping); }

}  // namespace meridian::transport::shm
