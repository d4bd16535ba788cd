// The TCP device's streams: framing chunks and acks on the wire, direct reads, kernel figures.
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

void TcpDevice::Impl::attachStream(ChannelEntry& e, UniqueFd fd, std::size_t path, const SessionKeys& keys) {
  auto s = std::make_unique<Stream>();
  s->tx = std::make_unique<RecordCipher>(keys.mode, RecordCipher::Role::kSeal, keys.send);
  s->rx = std::make_unique<RecordCipher>(keys.mode, RecordCipher::Role::kOpen, keys.recv);
  s->fabricSeedOut = fabric::fabricSeed(keys.send);
  s->fabricSeedIn = fabric::fabricSeed(keys.recv);
  const bool encrypting = keys.mode == WireSecurity::kEncrypt;
  s->rcap = encrypting ? kSealedBufferBytes : kReadBufferBytes;
  if (encrypting) s->stage = std::make_unique<std::uint8_t[]>(kSealedBufferBytes);
  Status usable = tuneDataSocket(fd.get(), options.tcp.socketBufferBytes);
  if (usable.isOk()) usable = setNonBlocking(fd.get(), true);
  s->fd = std::move(fd);
  s->path = path;
  limitUnsent(*s, 0);  // the floor until the first TCP_INFO reading gives a rate
  s->entry = &e;
  s->rbuf = std::make_unique<std::uint8_t[]>(s->rcap);
  if (usable.isOk()) usable = epollSet(s->fd.get(), EPOLLIN, true);
  Stream& raw = *s;
  if (usable.isOk()) streamsByFd[s->fd.get()] = s.get();
  e.streams[path].push_back(std::move(s));
  if (!usable.isOk()) {
    // The stream counts (the peer opened it) but cannot be driven: the path fails now and
    // its chunks go to the other paths, as when a stream breaks.
    MLOG_WARN(kTransport, "stream of path {} to rank {} unusable: {}", path, e.peerRank, usable.message());
    closeStream(raw);
    failPath(e, path, pathError("path {}: {}", path, usable.message()), false);
  }
}

// ------------------------------------------------------------------ data streams

void TcpDevice::Impl::closeStream(Stream& s) {
  s.dead = true;
  epollDel(s.fd.get());
  streamsByFd.erase(s.fd.get());
  shutdownStream(s.fd.get(), SHUT_RDWR);
  s.fd.reset();
  s.target = RecvTarget{};
  s.chunk = OutChunk{};
}

void TcpDevice::Impl::failPath(ChannelEntry& e, std::size_t path, const Status& why, bool graceful) {
  for (auto& s : e.streams[path]) {
    if (!s->dead) closeStream(*s);
  }
  e.engine->onPathFailed(path, why, graceful);
  // A goodbye on a direct TCP path means the peer closes the whole channel: its fabric paths
  // end with it (a fabric path has no end of stream, and its own goodbye may be still queued).
  if (graceful && path < e.directPaths) {
    for (auto& fp : e.fabric) {
      if (fp && !fp->failed()) fp->end(why);
    }
  }
}

void TcpDevice::Impl::failIntegrity(Stream& s, std::string_view what) {
  integrityFailures->add(1);
  ChannelEntry& e = *s.entry;
  Status why = peerError("integrity: a {} record from rank {} on path {} failed its tag (changed, forged, replayed or "
                         "reordered on the way); the path is dropped",
                         what, e.peerRank, s.path);
  MLOG_ERROR(kTransport, "{}", why.message());
  failPath(e, s.path, why, false);
}

namespace {

// Opens n payload bytes of the record under way from `in` into `out` (nullptr: a chunk with
// no target, still authenticated so that the stream stays in step).
void openPayload(Stream& s, const std::uint8_t* in, std::uint8_t* out, std::size_t n) {
  if (out != nullptr || s.rx->mode() != WireSecurity::kEncrypt) {
    s.rx->update(in, out, n);
    return;
  }
  for (std::size_t done = 0; done < n;) {
    const std::size_t step = std::min(n - done, sizeof(s.drain));
    s.rx->update(in + done, s.drain, step);
    done += step;
  }
}

// Opens a whole small record held in `buf` (its tag right after its `n` bytes) in place.
bool openInPlace(Stream& s, std::uint8_t* buf, std::size_t n) {
  return s.rx->open(std::span<const std::uint8_t>(buf, n), buf, buf + n);
}

}  // namespace

