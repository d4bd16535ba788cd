// libFuzzer target: arbitrary bytes as a peer's stream of frames, decoded and driven
// through a real MultipathChannel exactly as the TCP engine does, plus the handshake
// decoders, sealed records (stream and numbered) and the fabric rail names (PATH-NAMES payloads). Finds crashes, unbounded allocations and broken invariants in every decoder
// that reads the wire.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/aead.h"
#include "core/wire.h"
#include "transport/fabric/link.h"
#include "transport/frame.h"
#include "transport/multipath/multipath_channel.h"
#include "transport/shm/pairing.h"
#include "transport/shm/ring.h"
#include "transport/tcp/direct_read.h"
#include "transport/tcp/handshake.h"

using namespace meridian;
using namespace meridian::transport;

namespace {

void fuzzHandshake(std::span<const std::uint8_t> in) {
  if (in.size() >= tcp::kHelloBytes) (void)tcp::decodeHello(in.first(tcp::kHelloBytes));
  tcp::Transcript t(tcp::kHelloBytes, 0);
  if (in.size() >= tcp::kChallengeBytes) {
    (void)tcp::verifyChallenge("k", t, WireSecurity::kEncrypt, in.first(tcp::kChallengeBytes));
  }
  if (in.size() >= tcp::kAuthBytes) (void)tcp::verifyAuth("k", t, in.first(tcp::kAuthBytes));
  if (in.size() >= tcp::kResultBytes) (void)tcp::decodeResult("k", t, in.first(tcp::kResultBytes));
  // The server's state machine fed a client's two messages from the input.
  if (in.size() >= tcp::kHelloBytes + tcp::kAuthBytes) {
    tcp::ServerHandshake hs("k", WireSecurity::kEncrypt);
    (void)hs.feed(in.first(tcp::kHelloBytes));
    if (!hs.finished()) (void)hs.feed(in.subspan(tcp::kHelloBytes, tcp::kAuthBytes));
  }
  // Records as a peer would send them: a length, a body and a tag, opened by a key it does
  // not hold (every one must fail, none may read past its bounds).
  DirectionKey key{};
  RecordCipher rx(WireSecurity::kEncrypt, RecordCipher::Role::kOpen, key);
  std::vector<std::uint8_t> out;
  for (std::size_t at = 0; at + 4 + kAeadTagBytes <= in.size();) {
    const std::size_t n = std::min<std::size_t>(in[at] | (in[at + 1] << 8), in.size() - at - 4 - kAeadTagBytes);
    out.resize(n);
    if (rx.open(in.subspan(at + 4, n), out.data(), in.data() + at + 4 + n)) __builtin_trap();
    at += 4 + n + kAeadTagBytes;
  }
  // Sealed fabric frames (fabric/path.h): a number, a sealed header, two tags and a
  // payload, checked against a replay window and opened by a key the sender does not hold.
  NumberedCipher nrx(WireSecurity::kEncrypt, NumberedCipher::Role::kOpen, key);
  ReplayWindow window;
  std::uint8_t header[kFrameHeaderBytes];
  constexpr std::size_t kPrefix = 8 + kFrameHeaderBytes + 2 * kAeadTagBytes;
  for (std::size_t at = 0; at + kPrefix <= in.size();) {
    const std::uint64_t number = wire::load<std::uint64_t>(in.data() + at);
    const std::size_t n = std::min<std::size_t>(in[at + 8], in.size() - at - kPrefix);
    if (window.fresh(number)) {
      if (nrx.open(2 * number, in.subspan(at + 8, kFrameHeaderBytes), header, in.data() + at + 8 + kFrameHeaderBytes)) {
        __builtin_trap();
      }
      out.resize(n);
      nrx.begin(2 * number + 1, n);
      nrx.update(in.data() + at + kPrefix, out.data(), n);
      if (nrx.finishOpen(in.data() + at + 8 + kFrameHeaderBytes + kAeadTagBytes)) __builtin_trap();
      window.take(number);  // as if it had opened: the window's own bookkeeping is under test
      if (window.fresh(number)) __builtin_trap();
    }
    at += kPrefix + n;
  }
  (void)tcp::decodeDirectReadOffer(in.first(std::min<std::size_t>(in.size(), 300)));
  (void)fabric::decodeRailNames(in.first(std::min<std::size_t>(in.size(), fabric::kMaxPathNamesBytes + 16)));
}

}  // namespace

