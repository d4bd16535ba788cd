// FabricPath: frames of a multipath channel over a libfabric rail (see path.h).
#include "transport/fabric/path.h"

#include <cstring>
#include <stdexcept>

#include "core/clock.h"
#include "core/log.h"
#include "core/wire.h"

namespace meridian::transport::fabric {

Result<std::unique_ptr<FabricPath>> FabricPath::create(Rail& rail, RailPeer peer, std::uint64_t sendTag,
                                                       std::uint64_t recvTag, ChannelEngine& engine,
                                                       std::size_t index, FabricPathConfig config) {
  if (config.sendSlots < 1 || config.recvSlots < 1 || config.chunkBytes == 0) {
    return invalidArgument("a fabric path needs at least one send and one receive slot, and a chunk size");
  }
  const bool sealing = config.security != WireSecurity::kOff;
  const std::size_t prefix = sealing ? kSealedFramePrefixBytes : kFrameHeaderBytes;
  if (prefix + config.chunkBytes > rail.info().maxMessageBytes) {
    return invalidArgument("fabric {} carries messages of at most {} bytes; frames of {} do not fit",
                           rail.info().provider, rail.info().maxMessageBytes, prefix + config.chunkBytes);
  }
  if (sealing && config.chunkBytes > kMaxNumberedRecordBytes) {
    return invalidArgument("sealed fabric frames carry chunks of at most {} bytes, not {}", kMaxNumberedRecordBytes,
                           config.chunkBytes);
  }
  std::unique_ptr<FabricPath> p(new FabricPath(rail, peer, sendTag, recvTag, engine, index, config));
  p->prefix_ = prefix;
  if (sealing) {
    p->tx_ = std::make_unique<NumberedCipher>(config.security, NumberedCipher::Role::kSeal, config.sendKey);
    p->rx_ = std::make_unique<NumberedCipher>(config.security, NumberedCipher::Role::kOpen, config.recvKey);
  }
  const std::size_t frame = prefix + config.chunkBytes;
  const std::size_t chunkSlots = static_cast<std::size_t>(config.sendSlots);
  const std::size_t controlSlots = chunkSlots;  // one acknowledgement per chunk the peer may have in flight
  const std::size_t recvSlots = static_cast<std::size_t>(config.recvSlots);
  p->arenaBytes_ = (chunkSlots + recvSlots) * frame + controlSlots * prefix;
  p->arena_ = std::shared_ptr<std::uint8_t[]>(new std::uint8_t[p->arenaBytes_]());
  MERIDIAN_ASSIGN_OR_RETURN(p->memory_, rail.registerMemory(p->arena_.get(), p->arenaBytes_));
  p->slots_ = std::make_shared<std::vector<Slot>>(chunkSlots + controlSlots + recvSlots);
  std::uint8_t* at = p->arena_.get();
  std::size_t i = 0;
  auto carve = [&](SlotKind kind, std::size_t count, std::size_t bytes) {
    for (std::size_t k = 0; k < count; ++k, ++i) {
      Slot& s = (*p->slots_)[i];
      s.kind = kind;
      s.buffer = at;
      s.capacity = bytes;
      s.op.handler = p.get();
      s.op.cookie = i;
      at += bytes;
    }
  };
  carve(SlotKind::kChunk, chunkSlots, frame);
  carve(SlotKind::kRecv, recvSlots, frame);
  carve(SlotKind::kControl, controlSlots, prefix);
  return p;
}

FabricPath::FabricPath(Rail& rail, RailPeer peer, std::uint64_t sendTag, std::uint64_t recvTag, ChannelEngine& engine,
                       std::size_t index, FabricPathConfig config)
    : rail_(rail), peer_(peer), sendTag_(sendTag), recvTag_(recvTag), engine_(engine), index_(index), config_(config) {}

FabricPath::~FabricPath() {
  if (!slots_) return;
  for (Slot& s : *slots_) {
    if (s.posted && s.kind == SlotKind::kRecv) (void)rail_.cancel(s.op);
    s.op.handler = nullptr;  // completions from now on are nobody's
  }
  if (outstanding_ == 0) {
    if (Status st = rail_.releaseMemory(memory_.handle); !st.isOk()) {
      MLOG_WARN(kTransport, "fabric path {}: {}", index_, st.message());
    }
    return;
  }
  // The provider still holds operations (cancellations not yet reaped, sends to a peer that
  // went away): their contexts and buffers stay with the rail until it closes.
  rail_.retire(arena_);
  rail_.retire(slots_);
}

void FabricPath::fail(const Status& why) {
  if (failed_) return;
  failed_ = true;
  for (Slot& s : *slots_) {
    if (s.posted && s.kind == SlotKind::kRecv) (void)rail_.cancel(s.op);
  }
  controls_.clear();
  pendingChunk_ = nullptr;
  pendingChunkRef_ = OutChunk{};
  engine_.onPathFailed(index_, why, gotClose_);
}

void FabricPath::end(const Status& why) {
  gotClose_ = true;
  fail(why);
}

Status FabricPath::postSend(Slot& s) {
  Status st;
  if (s.inPlace != nullptr) {
    const iovec iov[2] = {{s.buffer, prefix_}, {const_cast<std::uint8_t*>(s.inPlace), s.frameBytes - prefix_}};
    void* const desc[2] = {memory_.desc, s.inPlaceDesc};
    st = rail_.postSend(peer_, sendTag_, iov, desc, s.op);
  } else {
    const iovec iov[1] = {{s.buffer, s.frameBytes}};
    void* const desc[1] = {memory_.desc};
    st = rail_.postSend(peer_, sendTag_, iov, desc, s.op);
  }
  if (st.isOk()) {
    s.posted = true;
    ++outstanding_;
  }
  return st;
}

void FabricPath::writeFrame(Slot& s, const FrameHeader& h, const OutChunk* c) {
  const FrameHeaderBytes hb = encodeFrameHeader(h);
  std::uint8_t* payload = s.buffer + prefix_;
  // Only chunks carry a payload (an acknowledgement's length field names the chunk's).
  const std::uint64_t payloadBytes = c != nullptr ? h.length : 0;
  s.frameBytes = prefix_ + payloadBytes;
  std::uint64_t number = 0;
  if (sealing()) {
    // A number is never used twice, not even for a frame written again (a chunk whose
    // in-place memory went away): a GCM nonce sealing two different texts gives the key away.
    number = nextNumber_++;
    if (number >= kMaxFrameNumber) throw std::logic_error("fabric path: frame numbers ran out");  // 2^62 frames: never
    wire::store<std::uint64_t>(s.buffer, number);
    tx_->seal(2 * number, hb, s.buffer + 8, s.buffer + 8 + kFrameHeaderBytes);
    tx_->begin(2 * number + 1, payloadBytes);
  } else {
    std::memcpy(s.buffer, hb.data(), hb.size());
  }
  for (std::uint64_t done = 0; done < payloadBytes;) {
    std::size_t n = 0;
    const std::uint8_t* p = engine_.chunkPayload(*c, done, &n);
    std::uint8_t* out = s.inPlace != nullptr ? nullptr : payload + done;
    if (sealing()) {
      tx_->update(p, out, n);  // authenticate in place: the tag of the bytes where they lie
    } else if (out != nullptr) {
      std::memcpy(out, p, n);
    }
    done += n;
  }
  if (sealing()) tx_->finishSeal(s.buffer + 8 + kFrameHeaderBytes + kAeadTagBytes);
}

bool FabricPath::openPayload(std::uint64_t number, std::uint8_t* in, std::uint8_t* out, std::size_t n,
                             const std::uint8_t* tag) {
  if (!sealing()) {
    if (out != nullptr && out != in && n > 0) std::memcpy(out, in, n);
    return true;
  }
  // Encrypt needs somewhere to put the clear bytes: the slot itself when the chunk has no
  // target (a duplicate), still checked so a forgery is caught.
  if (out == nullptr && config_.security == WireSecurity::kEncrypt) out = in;
  rx_->begin(2 * number + 1, n);
  rx_->update(in, out, n);
  return rx_->finishOpen(tag);
}

void FabricPath::failIntegrity(std::string_view what) {
  if (config_.integrityFailures != nullptr) config_.integrityFailures->add(1);
  const Status why = peerError(
      "integrity: a {} on fabric path {} failed its check (changed, forged or replayed on the way); the path is "
      "dropped",
      what, index_);
  MLOG_ERROR(kTransport, "{}", why.message());
  fail(why);
}

void FabricPath::repost(Slot& s) {
  Status st = rail_.postRecv(recvTag_, 0, s.buffer, s.capacity, memory_.desc, s.op);
  if (st.isOk()) {
    s.posted = true;
    ++outstanding_;
  } else if (st.code() != StatusCode::kAgain) {
    fail(st);
  }
}

void FabricPath::pump(std::int64_t nowUs) {
  if (failed_) return;
  for (Slot& s : *slots_) {
    if (s.kind == SlotKind::kRecv && !s.posted) repost(s);
    if (failed_) return;
  }
  // Acknowledgements first: their senders wait for them.
  for (Slot& s : *slots_) {
    if (controls_.empty()) break;
    if (s.kind != SlotKind::kControl || s.posted) continue;
    writeFrame(s, controls_.front(), nullptr);
    Status st = postSend(s);
    if (st.code() == StatusCode::kAgain) break;
    if (!st.isOk()) return fail(st);
    controls_.pop_front();
  }
  // After the goodbye nothing more goes out on the path.
  if (closing_) return;
  // A chunk the provider refused a moment ago goes before any new one.
  if (pendingChunk_ != nullptr) {
    Slot& s = *pendingChunk_;
    if (s.inPlace != nullptr && !rail_.registeredMemory(s.inPlace, s.frameBytes - prefix_)) {
      // Deregistered meanwhile (its message finished on another path): the copy it is then.
      s.inPlace = nullptr;
      writeFrame(s, pendingHeader_, &pendingChunkRef_);
    }
    Status st = postSend(s);
    if (st.code() == StatusCode::kAgain) return;
    if (!st.isOk()) return fail(st);
    if (s.inPlace != nullptr) sentInPlaceBytes_ += s.frameBytes - prefix_;
    engine_.onChunkWritten(index_, pendingChunkRef_, nowUs);
    pendingChunk_ = nullptr;
    pendingChunkRef_ = OutChunk{};
  }
  for (Slot& s : *slots_) {
    if (s.kind != SlotKind::kChunk || s.posted) continue;
    OutChunk c;
    if (!engine_.nextChunk(index_, &c)) break;
    FrameHeader h = engine_.chunkHeader(c);
    // A chunk the peer could read from this process itself (same-host direct reads) goes
    // with its payload here: fabric paths carry payloads, and the message's memory is there
    // until the peer acknowledges the chunk either way.
    if (h.type == FrameType::kDataRef) h.type = FrameType::kData;
    if (h.type != FrameType::kData) {
      return fail(internalError("fabric path {}: a {} frame to send; fabric paths carry payloads", index_,
                                static_cast<int>(h.type)));
    }
    s.inPlace = nullptr;
    s.inPlaceDesc = nullptr;
    // Encrypting is the copy into the slot; the other modes send registered memory in place.
    if (h.length > 0 && rail_.info().iovLimit >= 2 && config_.security != WireSecurity::kEncrypt) {
      std::size_t n = 0;
      const std::uint8_t* p = engine_.chunkPayload(c, 0, &n);
      if (n == h.length) {
        if (auto reg = rail_.registeredMemory(p, n)) {
          s.inPlace = p;
          s.inPlaceDesc = reg->desc;
        }
      }
    }
    writeFrame(s, h, &c);
    Status st = postSend(s);
    if (st.code() == StatusCode::kAgain) {
      pendingChunk_ = &s;
      pendingHeader_ = h;
      pendingChunkRef_ = std::move(c);
      return;
    }
    if (!st.isOk()) return fail(st);
    if (s.inPlace != nullptr) sentInPlaceBytes_ += h.length;
    engine_.onChunkWritten(index_, c, nowUs);
  }
}

void FabricPath::sayGoodbye() {
  if (failed_) return;
  FrameHeader close;
  close.type = FrameType::kClose;
  controls_.push_back(close);
  closing_ = true;
  pump(nowUs());
}

void FabricPath::onComplete(RailOp& op, const RailCompletion& completion) {
  Slot& s = (*slots_)[op.cookie];
  s.posted = false;
  --outstanding_;
  if (failed_) return;
  if (!completion.status.isOk()) {
    if (completion.canceled) return;
    return fail(completion.status.withContext(fmt::format("fabric path {}", index_)));
  }
  if (s.kind == SlotKind::kRecv) {
    onReceived(s, completion.bytes);
    if (!failed_) repost(s);
  }
}

void FabricPath::onReceived(Slot& s, std::size_t bytes) {
  if (bytes < prefix_) return fail(peerError("a fabric frame of {} bytes, shorter than its header", bytes));
  std::uint64_t number = 0;
  std::uint8_t clear[kFrameHeaderBytes];
  const std::uint8_t* header = s.buffer;
  if (sealing()) {
    number = wire::load<std::uint64_t>(s.buffer);
    // Records 2n and 2n+1 name frame n: beyond kMaxFrameNumber, n + 2^63 would name the
    // same records as n (a replay the window would take for new).
    if (number >= kMaxFrameNumber) return failIntegrity(fmt::format("frame numbered {} (out of range)", number));
    if (!taken_.fresh(number)) return failIntegrity(fmt::format("frame numbered {} (a replay, or too old)", number));
    if (!rx_->open(2 * number, std::span<const std::uint8_t>(s.buffer + 8, kFrameHeaderBytes), clear,
                   s.buffer + 8 + kFrameHeaderBytes)) {
      return failIntegrity("frame header");
    }
    header = clear;
  }
  const std::uint8_t* payloadTag = s.buffer + 8 + kFrameHeaderBytes + kAeadTagBytes;
  std::uint8_t* payload = s.buffer + prefix_;
  auto h = decodeFrameHeader(std::span<const std::uint8_t>(header, kFrameHeaderBytes));
  if (!h) return fail(h.status());
  // Frames without payload still carry the (empty) payload record: its tag is checked too.
  auto headerOnly = [&](const char* what) {
    if (bytes != prefix_) {
      fail(peerError("{} of {} bytes", what, bytes));
      return false;
    }
    if (!openPayload(number, payload, nullptr, 0, payloadTag)) {
      failIntegrity(what);
      return false;
    }
    if (sealing()) taken_.take(number);
    return true;
  };
  switch (h->type) {
    case FrameType::kAck: {
      if (!headerOnly("an acknowledgement")) return;
      if (Status st = engine_.onAck(h.value(), index_, nowUs()); !st.isOk()) return fail(st);
      return;
    }
    case FrameType::kClose:
      if (!headerOnly("a goodbye")) return;
      // The peer's last frame on this path (tagged messages between two endpoints arrive in
      // order): there is no end of stream to wait for, as on TCP.
      return end(pathError("the peer closed the fabric path"));
    case FrameType::kData: {
      if (bytes != prefix_ + h->length) {
        return fail(peerError("a fabric frame of {} bytes whose header says {} of payload", bytes, h->length));
      }
      auto t = engine_.onDataHeader(h.value(), index_);
      if (!t) {
        engine_.fail(t.status());
        return fail(t.status());
      }
      std::uint8_t* dst = h->length > 0 ? engine_.targetPointer(t.value(), 0) : nullptr;
      if (!openPayload(number, payload, dst, h->length, payloadTag)) return failIntegrity("chunk payload");
      if (sealing()) taken_.take(number);
      auto ack = engine_.onDataComplete(t.value(), index_);
      if (!ack) {
        engine_.fail(ack.status());
        return fail(ack.status());
      }
      controls_.push_back(ack.value());
      return;
    }
    default:
      return fail(peerError("a frame of type {} on a fabric path, which carries no remote reads",
                            static_cast<int>(h->type)));
  }
}

}  // namespace meridian::transport::fabric