void TcpDevice::Impl::readStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  const std::size_t tagBytes = s.rx->tagBytes();
  // Encrypted payloads are decrypted into place from the read buffer, never read in place.
  const bool readInPlace = s.rx->mode() != WireSecurity::kEncrypt;
  std::size_t budget = kReadBudgetBytes;
  // A read shorter than asked for emptied the socket: once its bytes are consumed, stop
  // (epoll is level-triggered and reports what arrives later) instead of paying a
  // recv that only says EAGAIN.
  bool drained = false;
  while (!s.dead && budget > 0) {
    if (s.rpos == s.rlen) {
      if (drained) return;
      s.rpos = s.rlen = 0;
      std::uint8_t* dst = s.rbuf.get();
      std::size_t want = s.rcap;
      bool direct = false;
      if (s.inPayload && readInPlace) {
        std::uint64_t remaining = s.target.header.length - s.payloadGot;
        if (remaining >= kDirectReadMinBytes) {
          std::uint8_t* p = ch.targetPointer(s.target, s.payloadGot);
          dst = p != nullptr ? p : s.drain;
          want = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, p != nullptr ? remaining : sizeof(s.drain)));
          direct = true;
        }
      }
      ssize_t n = ::recv(s.fd.get(), dst, want, 0);
      if (n == 0) {
        bool midFrame = s.inPayload || s.refPending || s.namesPending || s.headerGot > 0 || s.rpos < s.rlen;
        bool graceful = s.gotClose && !midFrame;
        failPath(e, s.path,
                 midFrame ? peerError("connection closed by rank {} in the middle of a frame (truncated)", e.peerRank)
                          : peerError("connection closed by rank {}", e.peerRank),
                 graceful);
        return;
      }
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        failPath(e, s.path, pathError("receive from rank {}: {}", e.peerRank, errnoText(errno)), false);
        return;
      }
      budget -= std::min<std::size_t>(budget, static_cast<std::size_t>(n));
      drained = static_cast<std::size_t>(n) < want;
      if (direct) {
        openPayload(s, dst, dst == s.drain ? nullptr : dst, static_cast<std::size_t>(n));
        s.payloadGot += static_cast<std::uint64_t>(n);
      } else {
        s.rlen = static_cast<std::size_t>(n);
      }
    }
    // Consume buffered bytes (and finish a chunk completed by a direct read).
    while (!s.dead) {
      if (s.namesPending) {
        if (!s.takeBuffered(s.namesIn.data(), &s.namesGot, s.namesIn.size())) break;
        s.namesPending = false;
        if (!openInPlace(s, s.namesIn.data(), s.namesIn.size() - tagBytes)) return failIntegrity(s, "rail names");
        s.namesIn.resize(s.namesIn.size() - tagBytes);
        if (s.namesShm) {
          takeShmPairing(e, s, s.namesIn);
        } else {
          takeRailNames(e, s, s.namesIn);
        }
        s.namesIn = {};
        continue;
      }
      if (s.refPending) {
        if (!s.takeBuffered(s.refIn, &s.refGot, kRemoteRefBytes + tagBytes)) break;
        s.refPending = false;
        if (!openInPlace(s, s.refIn, kRemoteRefBytes)) return failIntegrity(s, "remote reference");
        if (!readDirectChunk(s)) return;
      } else if (!s.inPayload) {
        if (!s.takeBuffered(s.header, &s.headerGot, kFrameHeaderBytes + tagBytes)) break;
        s.headerGot = 0;
        if (!openInPlace(s, s.header, kFrameHeaderBytes)) return failIntegrity(s, "frame header");
        auto h = decodeFrameHeader(std::span<const std::uint8_t>(s.header, kFrameHeaderBytes));
        if (!h) {
          MLOG_ERROR(kTransport, "bad frame from rank {} on path {}: {}; closing the connection", e.peerRank, s.path,
                     h.status().message());
          failPath(e, s.path, h.status(), false);
          return;
        }
        if (h->type == FrameType::kAck) {
          Status st = ch.onAck(h.value(), s.path, nowUs());
          if (!st.isOk()) {
            MLOG_ERROR(kTransport, "rank {}: {}; closing the connection", e.peerRank, st.message());
            failPath(e, s.path, st, false);
            return;
          }
          continue;
        }
        if (h->type == FrameType::kClose) {
          s.gotClose = true;
          continue;
        }
        if (h->type == FrameType::kPathNames || h->type == FrameType::kShmPairing) {
          if (s.path >= e.directPaths) {
            // Relay streams run through a third rank: names come only on a direct path.
            Status st = peerError("rank {} sent path set-up (rail names or shared-memory pairing) on relay path {}", e.peerRank, s.path);
            MLOG_ERROR(kTransport, "{}; closing the connection", st.message());
            failPath(e, s.path, st, false);
            return;
          }
          s.namesIn.assign(h->length + tagBytes, 0);
          s.namesShm = h->type == FrameType::kShmPairing;
          s.namesGot = 0;
          s.namesPending = true;
          continue;
        }
        if (h->type == FrameType::kDataRef) {
          if (e.readPid <= 0) {
            Status st = peerError("rank {} sent a chunk to read from its memory, but this channel does not read it",
                                  e.peerRank);
            MLOG_ERROR(kTransport, "{}; closing the connection", st.message());
            failPath(e, s.path, st, false);
            return;
          }
          s.refHeader = h.value();
          s.refHeader.type = FrameType::kData;
          s.refGot = 0;
          s.refPending = true;
          continue;
        }
        if (!beginChunk(s, h.value())) return;
        s.rx->begin(h->length);
        s.payloadRecord = true;
        s.tagGot = 0;
      }
      if (s.payloadGot < s.target.header.length) {
        if (s.rpos == s.rlen) break;
        std::size_t take = static_cast<std::size_t>(
            std::min<std::uint64_t>(s.target.header.length - s.payloadGot, s.rlen - s.rpos));
        openPayload(s, s.rbuf.get() + s.rpos, ch.targetPointer(s.target, s.payloadGot), take);
        s.rpos += take;
        s.payloadGot += take;
        if (s.payloadGot < s.target.header.length) break;
      }
      if (s.payloadRecord) {
        // Nothing of the chunk counts until its tag says the bytes are genuine.
        if (!s.takeBuffered(s.tagIn, &s.tagGot, tagBytes)) break;
        s.payloadRecord = false;
        if (!s.rx->finishOpen(s.tagIn)) return failIntegrity(s, "chunk payload");
      }
      auto ack = ch.onDataComplete(s.target, s.path);
      s.inPayload = false;
      s.target = RecvTarget{};
      if (!ack) {
        failChannel(e, s.path, ack.status());
        return;
      }
      queueControl(s, encodeFrameHeader(ack.value()), {}, ack->length >= kUrgentAckChunkBytes);
    }
  }
}

