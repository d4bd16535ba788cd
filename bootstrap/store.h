// The bootstrap store: a small authenticated TCP key-value store hosted by rank 0 (the
// model is PyTorch's TCPStore) through which ranks exchange addresses at start-up.
// Layers: a pure wire codec, StoreState (the map and its waiters), StoreServer (sockets
// and an event loop around a StoreState; store_server.cc) and TcpStore (the client). Set-up
// path only.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/fd.h"
#include "core/status.h"
#include "transport/tcp/pending.h"
#include "transport/tcp/sealed_socket.h"

namespace meridian::bootstrap {

// ---- Wire format -------------------------------------------------------------------
//
// Request:  header (32 bytes, little-endian)
//             u32 magic "MRST" | u16 version | u8 op | u8 reserved=0 | u32 keyCount |
//             u32 valueBytes | u64 timeoutMs | i64 delta
//           then keyCount x (u32 keyBytes, key bytes), then valueBytes of value.
// Response: header (24 bytes)
//             u32 magic | u16 version | u8 op (echoed) | u8 StatusCode | u32 payloadBytes |
//             u32 reserved=0 | i64 number
//           then the payload: the value (GET) when the code is kOk, else the error message.
//
// Every length read from the wire is checked against the limits below before anything
// is allocated for it; a frame that breaks them fails with kPeerError.

inline constexpr std::uint32_t kStoreMagic = 0x5453524D;  // "MRST" little-endian
inline constexpr std::uint16_t kStoreProtocolVersion = 1;
inline constexpr std::size_t kStoreRequestHeaderBytes = 32;
inline constexpr std::size_t kStoreResponseHeaderBytes = 24;
inline constexpr std::size_t kStoreMaxKeyBytes = 4 * 1024;
inline constexpr std::size_t kStoreMaxValueBytes = 64 * 1024 * 1024;
inline constexpr std::size_t kStoreMaxKeys = 4096;
inline constexpr std::size_t kStoreMaxErrorBytes = 4 * 1024;
// timeoutMs meaning "wait until the key appears or the server stops".
inline constexpr std::uint64_t kStoreNoTimeout = UINT64_MAX;

// kIdleClose is never a request: it is the answer a server sends, unasked, just before it
// closes a connection that stayed idle past MERIDIAN_STORE_IDLE_TIMEOUT_MS (with kTimeout and
// a message). Nothing the client sent after it was executed, so the client reconnects and
// sends its request again.
//
// kGetMany blocks like WAIT until every key exists, then answers every value in one
// payload: per key, in the order asked, u32 valueBytes then the value (at most
// kStoreMaxValueBytes in all). A client may send its next requests before the answers
// come (pipelining): the server takes a connection's requests one at a time, in order, so
// a SET followed by a GET-MANY is an all-gather through the store in one round trip.
enum class StoreOp : std::uint8_t {
  kSet = 1,
  kGet = 2,
  kWait = 3,
  kAdd = 4,
  kCheck = 5,
  kDelete = 6,
  kIdleClose = 7,
  kGetMany = 8,
};
const char* toString(StoreOp op);

struct StoreRequest {
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;  // exactly one, except WAIT, CHECK and GET-MANY (0..kStoreMaxKeys)
  std::vector<std::uint8_t> value;  // SET only
  std::int64_t delta = 0;           // ADD only
  std::uint64_t timeoutMs = 0;      // GET, WAIT and GET-MANY: how long the server may block
};

struct StoreResponse {
  StoreOp op = StoreOp::kGet;
  Status status;                    // ok, or what the server answered (kTimeout, kInvalidArgument...)
  std::vector<std::uint8_t> value;  // GET
  std::vector<std::vector<std::uint8_t>> values;  // GET-MANY, in the order of the keys asked
  std::int64_t number = 0;          // ADD: the new value; CHECK and DELETE: 1 or 0
};

// Reads exactly dst.size() bytes or fails (a socket, or a buffer in tests).
using StoreByteReader = std::function<Status(std::span<std::uint8_t> dst)>;

// Encoding fails with kInvalidArgument when the request breaks a limit or the op's shape.
Result<std::vector<std::uint8_t>> encodeStoreRequest(const StoreRequest& request);
std::vector<std::uint8_t> encodeStoreResponse(const StoreResponse& response);

// The request decoder, fed bytes as they come (the server's event loop; readStoreRequest
// drives it from a blocking reader). feed() takes at most wantBytes() bytes at a time; every
// length is checked against the limits above as soon as its field is whole, before anything
// is allocated for it; the value is appended as it arrives (at most `valueReserveBytes` of
// it reserved up front), so an announced size costs nothing until its bytes come.
class StoreRequestParser {
 public:
  explicit StoreRequestParser(std::size_t valueReserveBytes = SIZE_MAX) : valueReserveBytes_(valueReserveBytes) {}
  // Bytes due next (0 once done()).
  std::size_t wantBytes() const;
  // kPeerError on a frame that breaks the format or a limit; the parser is then done with it.
  Status feed(std::span<const std::uint8_t> bytes);
  bool done() const { return step_ == Step::kDone; }
  // Once the header is in: the op and the value size it announced.
  bool headerDone() const { return step_ != Step::kHeader; }
  StoreOp op() const { return request_.op; }
  std::uint32_t announcedValueBytes() const { return valueBytes_; }
  // Whether the bytes due next are the value's.
  bool readingValue() const { return step_ == Step::kValue; }
  // From now on the value's bytes are counted, not kept (the request was refused already).
  void discardValue() {
    discardValue_ = true;
    request_.value = {};
  }
  // The finished request; the parser starts over on the next frame.
  StoreRequest take();
  // What the bytes due next are ("store request key 2 length"), for error context.
  std::string what() const;

