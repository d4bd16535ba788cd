// The bootstrap store: a small authenticated TCP key-value store hosted by rank 0 (the
// model is PyTorch's TCPStore) through which ranks exchange addresses at start-up.
// Layers: a pure wire codec, StoreState (the map and its waiters), StoreServer (sockets
// and threads around a StoreState) and TcpStore (the client). Set-up path only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/fd.h"
#include "core/status.h"
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

enum class StoreOp : std::uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4, kCheck = 5, kDelete = 6 };
const char* toString(StoreOp op);

struct StoreRequest {
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;  // exactly one, except WAIT and CHECK (0..kStoreMaxKeys)
  std::vector<std::uint8_t> value;  // SET only
  std::int64_t delta = 0;           // ADD only
  std::uint64_t timeoutMs = 0;      // GET and WAIT: how long the server may block
};

struct StoreResponse {
  StoreOp op = StoreOp::kGet;
  Status status;                    // ok, or what the server answered (kTimeout, kInvalidArgument...)
  std::vector<std::uint8_t> value;  // GET
  std::int64_t number = 0;          // ADD: the new value; CHECK and DELETE: 1 or 0
};

// Reads exactly dst.size() bytes or fails (a socket, or a buffer in tests).
using StoreByteReader = std::function<Status(std::span<std::uint8_t> dst)>;

// Encoding fails with kInvalidArgument when the request breaks a limit or the op's shape.
Result<std::vector<std::uint8_t>> encodeStoreRequest(const StoreRequest& request);
std::vector<std::uint8_t> encodeStoreResponse(const StoreResponse& response);

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
  // Adds delta to the integer counter at key (missing: 0) and returns the new value.
  virtual Result<std::int64_t> add(const std::string& key, std::int64_t delta) = 0;
  // True when every key exists; never blocks.
  virtual Result<bool> check(const std::vector<std::string>& keys) = 0;
  // Removes the key; true when it existed.
  virtual Result<bool> del(const std::string& key) = 0;
};

// StoreState: the key-value map and its waiters. Owned by a StoreServer, or directly by
// tests and single-process runs. Any thread may call any method. shutdown() wakes every
// blocked call with kPeerError; calls after it that would block fail at once.
class StoreState final : public Store {
 public:
  Status set(const std::string& key, std::span<const std::uint8_t> value) override;
  Result<std::vector<std::uint8_t>> get(const std::string& key, TimePoint deadline) override;
  Status wait(const std::vector<std::string>& keys, TimePoint deadline) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Result<bool> del(const std::string& key) override;

  void shutdown();
  // Calls blocked in get/wait right now (diagnostics and tests).
  std::size_t waiterCount() const;
  std::size_t keyCount() const;

 private:
  enum class WaitOutcome { kReady, kTimedOut, kShutdown };
  // Waits on cv_ until ready() holds, the deadline passes or shutdown(); `lock` holds mu_.
  WaitOutcome waitLocked(std::unique_lock<std::mutex>& lock, TimePoint deadline, const std::function<bool()>& ready);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::uint8_t>, std::less<>> values_;
  std::size_t waiters_ = 0;
  bool shutdown_ = false;
};

// ---- Server ------------------------------------------------------------------------

// StoreServer: listens on bindIp:port and serves a StoreState to authenticated clients.
// Owned by rank 0 (see rendezvous() in launch_env.h). Threads: one accept thread
// ("mer-store-acc") and one thread per client connection ("mer-store-cli"); each client
// proves it holds the job secret (serverHandshake, ConnectionKind::kStore) before its
// first request. A client that fails the handshake or sends a bad frame is logged and
// dropped; the others are unaffected. The destructor wakes blocked requests (their
// clients get an error), closes every socket and joins every thread.
class StoreServer {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  // port 0: the kernel picks one (see port()).
  static Result<std::unique_ptr<StoreServer>> start(const std::string& bindIp, std::uint16_t port,
                                                    std::string secret);
  // Serves on `listeningFd`, a socket already listening: inherited from a launcher that kept
  // the port bound from its choice to here (MERIDIAN_STORE_FD), so nobody else could take it.
  // The server owns the descriptor (made non-blocking and close-on-exec) once it is found to
  // be a listening IPv4 TCP socket bound to `expectedPort` (0: any); otherwise it is left
  // alone and the result is kInvalidArgument saying what it is instead.
  static Result<std::unique_ptr<StoreServer>> adopt(int listeningFd, std::uint16_t expectedPort, std::string secret);
  StoreServer(PrivateTag, UniqueFd listenFd, UniqueFd wakeFd, std::string secret, std::chrono::milliseconds ioTimeout);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const { return port_; }
  // Requests blocked in GET or WAIT right now.
  std::size_t waiterCount() const { return state_.waiterCount(); }

 private:
  struct Client {
    UniqueFd fd;  // closed only after `thread` is joined, so the number is never reused under it
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<bool> answering{false};  // from a request read to its reply sent
  };

  // Starts the accept thread on a listening, non-blocking socket.
  static Result<std::unique_ptr<StoreServer>> serve(UniqueFd listenFd, std::string secret);
  void acceptLoop();
  void serveClient(Client& client);
  void reapFinishedClients();

  UniqueFd listenFd_;
  UniqueFd wakeFd_;  // eventfd that stops the accept thread
  std::string secret_;
  WireSecurity mode_ = WireSecurity::kEncrypt;  // MERIDIAN_WIRE_SECURITY
  std::chrono::milliseconds ioTimeout_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  StoreState state_;
  std::list<std::unique_ptr<Client>> clients_;  // touched by the accept thread, then by ~StoreServer
  std::thread acceptThread_;
};

// ---- Client ------------------------------------------------------------------------

// TcpStore: one authenticated connection to a StoreServer. Thread-safe: a mutex
// serialises requests, so a blocking get() holds up the other threads' calls on this
// object (give each rank its own TcpStore). Calls that do not block give up after
// MERIDIAN_TIMEOUT_MS of network silence. A transport error (not a server-side answer
// such as kTimeout) breaks the connection: later calls return that error.
class TcpStore final : public Store {
  struct PrivateTag {
    explicit PrivateTag() = default;
  };

 public:
  // Retries until the server accepts (it may start after us) or the deadline passes.
  static Result<std::unique_ptr<TcpStore>> connect(const std::string& hostPort, std::string secret,
                                                   TimePoint deadline);
  TcpStore(PrivateTag, UniqueFd fd, const transport::tcp::SessionKeys& keys, std::string address,
           std::chrono::milliseconds ioTimeout);

  Status set(const std::string& key, std::span<const std::uint8_t> value) override;
  Result<std::vector<std::uint8_t>> get(const std::string& key, TimePoint deadline) override;
  Status wait(const std::vector<std::string>& keys, TimePoint deadline) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Result<bool> del(const std::string& key) override;

  const std::string& address() const { return address_; }

 private:
  // Sends the request and reads the answer; replyDeadline bounds the whole exchange.
  Result<StoreResponse> roundTrip(const StoreRequest& request, TimePoint replyDeadline);
  TimePoint ioDeadline() const { return Clock::now() + ioTimeout_; }
  TimePoint blockingReplyDeadline(TimePoint deadline) const;

  std::mutex mu_;
  UniqueFd fd_;
  transport::tcp::SealedSocket conn_;  // every request and answer in sealed records
  Status broken_;  // the first transport error; sticky
  std::string address_;
  std::chrono::milliseconds ioTimeout_;
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