void TcpDevice::Impl::failChannel(ChannelEntry& e, std::size_t path, const Status& why) {
  MLOG_ERROR(kTransport, "rank {}: {}", e.peerRank, why.message());
  e.engine->fail(why);
  failPath(e, path, why, false);
}

bool TcpDevice::Impl::beginChunk(Stream& s, const FrameHeader& h) {
  auto t = s.entry->engine->onDataHeader(h, s.path);
  if (!t) {
    failChannel(*s.entry, s.path, t.status());
    return false;
  }
  s.target = std::move(t.value());
  s.payloadGot = 0;
  s.inPayload = true;
  return true;
}

bool TcpDevice::Impl::readDirectChunk(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  if (!beginChunk(s, s.refHeader)) return false;
  // A duplicate of a finished message has no target: its sender may own the buffer again.
  if (std::uint8_t* p = ch.targetPointer(s.target, 0); p != nullptr && s.target.header.length > 0) {
    const RemoteRef ref = decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes>(s.refIn, kRemoteRefBytes));
    Status st = ref.key == 0 ? readDirect(e.readPid, p, ref.address, s.target.header.length)
                             : peerError("rank {} sent a remote-read key {:#x}; same-host reads take none", e.peerRank,
                                         ref.key);
    if (!st.isOk()) {
      failChannel(e, s.path, st.withContext(fmt::format("chunk of message {}", s.target.header.seq)));
      return false;
    }
    directReadBytes->add(s.target.header.length);
  }
  s.payloadGot = s.target.header.length;  // the payload is in: the frame completes as a kData one would
  return true;
}