 private:
  enum class Step : std::uint8_t { kHeader, kKeyLength, kKey, kValue, kDone };
  Status fieldDone();
  void afterKeys();
  std::size_t valueReserveBytes_;
  Step step_ = Step::kHeader;
  std::array<std::uint8_t, kStoreRequestHeaderBytes> field_{};  // header or a key length, so far
  std::size_t fieldGot_ = 0;
  std::uint32_t keyCount_ = 0;
  std::uint32_t keyBytes_ = 0;  // of the key being read
  std::uint32_t valueBytes_ = 0;
  std::uint64_t valueGot_ = 0;
  bool discardValue_ = false;
  StoreRequest request_;
};

// Streaming decoders: read the header, check it, then read what it announced.
Result<StoreRequest> readStoreRequest(const StoreByteReader& read);
Result<StoreResponse> readStoreResponse(const StoreByteReader& read, StoreOp expectedOp);
// Whole-buffer decoders; trailing bytes are an error.
Result<StoreRequest> decodeStoreRequest(std::span<const std::uint8_t> frame);
Result<StoreResponse> decodeStoreResponse(std::span<const std::uint8_t> frame, StoreOp expectedOp);

// ---- The store interface -----------------------------------------------------------

// Blocking calls take a deadline and fail with kTimeout when it passes. ADD keeps the
// counter as decimal text, so GET on it returns e.g. "3" and WAIT on it works.
class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, std::span<const std::uint8_t> value) = 0;
  // Blocks until the key exists or the deadline passes.
  virtual Result<std::vector<std::uint8_t>> get(const std::string& key, TimePoint deadline) = 0;
  // Blocks until every key exists or the deadline passes.
  virtual Status wait(const std::vector<std::string>& keys, TimePoint deadline) = 0;
  // Blocks until every key exists, then returns their values in the order of `keys` (a
  // TcpStore: in one round trip). The default waits, then gets the keys one by one.
  virtual Result<std::vector<std::vector<std::uint8_t>>> getMany(const std::vector<std::string>& keys,
                                                                 TimePoint deadline);
  // set(key, value), then getMany(keys) (a TcpStore: both in one round trip, pipelined; a
  // SET the server refuses still costs the GET-MANY's wait).
  virtual Result<std::vector<std::vector<std::uint8_t>>> setAndGetMany(const std::string& key,
                                                                       std::span<const std::uint8_t> value,
                                                                       const std::vector<std::string>& keys,
                                                                       TimePoint deadline);
  // Adds delta to the integer counter at key (missing: 0) and returns the new value.
  virtual Result<std::int64_t> add(const std::string& key, std::int64_t delta) = 0;
  // True when every key exists; never blocks.
  virtual Result<bool> check(const std::vector<std::string>& keys) = 0;
  // Removes the key; true when it existed.
  virtual Result<bool> del(const std::string& key) = 0;
};