// A shared-memory ring whose memory a peer filled with the input: the reader follows only
// what lies inside the ring, however the counters and record headers read.
void fuzzRing(std::span<const std::uint8_t> in) {
  constexpr std::size_t kCapacity = 4096;
  alignas(64) static std::uint8_t memory[shm::ringBytes(kCapacity)];
  std::memset(memory, 0, sizeof(memory));
  std::memcpy(memory, in.data(), std::min(in.size(), sizeof(memory)));
  shm::RingReader reader(memory, kCapacity);
  for (int i = 0; i < 256; ++i) {
    shm::Record r;
    auto more = reader.next(&r);
    if (!more || !*more) return;
    volatile std::uint8_t sink = 0;
    for (std::uint8_t b : r.content) sink = static_cast<std::uint8_t>(sink ^ b);  // every byte is readable
    reader.release();
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::uint8_t> in(data, size);
  fuzzHandshake(in);
  fuzzRing(in);

  MultipathConfig cfg;
  cfg.chunkBytes = 4096;
  cfg.maxUnexpectedBytes = 1 << 20;  // the bound a peer cannot push past
  auto ch = std::make_shared<MultipathChannel>(1, std::vector<PathEndpoints>{{"a", "b"}, {"c", "d"}}, cfg, [] {});
  std::vector<std::uint8_t> recvBuf(8192), sendBuf(10000, 7);
  (void)ch->irecv(recvBuf.data(), recvBuf.size(), 0);
  (void)ch->irecv(recvBuf.data(), 16, 1);
  (void)ch->isend(sendBuf.data(), sendBuf.size(), 0);
  ch->drainPosted();
  ch->schedule(0);
  OutChunk c;
  while (ch->nextChunk(0, &c) || ch->nextChunk(1, &c)) ch->onChunkWritten(0, c, 0);

  std::size_t pos = 0;
  std::int64_t now = 0;
  while (pos + kFrameHeaderBytes <= size && !ch->failed()) {
    auto h = decodeFrameHeader(in.subspan(pos, kFrameHeaderBytes));
    pos += kFrameHeaderBytes;
    if (!h) break;
    std::size_t path = h->seq & 1;
    if (h->type == FrameType::kAck) {
      if (!ch->onAck(h.value(), path, now += 100).isOk()) break;
      continue;
    }
    if (h->type == FrameType::kClose) continue;
    if (h->type == FrameType::kPathNames || h->type == FrameType::kShmPairing) {
      // The device decodes the payload as rail names, or as a shared-memory pairing message.
      const std::size_t avail = std::min<std::size_t>(h->length, size - pos);
      if (h->type == FrameType::kPathNames) {
        (void)fabric::decodeRailNames(in.subspan(pos, avail));
      } else {
        (void)shm::decodePairing(in.subspan(pos, avail), 8u << 20);
      }
      pos += avail;
      continue;
    }
    const bool ref = h->type == FrameType::kDataRef;  // a RemoteRef follows; the bytes are "read" from the input
    if (ref) {
      if (size - pos < kRemoteRefBytes) break;
      (void)decodeRemoteRef(std::span<const std::uint8_t, kRemoteRefBytes>(data + pos, kRemoteRefBytes));
      pos += kRemoteRefBytes;
      h->type = FrameType::kData;
    }
    auto t = ch->onDataHeader(h.value(), path);
    if (!t) break;
    std::uint64_t len = h->length;
    std::uint64_t avail = std::min<std::uint64_t>(len, size - pos);
    if (std::uint8_t* p = ch->targetPointer(t.value(), 0)) std::memcpy(p, data + pos, avail);
    pos += avail;
    if (avail < len) break;  // truncated payload: the stream would close here
    if (!ch->onDataComplete(t.value(), path).isOk()) break;
    ch->drainPosted();
  }
  ch->onPathFailed(0, pathError("fuzz"), false);
  ch->onPathFailed(1, pathError("fuzz"), false);
  return 0;
}
