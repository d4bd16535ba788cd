// FabricPath: one path of a multipath channel over a libfabric rail. Every frame (a chunk
// with its header, an acknowledgement, a goodbye) is one tagged message: frames to the
// peer carry `sendTag`, frames from it `recvTag`, so many peers' paths share one rail and
// a frame can only land on the path it was meant for.
//
// Buffers: the path owns a registered arena of frame slots: `sendSlots` for chunks, as
// many small ones for acknowledgements, and `recvSlots` receives, each the size of the
// largest frame (header + chunk), always posted. A chunk's payload is copied into its
// slot when it is posted, unless the payload lies in memory registered on the rail
// (Device::registerMemory; the NCCL plugin's regMr): then the frame goes out in place, the
// header from the slot and the payload from the caller's memory, one gathered send, no copy.
// The engine may finish the message on another path while the provider still reads it (a
// stall); the caller may then reuse the buffer, and what this path sends of it belongs to a
// finished message, which the peer drops. The registration keeps the memory mapped: the
// caller's contract is to deregister before freeing, and a registration closed under a
// posted send fails the path, whose chunks go to the others. Receives always land in slots
// and are copied out (which chunk arrives on which path is the sender's choice).
//
// Sealing (MERIDIAN_WIRE_SECURITY encrypt or authenticate; the keys come from the channel's
// authenticated TCP connection, see docs/transport.md): a frame numbered n travels as
//   n (u64, clear) | header sealed as record 2n | its tag | the payload's tag | payload sealed as record 2n+1
// (core/aead.h NumberedCipher: the nonce binds the number, the length is authenticated,
// each direction of each path has its own key). The receiver refuses a number it has taken
// before (ReplayWindow), opens the header before it reads a field of it, and decrypts the
// payload straight into the message's memory; nothing counts until the payload's tag checks.
// A frame that fails any of this fails the path (an integrity failure, counted and logged),
// and its chunks go to the other paths. Encrypt seals the payload into a slot (the
// encryption is the copy: no in-place sends); authenticate sends registered memory in place
// as before, its tag computed where it lies. Off: header | payload, no number, no tag.
//
// Failure: an operation that fails (a completion error) fails the path; the engine moves
// its chunks to the other paths. A peer that vanished without a word shows as a stall
// (the engine's checkStalls): tcp;ofi_rxm keeps such sends queued for ever.
//
// Threads: the driver's (see engine.h): pump() and the rail's progress() from one thread
// at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "core/aead.h"
#include "core/metrics.h"
#include "transport/engine.h"
#include "transport/fabric/rail.h"

namespace meridian::transport::fabric {

struct FabricPathConfig {
  std::size_t chunkBytes = 512 * 1024;  // the channel's chunk size: frames are at most header + this
  int sendSlots = 8;                    // chunks in flight on the path
  int recvSlots = 8;                    // receives kept posted
  WireSecurity security = WireSecurity::kOff;
  DirectionKey sendKey, recvKey;  // this path's, one per direction (unused when off)
  Counter* integrityFailures = nullptr;  // counts frames that failed their tags (may be null)
};

// Frame numbers are below this (frame n is records 2n and 2n+1; a larger one is refused).
inline constexpr std::uint64_t kMaxFrameNumber = 1ull << 62;
// Bytes before a sealed frame's payload: number, header, header tag, payload tag.
inline constexpr std::size_t kSealedFramePrefixBytes = 8 + kFrameHeaderBytes + 2 * kAeadTagBytes;

class FabricPath final : public RailOpHandler {
 public:
  // Path `index` of the channel `engine` drives, to `peer` on `rail`. The rail outlives the
  // path.
  static Result<std::unique_ptr<FabricPath>> create(Rail& rail, RailPeer peer, std::uint64_t sendTag,
                                                    std::uint64_t recvTag, ChannelEngine& engine, std::size_t index,
                                                    FabricPathConfig config = {});
  ~FabricPath() override;
  FabricPath(const FabricPath&) = delete;
  FabricPath& operator=(const FabricPath&) = delete;