// StoreState: the key-value map and its waiters. Owned by a StoreServer, or directly by
// tests and single-process runs. Any thread may call any method. shutdown() wakes every
// blocked call with kPeerError; calls after it that would block fail at once. Budget: the
// bytes of every key and value held, plus what reserve() promised to SETs still arriving,
// stay within maxBytes; a SET or ADD beyond it fails with kInvalidArgument saying so.
class StoreState final : public Store {
 public:
  explicit StoreState(std::uint64_t maxBytes = UINT64_MAX) : maxBytes_(maxBytes) {}
  Status set(const std::string& key, std::span<const std::uint8_t> value) override;
  Result<std::vector<std::uint8_t>> get(const std::string& key, TimePoint deadline) override;
  Status wait(const std::vector<std::string>& keys, TimePoint deadline) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Result<bool> del(const std::string& key) override;

  // Sets aside `bytes` of the budget for a value as its bytes arrive (kInvalidArgument when
  // they do not fit); release() gives them back, before the value is set or when it never
  // completes. fits() only asks.
  bool fits(std::uint64_t bytes) const;
  Status reserve(std::uint64_t bytes);
  void release(std::uint64_t bytes);
  // Bytes of keys and values held now.
  std::uint64_t bytesHeld() const;

  void shutdown();
  // Calls blocked in get/wait right now (diagnostics and tests).
  std::size_t waiterCount() const;
  std::size_t keyCount() const;

 private:
  enum class WaitOutcome { kReady, kTimedOut, kShutdown };
  // Waits on cv_ until ready() holds, the deadline passes or shutdown(); `lock` holds mu_.
  WaitOutcome waitLocked(std::unique_lock<std::mutex>& lock, TimePoint deadline, const std::function<bool()>& ready);
  // Stores `value` at `key` if the budget allows; `lock` holds mu_.
  Status putLocked(const std::string& key, std::vector<std::uint8_t> value, const char* op);

  const std::uint64_t maxBytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::uint8_t>, std::less<>> values_;
  std::uint64_t heldBytes_ = 0;
  std::uint64_t reservedBytes_ = 0;
  std::size_t waiters_ = 0;
  bool shutdown_ = false;
};

// ---- Server ------------------------------------------------------------------------

// What a StoreServer allows, from the knobs (storeLimitsFromKnobs) or set by tests.
struct StoreLimits {
  std::uint64_t maxValueBytes = kStoreMaxValueBytes;  // MERIDIAN_STORE_MAX_VALUE_BYTES
  std::uint64_t maxBytes = 256ull << 20;              // MERIDIAN_STORE_MAX_BYTES
  std::chrono::milliseconds idleTimeout{300000};      // MERIDIAN_STORE_IDLE_TIMEOUT_MS
  // Connections before authentication (transport/tcp/pending.h): per listener, per source
  // address, and how long each may take for its handshake.
  transport::tcp::PendingLimits pending{256, 32, std::chrono::seconds(5)};
};
Result<StoreLimits> storeLimitsFromKnobs();