void TcpDevice::Impl::queueControl(Stream& s, std::span<const std::uint8_t> header,
                                   std::span<const std::uint8_t> payload, bool urgent) {
  if (s.ctrl.empty()) s.ctrlSinceUs = nowUs();
  for (std::span<const std::uint8_t> record : {header, payload}) {
    if (record.empty()) continue;
    s.ctrl.insert(s.ctrl.end(), record.begin(), record.end());
    s.ctrlRecords.push_back(record.size());
  }
  if (urgent) s.ctrlUrgent = true;
}

void TcpDevice::Impl::sealControl(Stream& s) {
  const std::size_t tagBytes = s.tx->tagBytes();
  std::size_t at = 0;
  for (std::size_t n : s.ctrlRecords) {
    const std::size_t out = s.wire.size();
    s.wire.resize(out + n + tagBytes);
    s.tx->seal(std::span<const std::uint8_t>(s.ctrl).subspan(at, n), s.wire.data() + out, s.wire.data() + out + n);
    at += n;
  }
  s.ctrl.clear();
  s.ctrlRecords.clear();
  s.ctrlUrgent = false;
}

void TcpDevice::Impl::startFrame(Stream& s) {
  ChannelEngine& ch = *s.entry->engine;
  const std::size_t tagBytes = s.tx->tagBytes();
  const FrameHeader h = ch.chunkHeader(s.chunk);
  const FrameHeaderBytes plain = encodeFrameHeader(h);
  s.tx->seal(plain, s.chunkHeader.data(), s.chunkHeader.data() + kFrameHeaderBytes);
  s.writing = true;
  s.written = 0;
  s.writingRef = h.type == FrameType::kDataRef;
  if (s.writingRef) {
    const RemoteRefBytes ref = encodeRemoteRef(ch.chunkRef(s.chunk));
    s.tx->seal(ref, s.refOut.data(), s.refOut.data() + kRemoteRefBytes);
    s.payloadBytes = 0;
    s.frameBytes = kFrameHeaderBytes + tagBytes + kRemoteRefBytes + tagBytes;
    return;
  }
  s.payloadBytes = h.length;
  s.tx->begin(h.length);
  s.payloadSealed = 0;
  s.tagSealed = false;
  s.stagePos = s.stageLen = 0;
  s.frameBytes = kFrameHeaderBytes + tagBytes + h.length + tagBytes;
}

