#include "transport/shm/path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/clock.h"
#include "core/log.h"

namespace meridian::transport::shm {
namespace {

// Records read per pump at most, so one busy peer cannot hold the progress thread.
constexpr std::size_t kReadBudget = 256;
// Room that lets the writer go on: a frame header and a reference.
constexpr std::size_t kMinRoom = kFrameHeaderBytes + kRemoteRefBytes;

}  // namespace

std::size_t ringCapacityOf(std::size_t bytes) {
  if (bytes < pathSegmentBytes(kMinPathRingBytes)) return 0;
  std::size_t cap = kMinPathRingBytes;
  while (cap < kMaxPathRingBytes && pathSegmentBytes(2 * cap) <= bytes) cap *= 2;
  return cap;
}

ShmPath::ShmPath(ShmSegment segment, bool creator, ChannelEngine& engine, ShmPathConfig config)
    : segment_(std::move(segment)), engine_(engine), config_(std::move(config)) {
  const std::size_t ring = ringBytes(config_.ringCapacity);
  if (segment_.bytes() < pathSegmentBytes(config_.ringCapacity)) {
    throw std::invalid_argument("shm path: the segment is smaller than its two rings");
  }
  std::uint8_t* first = segment_.data() + kSegmentHeaderBytes;
  std::uint8_t* second = first + ring;
  tx_ = RingWriter(creator ? first : second, config_.ringCapacity);
  rx_ = RingReader(creator ? second : first, config_.ringCapacity);
  tx_.announceDoorbell(config_.peerDoorbell.get() >= 0);
}

void ShmPath::fail(const Status& why) { stop(why, /*graceful=*/false); }

void ShmPath::end(const Status& why) { stop(why, /*graceful=*/true); }

void ShmPath::stop(const Status& why, bool graceful) {
  if (failed_) return;
  failed_ = true;
  controls_.clear();
  writing_ = false;
  chunk_ = OutChunk{};
  reading_ = false;
  target_ = RecvTarget{};
  engine_.onPathFailed(config_.index, why, graceful);
}

void ShmPath::failPeer(const Status& why) {
  MLOG_ERROR(kTransport, "shared-memory path {}: {}; the path is dropped", config_.index, why.message());
  fail(why);
}

void ShmPath::ring() {
  if (config_.peerDoorbell.get() < 0) return;
  const std::uint64_t one = 1;
  // EAGAIN: the counter is full, so the peer wakes anyway.
  if (::write(config_.peerDoorbell.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
    MLOG_WARN(kTransport, "shared-memory path {}: ringing the peer: {}", config_.index, errnoText(errno));
  }
}

std::size_t ShmPath::receive(std::int64_t nowUs) {
  if (failed_) return 0;
  if (config_.peerPid > 0 && !config_.exitWatched && nowUs - lastAliveCheckUs_ >= kAliveCheckUs) {
    lastAliveCheckUs_ = nowUs;
    if (!processAlive(config_.peerPid)) {
      peerExited();
      return 0;
    }
  }
  const std::size_t n = read();
  if (n > 0 && !failed_ && rx_.producerNeedsWaking()) ring();
  return n;
}

void ShmPath::peerExited() {
  // Its last records first: after a planned close its goodbye is there, and the path ends
  // as it should (gracefully), not as a failure.
  while (!failed_ && read() == kReadBudget) {
  }
  if (!failed_) fail(peerError("the peer's process {} is gone", config_.peerPid));
}

std::size_t ShmPath::send(std::int64_t nowUs) {
  if (failed_) return 0;
  std::size_t wrote = 0;
  blocked_ = !write(nowUs, &wrote);
  // Full: ask the consumer to ring when it frees room, whichever thread sleeps next here (a
  // waiting thread may leave the work to a progress thread that went to sleep before it).
  if (blocked_ && !failed_ && tx_.sleepUnlessRoom(kMinRoom)) blocked_ = !write(nowUs, &wrote);
  if (wrote > 0 && !failed_ && tx_.consumerNeedsWaking()) ring();
  return wrote;
}

std::size_t ShmPath::pump(std::int64_t nowUs) {
  const std::size_t n = receive(nowUs);
  return n + send(nowUs);
}

void ShmPath::awake() {
  if (failed_) return;
  rx_.awake();
  tx_.awake();
}

bool ShmPath::readyToSleep() {
  if (failed_) return true;
  if (rx_.sleepUnlessPending()) return false;
  if (blocked_ && tx_.sleepUnlessRoom(kMinRoom)) return false;
  return true;
}

void ShmPath::sayGoodbye() {
  if (failed_ || closing_) return;
  FrameHeader close;
  close.type = FrameType::kClose;
  controls_.push_back(close);
  closing_ = true;
  pump(nowUs());
}

bool ShmPath::write(std::int64_t nowUs, std::size_t* moved) {
  // Control frames first: a peer's chunk waits for its acknowledgement.
  if (!writeControls(moved)) return false;
  if (closing_) return true;
  return writeChunks(nowUs, moved);
}

bool ShmPath::writeControls(std::size_t* moved) {
  while (!controls_.empty() && !failed_) {
    std::size_t granted = 0;
    auto at = tx_.reserve(kFrameHeaderBytes, kFrameHeaderBytes, &granted);
    if (!at) {
      failPeer(at.status());
      return true;
    }
    if (*at == nullptr) return false;
    const FrameHeaderBytes h = encodeFrameHeader(controls_.front());
    std::memcpy(*at, h.data(), h.size());
    tx_.commit(RecordKind::kFrame, h.size());
    controls_.pop_front();
    ++*moved;
  }
  return true;
}

bool ShmPath::writeChunks(std::int64_t nowUs, std::size_t* moved) {
  while (true) {
    if (writing_) {
      if (!writeChunkPieces()) return failed_;
      ++*moved;
      engine_.onChunkWritten(config_.index, chunk_, nowUs);
      ++unacked_;
      writing_ = false;
      chunk_ = OutChunk{};
      continue;
    }
    // Room for a header first: a chunk taken from the engine is this path's to finish.
    std::size_t granted = 0;
    auto at = tx_.reserve(kFrameHeaderBytes + kRemoteRefBytes, tx_.maxContent(), &granted);
    if (!at) {
      failPeer(at.status());
      return true;
    }
    if (*at == nullptr) return false;
    OutChunk c;
    if (!engine_.nextChunk(config_.index, &c)) return true;
    const FrameHeader h = engine_.chunkHeader(c);
    const FrameHeaderBytes hb = encodeFrameHeader(h);
    std::memcpy(*at, hb.data(), hb.size());
    std::size_t content = hb.size();
    if (h.type == FrameType::kDataRef) {
      const RemoteRefBytes ref = encodeRemoteRef(engine_.chunkRef(c));
      std::memcpy(*at + content, ref.data(), ref.size());
      tx_.commit(RecordKind::kFrame, content + ref.size());
      ++*moved;
      engine_.onChunkWritten(config_.index, c, nowUs);
      ++unacked_;
      continue;
    }
    if (h.type != FrameType::kData) {
      fail(internalError("shared-memory path {}: a frame of type {} to send", config_.index, static_cast<int>(h.type)));
      return true;
    }
    // As much of the payload as fits inline; the rest follows in pieces.
    std::uint32_t inlined = 0;
    while (inlined < h.length && content < granted) {
      std::size_t n = 0;
      const std::uint8_t* p = engine_.chunkPayload(c, inlined, &n);
      n = std::min<std::size_t>({n, granted - content, h.length - inlined});
      std::memcpy(*at + content, p, n);
      content += n;
      inlined += static_cast<std::uint32_t>(n);
    }
    tx_.commit(RecordKind::kFrame, content);
    chunk_ = std::move(c);
    chunkBytes_ = h.length;
    written_ = inlined;
    writing_ = true;
  }
}

bool ShmPath::writeChunkPieces() {
  while (written_ < chunkBytes_) {
    std::size_t granted = 0;
    auto at = tx_.reserve(1, chunkBytes_ - written_, &granted);
    if (!at) {
      failPeer(at.status());
      return false;
    }
    if (*at == nullptr) return false;
    std::size_t put = 0;
    while (put < granted) {
      std::size_t n = 0;
      const std::uint8_t* p = engine_.chunkPayload(chunk_, written_ + put, &n);
      n = std::min(n, granted - put);
      std::memcpy(*at + put, p, n);
      put += n;
    }
    tx_.commit(RecordKind::kPiece, put);
    written_ += static_cast<std::uint32_t>(put);
  }
  return true;
}

std::size_t ShmPath::read() {
  std::size_t n = 0;
  for (; n < kReadBudget && !failed_; ++n) {
    Record r;
    auto more = rx_.next(&r);
    if (!more) {
      failPeer(more.status());
      break;
    }
    if (!*more) break;
    take(r);
    rx_.release();
  }
  return n;
}

void ShmPath::take(const Record& r) {
  if (r.kind == RecordKind::kPiece) {
    if (!reading_) return failPeer(peerError("a payload piece with no chunk before it"));
    return payload(r.content);
  }
  if (r.content.size() < kFrameHeaderBytes) {
    return failPeer(peerError("a frame record of {} bytes, shorter than a header", r.content.size()));
  }
  std::uint8_t copy[kFrameHeaderBytes];
  std::memcpy(copy, r.content.data(), kFrameHeaderBytes);
  auto h = decodeFrameHeader(std::span<const std::uint8_t>(copy, kFrameHeaderBytes));
  if (!h) return failPeer(h.status());
  const auto rest = r.content.subspan(kFrameHeaderBytes);
  switch (h->type) {
    case FrameType::kAck:
      if (!rest.empty()) return failPeer(peerError("an acknowledgement with {} bytes behind it", rest.size()));
      if (Status st = engine_.onAck(h.value(), config_.index, nowUs()); !st.isOk()) return failPeer(st);
      if (unacked_ > 0) --unacked_;
      return;
    case FrameType::kClose:
      if (reading_) {
        // A close that cut a chunk short (as a TCP stream closed mid-frame): not graceful.
        reading_ = false;
        target_ = RecvTarget{};
        return fail(pathError("the peer closed the shared-memory path in the middle of a chunk"));
      }
      return end(pathError("the peer closed the shared-memory path"));
    case FrameType::kData:
      if (reading_) return failPeer(peerError("a chunk header in the middle of a chunk"));
      if (rest.size() > h->length) {
        return failPeer(peerError("a chunk of {} bytes with {} inline", h->length, rest.size()));
      }
      return beginData(h.value(), rest);
    case FrameType::kDataRef: {
      if (reading_) return failPeer(peerError("a chunk header in the middle of a chunk"));
      if (!config_.readPeer) {
        return failPeer(peerError("a chunk to read from the peer's memory, but this path does not read it"));
      }
      if (rest.size() != kRemoteRefBytes) return failPeer(peerError("a remote reference of {} bytes", rest.size()));
      std::uint8_t refBytes[kRemoteRefBytes];
      std::memcpy(refBytes, rest.data(), kRemoteRefBytes);
      const RemoteRef ref = decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes>(refBytes, kRemoteRefBytes));
      if (ref.key != 0) return failPeer(peerError("a remote-read key {:#x}; same-host reads take none", ref.key));
      FrameHeader data = h.value();
      data.type = FrameType::kData;
      auto t = engine_.onDataHeader(data, config_.index);
      if (!t) {
        engine_.fail(t.status());
        return fail(t.status());
      }
      target_ = std::move(t.value());
      // A duplicate of a finished message has no target: its sender may own the buffer again.
      if (std::uint8_t* p = engine_.targetPointer(target_, 0); p != nullptr && data.length > 0) {
        if (Status st = config_.readPeer(p, ref.address, data.length); !st.isOk()) {
          engine_.fail(st);
          return fail(st);
        }
        if (config_.directReadBytes != nullptr) config_.directReadBytes->add(data.length);
      }
      got_ = data.length;
      reading_ = true;
      return finishData();
    }
    default:
      return failPeer(peerError("a frame of type {} on a shared-memory path", static_cast<int>(h->type)));
  }
}

void ShmPath::beginData(const FrameHeader& h, std::span<const std::uint8_t> inlinePayload) {
  auto t = engine_.onDataHeader(h, config_.index);
  if (!t) {
    engine_.fail(t.status());
    return fail(t.status());
  }
  target_ = std::move(t.value());
  got_ = 0;
  reading_ = true;
  payload(inlinePayload);
}

void ShmPath::payload(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > target_.header.length - got_) {
    return failPeer(peerError("{} payload bytes past the chunk's {}", bytes.size(), target_.header.length));
  }
  if (!bytes.empty()) {
    if (std::uint8_t* dst = engine_.targetPointer(target_, got_)) std::memcpy(dst, bytes.data(), bytes.size());
    got_ += bytes.size();
  }
  if (got_ == target_.header.length) finishData();
}

void ShmPath::finishData() {
  reading_ = false;
  auto ack = engine_.onDataComplete(target_, config_.index);
  target_ = RecvTarget{};
  if (!ack) {
    engine_.fail(ack.status());
    return fail(ack.status());
  }
  controls_.push_back(ack.value());
  // The acknowledgement goes now, not after the rest of this pump's reads: its sender's
  // window waits for it (reads of large chunks take a while each).
  std::size_t wrote = 0;
  if (writeControls(&wrote) && wrote > 0 && tx_.consumerNeedsWaking()) ring();
}

}  // namespace meridian::transport::shm