// StoreServer: listens on bindIp:port and serves a StoreState to authenticated clients.
// Owned by rank 0 (see rendezvous() in launch_env.h). One thread ("mer-store") runs an epoll
// loop over every connection, none of its calls blocking:
//  - before authentication a connection runs the server side of the handshake (the
//    ServerHandshake state machine, ConnectionKind::kStore only) under the caps and deadline
//    of StoreLimits::pending; past a cap the oldest pending connection is closed, at the
//    deadline it is closed as timed out;
//  - after it, requests come in sealed records (RecordReader) and are decoded as they arrive
//    (StoreRequestParser). A SET's size is checked against maxValueBytes and the budget when
//    its header arrives, and its bytes take their part of the budget as they arrive (an
//    announced size costs nothing until its bytes come): refused, the rest of its bytes are
//    read and dropped and the client gets the error. GET and WAIT whose keys are missing park until a SET or ADD makes
//    them ready or their deadline passes (then they answer kTimeout, as StoreState does);
//  - a connection that moves no byte for idleTimeout while nothing of it is parked gets a
//    kIdleClose answer and is closed (its client reconnects on its next call).
// A client that fails the handshake or sends a bad frame is dropped alone; lines about them
// are rate-limited. The destructor answers parked requests with kPeerError, sends what is
// still queued (kDrainTimeout at most), closes every socket and joins the thread.
class StoreServer {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  // port 0: the kernel picks one (see port()). Limits from the knobs unless given.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& bindIp, std::uint16_t port,
                                                    std::string secret,
                                                    std::optional<StoreLimits> limits = std::nullopt);
  // Serves on `listeningFd`, a socket already listening: inherited from a launcher that kept
  // the port bound from its choice to here (MERIDIAN_STORE_FD), so nobody else could take it.
  // The server owns the descriptor (made non-blocking and close-on-exec) once it is found to
  // be a listening IPv4 TCP socket bound to `expectedPort` (0: any); otherwise it is left
  // alone and the result is kInvalidArgument saying what it is instead.
  static Result<std::unique_ptr<StoreServer>> adopt(int listeningFd, std::uint16_t expectedPort, std::string secret);
  StoreServer(PrivateTag, UniqueFd listenFd, std::string secret, StoreLimits limits);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const { return port_; }
  const StoreLimits& limits() const { return limits_; }
  // Requests parked in GET or WAIT right now.
  std::size_t waiterCount() const { return parkedCount_.load(); }
  // Connections still in the handshake, and authenticated ones.
  std::size_t pendingCount() const { return pendingCount_.load(); }
  std::size_t clientCount() const { return clientCount_.load(); }
  // Bytes of keys and values held.
  std::uint64_t bytesHeld() const { return state_.bytesHeld(); }
  // Lines about refused, timed-out and evicted connections: printed, and held back.
  std::uint64_t refusalLinesPrinted() const;
  std::uint64_t refusalLinesSuppressed() const;

 private:
  struct Conn;
  class Loop;
  static Result<std::unique_ptr<StoreServer>> serve(UniqueFd listenFd, std::string secret,
                                                    std::optional<StoreLimits> limits);

  UniqueFd listenFd_;
  std::string secret_;
  StoreLimits limits_;
  std::uint16_t port_ = 0;
  StoreState state_;
  std::atomic<std::size_t> parkedCount_{0};
  std::atomic<std::size_t> pendingCount_{0};
  std::atomic<std::size_t> clientCount_{0};
  std::unique_ptr<Loop> loop_;  // the event loop and its thread (store_server.cc)
};

// ---- Client ------------------------------------------------------------------------