void TcpDevice::Impl::flushStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  // A failed channel's messages were aborted, not acknowledged: finishing a half-written
  // frame (with zeros) would hand the peer bytes it has not seen. Its streams are closed
  // by progressChannels instead.
  if (ch.failed()) return;
  const std::size_t tagBytes = s.tx->tagBytes();
  const std::size_t headerWire = kFrameHeaderBytes + tagBytes;
  const WireSecurity mode = s.tx->mode();
  while (!s.dead) {
    iovec iov[4];
    int iovcnt = 0;
    if (!s.writing) {
      if (s.wireDone == s.wire.size()) {
        s.wire.clear();
        s.wireDone = 0;
      }
      if (ch.nextChunk(s.path, &s.chunk)) {
        // Control frames queued so far go first, sealed before the frame (records are
        // numbered in the order they go out); later ones wait for the frame's end.
        sealControl(s);
        startFrame(s);
      } else if (!s.ctrl.empty() && !s.ctrlUrgent && s.ctrl.size() < kAckBatchBytes &&
                 nowUs() - s.ctrlSinceUs < kAckDelayUs) {
        // Acks of small messages wait briefly for company (data or more acks): their
        // senders completed already (eager), and the receiver returns sooner.
        if (s.wireDone == s.wire.size()) break;
      } else {
        sealControl(s);
      }
    }
    // Sealed control frames, then the data frame under way, in one sendmsg where they fit.
    std::size_t ctrlBytes = s.wire.size() - s.wireDone;
    if (ctrlBytes > 0) iov[iovcnt++] = {s.wire.data() + s.wireDone, ctrlBytes};
    if (s.writing) {
      if (s.written < headerWire) iov[iovcnt++] = {s.chunkHeader.data() + s.written, headerWire - s.written};
      const std::uint64_t bodyDone = s.written > headerWire ? s.written - headerWire : 0;
      if (s.writingRef) {
        iov[iovcnt++] = {s.refOut.data() + bodyDone, kRemoteRefBytes + tagBytes - bodyDone};
      } else {
        const std::uint64_t payloadDone = std::min<std::uint64_t>(bodyDone, s.payloadBytes);
        if (payloadDone < s.payloadBytes) {
          if (mode == WireSecurity::kEncrypt) {
            if (s.stagePos == s.stageLen) {  // the last piece is out: seal the next
              std::size_t n = 0;
              const std::uint8_t* p = ch.chunkPayload(s.chunk, s.payloadSealed, &n);
              n = std::min(n, kSealedBufferBytes);
              s.tx->update(p, s.stage.get(), n);
              s.payloadSealed += n;
              s.stagePos = 0;
              s.stageLen = n;
            }
            iov[iovcnt++] = {s.stage.get() + s.stagePos, s.stageLen - s.stagePos};
          } else {
            std::size_t n = 0;
            const std::uint8_t* p = ch.chunkPayload(s.chunk, payloadDone, &n);
            if (s.payloadSealed < payloadDone + n) {  // authenticated where it lies, once
              s.tx->update(p + (s.payloadSealed - payloadDone), nullptr, payloadDone + n - s.payloadSealed);
              s.payloadSealed = payloadDone + n;
            }
            iov[iovcnt++] = {const_cast<std::uint8_t*>(p), n};
          }
        }
        if (s.payloadSealed == s.payloadBytes) {
          if (!s.tagSealed) {
            s.tx->finishSeal(s.tagOut);
            s.tagSealed = true;
          }
          const std::uint64_t tagDone = bodyDone > s.payloadBytes ? bodyDone - s.payloadBytes : 0;
          if (tagDone < tagBytes) iov[iovcnt++] = {s.tagOut + tagDone, tagBytes - tagDone};
        }
      }
    }
    if (iovcnt == 0) break;
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<std::size_t>(iovcnt);
    ssize_t n = ::sendmsg(s.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!s.wantOut) {
          s.wantOut = true;
          if (Status st = epollSet(s.fd.get(), EPOLLIN | EPOLLOUT, false); !st.isOk()) {
            failPath(e, s.path, pathError("stream to rank {}: {}", e.peerRank, st.message()), false);
          }
        }
        return;
      }
      failPath(e, s.path, pathError("send to rank {}: {}", e.peerRank, errnoText(errno)), false);
      return;
    }
    std::size_t sent = static_cast<std::size_t>(n);
    const std::size_t toCtrl = std::min(sent, ctrlBytes);
    s.wireDone += toCtrl;
    sent -= toCtrl;
    if (sent > 0) {
      s.written += static_cast<std::uint64_t>(sent);
      if (mode == WireSecurity::kEncrypt && !s.writingRef && s.written > headerWire) {
        const std::uint64_t payloadDone = std::min<std::uint64_t>(s.written - headerWire, s.payloadBytes);
        s.stagePos = s.stageLen - static_cast<std::size_t>(s.payloadSealed - payloadDone);
      }
      if (s.written == s.frameBytes) {
        ch.onChunkWritten(s.path, s.chunk, nowUs());
        s.writing = false;
        s.chunk = OutChunk{};
      }
    }
  }
  if (s.wantOut && !s.dead) {
    s.wantOut = false;
    if (Status st = epollSet(s.fd.get(), EPOLLIN, false); !st.isOk()) {
      failPath(e, s.path, pathError("stream to rank {}: {}", e.peerRank, st.message()), false);
    }
  }
}

