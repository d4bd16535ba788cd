// FrameRing: one direction of a shared-memory path, a single-producer single-consumer byte
// ring in a segment both processes map (segment.h). The producer appends records, the
// consumer takes them in order; neither takes a lock or makes a system call to move bytes.
//
// Layout: a control block (RingControl, each counter on its own cache line) and a data area
// of `capacity` bytes (a power of two). A record starts on a 64-byte boundary with
//   bytes (u32) | kind (u32) | `bytes` bytes of content
// and never wraps: where the rest of the ring is too short for the next record the producer
// writes a kPad record that fills it, and goes on at the start.
//
// Trust: the peer maps the same memory and could write anything into it, even the counter
// that is ours. Each side keeps its own counter in private memory and only ever stores it to
// the shared one; what it reads of the peer's (head for the consumer, tail for the producer)
// and every record header is checked against the capacity before it is used: a bad value is
// a kPeerError, never an out-of-bounds access.
//
// Sleeping: a side that is about to block (in epoll, on its device's doorbell) raises its
// flag and looks once more; the other side, after it published records (or freed room),
// rings the sleeper's doorbell while the flag is up. Both sides pass a seq_cst fence between
// their store and their look, so one of them always sees the other. Only the sleeper takes
// its flag down, once it is up again: a ring that another thread of its process answered
// (a waiting thread's poll that read the doorbell) must not leave the sleeper unrung.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"

namespace meridian::transport::shm {

inline constexpr std::size_t kRingAlign = 64;
inline constexpr std::size_t kRecordHeaderBytes = 8;

struct RingControl {
  alignas(64) std::atomic<std::uint64_t> head;  // bytes the producer published
  alignas(64) std::atomic<std::uint64_t> tail;  // bytes the consumer is done with
  alignas(64) std::atomic<std::uint32_t> consumerSleeping;
  alignas(64) std::atomic<std::uint32_t> producerSleeping;  // waits for room
  // The producer's side holds the consumer's doorbell (it can wake it); 0: the consumer polls.
  std::atomic<std::uint32_t> producerRings;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "rings need lock-free 64-bit atomics");
inline constexpr std::size_t kRingControlBytes = sizeof(RingControl);

enum class RecordKind : std::uint32_t {
  kPad = 1,     // skip to the end of the data area
  kFrame = 2,   // a frame header (transport/frame.h), then what the frame carries inline
  kPiece = 3,   // more payload of the frame before it
};

// Bytes a ring of `capacity` takes in a segment (control block + data).
inline constexpr std::size_t ringBytes(std::size_t capacity) { return kRingControlBytes + capacity; }

class RingWriter {
 public:
  RingWriter() = default;
  // `memory` holds ringBytes(capacity) bytes, zeroed at creation; capacity a power of two,
  // at least 4 KiB.
  RingWriter(std::uint8_t* memory, std::size_t capacity);

  // Room for a record of at least `min` and at most `want` content bytes, contiguous:
  // the content's first byte and in *granted how much of it (min <= *granted <= want).
  // nullptr: not now (full); a kPeerError: the peer's counter is impossible.
  Result<std::uint8_t*> reserve(std::size_t min, std::size_t want, std::size_t* granted);
  // Publishes the reserved record with `bytes` (<= granted) content bytes.
  void commit(RecordKind kind, std::size_t bytes);
  // The largest content a record can ever hold (a quarter of the ring: records never starve).
  std::size_t maxContent() const { return capacity_ / 4 - kRecordHeaderBytes; }

  // Raise the flag, then look: true when there is room for `min` now (do not sleep).
  bool sleepUnlessRoom(std::size_t min);
  // Awake again: the flag goes down (a consumer would ring for nothing).
  void awake();
  // After commits: true while the consumer sleeps (ring its doorbell).
  bool consumerNeedsWaking();
  // Says whether this side can ring the consumer's doorbell (RingControl::producerRings).
  void announceDoorbell(bool canRing);

 private:
  std::size_t freeBytes(std::uint64_t tail) const { return capacity_ - static_cast<std::size_t>(head_ - tail); }
  RingControl* control_ = nullptr;
  std::uint8_t* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t head_ = 0;  // ours; the shared one is a copy
  std::size_t reservedAt_ = 0;
};

struct Record {
  RecordKind kind = RecordKind::kPad;
  std::span<std::uint8_t> content;
};

class RingReader {
 public:
  RingReader() = default;
  RingReader(std::uint8_t* memory, std::size_t capacity);

  // The next record (pads are skipped), or false when the ring is empty; a kPeerError for an
  // impossible head or record header. The content stays valid until release().
  Result<bool> next(Record* out);
  // Done with the record next() returned: its room goes back to the producer.
  void release();
  // Raise the flag, then look: true when a record waits (do not sleep).
  bool sleepUnlessPending();
  void awake();
  // After releases: true while the producer waits for room (ring its doorbell).
  bool producerNeedsWaking();
  // Whether the producer said it can ring this side (false: look without being rung).
  bool producerRings() const;
  bool pending() const;

 private:
  RingControl* control_ = nullptr;
  std::uint8_t* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t tail_ = 0;  // ours
  std::uint64_t taking_ = 0;  // the end of the record next() returned (0: none)
};

}  // namespace meridian::transport::shm