  // Posts what can go now: receives, acknowledgements, then chunks the engine has for this
  // path, while slots are free and the provider takes them.
  void pump(std::int64_t nowUs);
  // Says goodbye (a CLOSE frame, after the acknowledgements already queued) so the peer
  // takes the end as meant; no chunk goes out after it. The provider may not take it at
  // once: pump() and the rail's progress until !hasUnsentFrames().
  void sayGoodbye();
  bool hasUnsentFrames() const { return !controls_.empty(); }
  // Fails the path now (a cable pull; the engine hears of it).
  void fail(const Status& why);
  // Ends the path as the peer meant it (its goodbye came, here or on another path of the
  // channel): the engine takes it as a graceful close.
  void end(const Status& why);
  bool failed() const { return failed_; }
  // Operations the provider still holds.
  std::size_t outstanding() const { return outstanding_; }
  // Payload bytes sent in place from registered memory (no copy into a slot), so far.
  std::uint64_t sentInPlaceBytes() const { return sentInPlaceBytes_; }

  void onComplete(RailOp& op, const RailCompletion& completion) override;

 private:
  enum class SlotKind : std::uint8_t { kChunk, kControl, kRecv };
  struct Slot {
    RailOp op;
    SlotKind kind = SlotKind::kRecv;
    std::uint8_t* buffer = nullptr;
    std::size_t capacity = 0;
    bool posted = false;
    std::size_t frameBytes = 0;  // a send's
    // A chunk sent in place: the slot holds the header only, the payload is the caller's.
    const std::uint8_t* inPlace = nullptr;
    void* inPlaceDesc = nullptr;
  };
  FabricPath(Rail& rail, RailPeer peer, std::uint64_t sendTag, std::uint64_t recvTag, ChannelEngine& engine,
             std::size_t index, FabricPathConfig config);
  Status postSend(Slot& s);
  void onReceived(Slot& s, std::size_t bytes);
  void repost(Slot& s);
  // Writes the frame of `h` into the slot: number, sealed header and payload tag when
  // sealing, and the chunk's payload behind them unless it goes in place (s.inPlace).
  void writeFrame(Slot& s, const FrameHeader& h, const OutChunk* c);
  // Opens the payload record of frame `number` (its bytes at `in`) into `out` (nullptr or
  // `in`: checked where it lies); false: not genuine.
  bool openPayload(std::uint64_t number, std::uint8_t* in, std::uint8_t* out, std::size_t n, const std::uint8_t* tag);
  void failIntegrity(std::string_view what);
  bool sealing() const { return config_.security != WireSecurity::kOff; }

  Rail& rail_;
  RailPeer peer_;
  std::uint64_t sendTag_, recvTag_;
  ChannelEngine& engine_;
  std::size_t index_;
  FabricPathConfig config_;
  std::size_t prefix_ = kFrameHeaderBytes;  // bytes before a frame's payload
  std::unique_ptr<NumberedCipher> tx_, rx_;
  ReplayWindow taken_;
  std::uint64_t nextNumber_ = 0;
  std::shared_ptr<std::uint8_t[]> arena_;
  std::size_t arenaBytes_ = 0;
  RailMemory memory_;
  std::shared_ptr<std::vector<Slot>> slots_;  // fixed size: the provider holds pointers into it
  std::deque<FrameHeader> controls_;  // acknowledgements (and a goodbye) waiting for a slot
  Slot* pendingChunk_ = nullptr;      // filled, refused by the provider for now: goes first
  OutChunk pendingChunkRef_;
  FrameHeader pendingHeader_;
  std::size_t outstanding_ = 0;
  std::uint64_t sentInPlaceBytes_ = 0;
  bool failed_ = false;
  bool gotClose_ = false;
  bool closing_ = false;  // the goodbye is queued or sent
};

}  // namespace meridian::transport::fabric