void TcpDevice::Impl::readTcpInfo(ChannelEntry& e) {
  auto& reg = MetricsRegistry::global();
  e.tcpGauges.resize(e.streams.size());
  for (std::size_t p = 0; p < e.streams.size(); ++p) {
    PathTelemetry f;
    for (const auto& s : e.streams[p]) {
      if (s->dead) continue;
      tcp_info info{};
      socklen_t len = sizeof(info);
      if (::getsockopt(s->fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
      f.rttUs = std::max(f.rttUs, static_cast<double>(info.tcpi_rtt));
      f.deliveryBytesPerSec += static_cast<double>(info.tcpi_delivery_rate);
      f.unitsResent += info.tcpi_total_retrans;
      f.unitsSent += info.tcpi_segs_out;
      limitUnsent(*s, static_cast<double>(info.tcpi_delivery_rate));
    }
    if (f.rttUs < 0) continue;
    e.engine->setPathTelemetry(p, f);
    ChannelEntry::TcpGauges& g = e.tcpGauges[p];
    if (g.rttSeconds == nullptr) {
      const MetricLabels labels = e.engine->pathLabels(p);
      g.rttSeconds = &reg.gauge("meridian_transport_path_tcp_rtt_seconds",
                                "Smoothed RTT the kernel measures on a path's data streams (TCP_INFO; largest stream)",
                                labels);
      g.deliveryBytesPerSec =
          &reg.gauge("meridian_transport_path_tcp_delivery_rate_bytes_per_second",
                     "Delivery rate the kernel measures on a path's data streams (TCP_INFO; summed)", labels);
      g.retransmits = &reg.gauge("meridian_transport_path_tcp_retransmits",
                                 "Segments the kernel retransmitted on a path's data streams so far (TCP_INFO)", labels);
    }
    g.rttSeconds->set(f.rttUs * 1e-6);
    g.deliveryBytesPerSec->set(f.deliveryBytesPerSec);
    g.retransmits->set(static_cast<double>(f.unitsResent));
  }
}

void TcpDevice::Impl::limitUnsent(Stream& s, double deliveryBytesPerSec) {
  if (options.tcp.notsentLowatBytes <= 0) return;
  const double want = std::max(static_cast<double>(options.tcp.notsentLowatBytes), deliveryBytesPerSec * kNotsentHorizonSec);
  const int lowat = static_cast<int>(std::min(want, static_cast<double>(1 << 30)));
  // Only changes of 2x or more: the delivery rate moves all the time.
  if (lowat >= 2 * s.notsentLowat || 2 * lowat <= s.notsentLowat) {
    if (setNotsentLowat(s.fd.get(), lowat)) s.notsentLowat = lowat;
  }
}

void TcpDevice::Impl::sayGoodbye(Stream& s) {
  // Only between frames: a frame under way has its records numbered already, and one cut
  // midway gets no CLOSE (the peer then sees an abrupt end, which is the truth).
  if (s.writing) return;
  FrameHeader close;
  close.type = FrameType::kClose;
  queueControl(s, encodeFrameHeader(close), {}, true);
  sealControl(s);
  // Best effort: a peer that does not take it in 200 ms sees the close as abrupt.
  if (Status st = sendAll(s.fd.get(), s.wire.data() + s.wireDone, s.wire.size() - s.wireDone,
                          Clock::now() + std::chrono::milliseconds(200));
      !st.isOk()) {
    MLOG_DEBUG(kTransport, "goodbye to rank {} on path {} not sent: {}", s.entry->peerRank, s.path, st.message());
  }
}

}  // namespace meridian::transport::tcp