// TcpStore: one authenticated connection to a StoreServer. Thread-safe: a mutex
// serialises requests, so a blocking get() holds up the other threads' calls on this
// object (give each rank its own TcpStore). Calls that do not block give up after
// MERIDIAN_TIMEOUT_MS of network silence. A transport error (not a server-side answer
// such as kTimeout) breaks the connection: later calls return that error. A connection the
// server closed for idleness (a kIdleClose answer) is opened again on the next call.
class TcpStore final : public Store {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  // Retries until the server accepts (it may start after us) or the deadline passes. A
  // server that accepts but never finishes the handshake fails with kTimeout ("timed out
  // waiting for the handshake"); a wrong secret with kPeerError naming the job secret.
  static Result<std::unique_ptr<TcpStore>> connect(const std::string& hostPort, std::string secret,
                                                   TimePoint deadline);
  TcpStore(PrivateTag, UniqueFd fd, const transport::tcp::SessionKeys& keys, std::string address, std::string secret,
           std::chrono::milliseconds ioTimeout);

  Status set(const std::string& key, std::span<const std::uint8_t> value) override;
  Result<std::vector<std::uint8_t>> get(const std::string& key, TimePoint deadline) override;
  Status wait(const std::vector<std::string>& keys, TimePoint deadline) override;
  Result<std::vector<std::vector<std::uint8_t>>> getMany(const std::vector<std::string>& keys,
                                                         TimePoint deadline) override;
  Result<std::vector<std::vector<std::uint8_t>>> setAndGetMany(const std::string& key, std::span<const std::uint8_t> value,
                                                               const std::vector<std::string>& keys,
                                                               TimePoint deadline) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Result<bool> del(const std::string& key) override;

  const std::string& address() const { return address_; }
  // Connections opened again after the server closed one for idleness.
  std::size_t reconnects() const { return reconnects_.load(); }

 private:
  struct Dialed {
    UniqueFd fd;
    transport::tcp::SessionKeys keys;
  };
  // Connects and authenticates.
  static Result<Dialed> dial(const std::string& hostPort, const std::string& secret, TimePoint deadline);
  // Sends the request and reads the answer; replyDeadline bounds the whole exchange.
  Result<StoreResponse> roundTrip(const StoreRequest& request, TimePoint replyDeadline);
  // Sends every request at once and reads the answers, in order (the server takes a
  // connection's requests one at a time): one round trip for all of them.
  Result<std::vector<StoreResponse>> roundTrips(std::span<const StoreRequest> requests, TimePoint replyDeadline);
  // Sends the frames and reads one answer per request, up to a kIdleClose (returned as it
  // is, last). `mu_` held.
  Result<std::vector<StoreResponse>> exchange(std::span<const std::uint8_t> frames, std::span<const StoreRequest> requests,
                                              TimePoint replyDeadline);
  // A GET-MANY's answer: its values, or its error.
  Result<std::vector<std::vector<std::uint8_t>>> valuesOf(StoreResponse response, std::size_t keys) const;
  // Whether the server said it closed this connection (a kIdleClose waiting to be read);
  // an error when the connection is gone otherwise. `mu_` held.
  Result<bool> closedForIdleness();
  Status reconnect();  // `mu_` held
  TimePoint ioDeadline() const { return Clock::now() + ioTimeout_; }
  TimePoint blockingReplyDeadline(TimePoint deadline) const;

  std::mutex mu_;
  UniqueFd fd_;
  std::unique_ptr<transport::tcp::SealedSocket> conn_;  // every request and answer in sealed records
  Status broken_;  // the first transport error; sticky
  std::string address_;
  std::string secret_;
  std::chrono::milliseconds ioTimeout_;
  std::atomic<std::size_t> reconnects_{0};
};

// ---- Helpers over any Store --------------------------------------------------------

// Every rank publishes `blob` under prefix/rank and reads everyone's; result[r] is rank
// r's blob. `prefix` must be fresh for each exchange.
Result<std::vector<std::vector<std::uint8_t>>> storeAllGather(Store& store, const std::string& prefix, int rank,
                                                              int worldSize, std::span<const std::uint8_t> blob,
                                                              TimePoint deadline);
// Returns once all worldSize ranks have called it with this prefix (fresh per barrier).
Status storeBarrier(Store& store, const std::string& prefix, int worldSize, TimePoint deadline);

}  // namespace meridian::bootstrap
