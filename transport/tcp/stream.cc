// The TCP device's streams: framing chunks and acks on the wire, direct reads, kernel figures.
#include "transport/tcp/device_impl.h"

namespace meridian::transport::tcp {

void TcpDevice::Impl::attachStream(ChannelEntry& e, UniqueFd fd, std::size_t path) {
  auto s = std::make_unique<Stream>();
  Status usable = tuneDataSocket(fd.get(), options.tcp.socketBufferBytes);
  if (usable.isOk()) usable = setNonBlocking(fd.get(), true);
  s->fd = std::move(fd);
  s->path = path;
  limitUnsent(*s, 0);  // the floor until the first TCP_INFO reading gives a rate
  s->entry = &e;
  s->rbuf = std::make_unique<std::uint8_t[]>(kReadBufferBytes);
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

void TcpDevice::Impl::readStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
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
      std::size_t want = kReadBufferBytes;
      bool direct = false;
      if (s.inPayload) {
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
        takeRailNames(e, s.namesIn);
        s.namesIn = {};
        continue;
      }
      if (s.refPending) {
        if (!s.takeBuffered(s.refIn, &s.refGot, kRemoteRefBytes)) break;
        s.refPending = false;
        if (!readDirectChunk(s)) return;
      } else if (!s.inPayload) {
        if (!s.takeBuffered(s.header, &s.headerGot, kFrameHeaderBytes)) break;
        s.headerGot = 0;
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
        if (h->type == FrameType::kPathNames) {
          if (s.path >= e.directPaths) {
            // Relay streams run through a third rank: names come only on a direct path.
            Status st = peerError("rank {} sent fabric rail names on relay path {}", e.peerRank, s.path);
            MLOG_ERROR(kTransport, "{}; closing the connection", st.message());
            failPath(e, s.path, st, false);
            return;
          }
          s.namesIn.assign(h->length, 0);
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
      }
      if (s.payloadGot < s.target.header.length) {
        if (s.rpos == s.rlen) break;
        std::size_t take = static_cast<std::size_t>(
            std::min<std::uint64_t>(s.target.header.length - s.payloadGot, s.rlen - s.rpos));
        if (std::uint8_t* p = ch.targetPointer(s.target, s.payloadGot)) std::memcpy(p, s.rbuf.get() + s.rpos, take);
        s.rpos += take;
        s.payloadGot += take;
        if (s.payloadGot < s.target.header.length) break;
      }
      auto ack = ch.onDataComplete(s.target, s.path);
      s.inPayload = false;
      s.target = RecvTarget{};
      if (!ack) {
        failChannel(e, s.path, ack.status());
        return;
      }
      auto bytes = encodeFrameHeader(ack.value());
      if (s.ctrlDone == s.ctrl.size()) s.ctrlSinceUs = nowUs();
      s.ctrl.insert(s.ctrl.end(), bytes.begin(), bytes.end());
      if (ack->length >= kUrgentAckChunkBytes) s.ctrlUrgent = true;
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
    const RemoteRef ref = decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes>(s.refIn));
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

void TcpDevice::Impl::flushStream(Stream& s) {
  ChannelEntry& e = *s.entry;
  ChannelEngine& ch = *e.engine;
  // A failed channel's messages were aborted, not acknowledged: finishing a half-written
  // frame (with zeros) would hand the peer bytes it has not seen. Its streams are closed
  // by progressChannels instead.
  if (ch.failed()) return;
  while (!s.dead) {
    iovec iov[3];
    int iovcnt = 0;
    if (!s.writing) {
      bool ctrlPending = s.ctrlDone < s.ctrl.size();
      if (!ctrlPending) {
        s.ctrl.clear();
        s.ctrlDone = 0;
        s.ctrlUrgent = false;
      }
      if (ch.nextChunk(s.path, &s.chunk)) {
        const FrameHeader h = ch.chunkHeader(s.chunk);
        s.chunkHeader = encodeFrameHeader(h);
        s.writing = true;
        s.written = 0;
        s.writingRef = h.type == FrameType::kDataRef;
        if (s.writingRef) s.refOut = encodeRemoteRef(ch.chunkRef(s.chunk));
        s.frameBytes = kFrameHeaderBytes + (s.writingRef ? kRemoteRefBytes : h.length);
      } else if (ctrlPending && !s.ctrlUrgent && s.ctrl.size() - s.ctrlDone < kAckBatchBytes &&
                 nowUs() - s.ctrlSinceUs < kAckDelayUs) {
        // Acks of small messages wait briefly for company (data or more acks): their
        // senders completed already (eager), and the receiver returns sooner.
        break;
      }
    }
    // Control frames go first and never inside a data frame; a data frame that has not
    // started rides in the same sendmsg (one syscall, one segment for the peer to read).
    std::size_t ctrlBytes = 0;
    if (s.ctrlDone < s.ctrl.size() && (!s.writing || s.written == 0)) {
      ctrlBytes = s.ctrl.size() - s.ctrlDone;
      iov[iovcnt++] = {s.ctrl.data() + s.ctrlDone, ctrlBytes};
    }
    if (s.writing) {
      if (s.written < kFrameHeaderBytes) {
        iov[iovcnt++] = {s.chunkHeader.data() + s.written, kFrameHeaderBytes - s.written};
      }
      std::uint64_t payloadDone = s.written > kFrameHeaderBytes ? s.written - kFrameHeaderBytes : 0;
      if (payloadDone < s.frameBytes - kFrameHeaderBytes) {
        if (s.writingRef) {
          iov[iovcnt++] = {s.refOut.data() + payloadDone, kRemoteRefBytes - payloadDone};
        } else {
          std::size_t n = 0;
          const std::uint8_t* p = ch.chunkPayload(s.chunk, payloadDone, &n);
          iov[iovcnt++] = {const_cast<std::uint8_t*>(p), n};
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
    s.ctrlDone += toCtrl;
    sent -= toCtrl;
    if (sent > 0) {
      s.written += static_cast<std::uint64_t>(sent);
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
  // Only between frames: finish pending control frames first; a data frame cut midway gets
  // no CLOSE (the peer then sees an abrupt end, which is the truth).
  if (s.writing && s.written > 0) return;
  FrameHeader close;
  close.type = FrameType::kClose;
  auto bytes = encodeFrameHeader(close);
  s.ctrl.insert(s.ctrl.end(), bytes.begin(), bytes.end());
  // Best effort: a peer that does not take it in 200 ms sees the close as abrupt.
  if (Status st = sendAll(s.fd.get(), s.ctrl.data() + s.ctrlDone, s.ctrl.size() - s.ctrlDone,
                          Clock::now() + std::chrono::milliseconds(200));
      !st.isOk()) {
    MLOG_DEBUG(kTransport, "goodbye to rank {} on path {} not sent: {}", s.entry->peerRank, s.path, st.message());
  }
}

}  // namespace meridian::transport::tcp
