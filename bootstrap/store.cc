// The bootstrap store: wire codec, StoreState, StoreServer and the TcpStore client.
#include "bootstrap/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include "core/knobs.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace tcp = transport::tcp;

namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
// Timeouts longer than this (~35 years) mean "no deadline".
constexpr std::uint64_t kMaxFiniteTimeoutMs = std::uint64_t{1} << 40;
// How long a stopping server waits for replies already being sent (~StoreServer).
constexpr std::chrono::milliseconds kDrainTimeout{2000};

bool isValidOp(std::uint8_t op) { return op >= 1 && op <= 6; }

// A key as it may appear in a message: printable, escaped, and short.
std::string printable(std::string_view key) {
  constexpr std::size_t kLimit = 80;
  std::string out;
  for (char c : key.substr(0, kLimit)) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isprint(u) != 0 && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  if (key.size() > kLimit) out += fmt::format("...({} bytes)", key.size());
  return out;
}

// The limits and the op's shape, checked from header fields alone (before any allocation).
// Empty when fine, else what is wrong.
std::string shapeProblem(StoreOp op, std::uint64_t keyCount, std::uint64_t valueBytes) {
  if (keyCount > kStoreMaxKeys) return fmt::format("{} keys exceed the limit of {}", keyCount, kStoreMaxKeys);
  if (valueBytes > kStoreMaxValueBytes) {
    return fmt::format("a value of {} bytes exceeds the limit of {} bytes", valueBytes, kStoreMaxValueBytes);
  }
  const bool multiKey = op == StoreOp::kWait || op == StoreOp::kCheck;
  if (!multiKey && keyCount != 1) return fmt::format("{} takes exactly one key, not {}", toString(op), keyCount);
  if (op != StoreOp::kSet && valueBytes != 0) {
    return fmt::format("{} carries no value, but {} value bytes were announced", toString(op), valueBytes);
  }
  return {};
}

std::string keyProblem(std::uint64_t keyBytes) {
  if (keyBytes <= kStoreMaxKeyBytes) return {};
  return fmt::format("a key of {} bytes exceeds the limit of {} bytes", keyBytes, kStoreMaxKeyBytes);
}

Status checkPreamble(const std::uint8_t* header, const char* what) {
  const auto magic = wire::load<std::uint32_t>(header);
  if (magic != kStoreMagic) return peerError("store {}: bad magic 0x{:08x} (not a Meridian store frame)", what, magic);
  const auto version = wire::load<std::uint16_t>(header + 4);
  if (version != kStoreProtocolVersion) {
    return peerError("store {}: protocol version {}, this build speaks {}", what, version, kStoreProtocolVersion);
  }
  return Status::ok();
}

std::span<std::uint8_t> bytesOf(std::string& s) { return {reinterpret_cast<std::uint8_t*>(s.data()), s.size()}; }

// A StoreByteReader over a buffer; counts what it consumed.
StoreByteReader bufferReader(std::span<const std::uint8_t> frame, std::size_t& offset) {
  return [frame, &offset](std::span<std::uint8_t> dst) -> Status {
    if (dst.empty()) return Status::ok();
    if (dst.size() > frame.size() - offset) {
      return peerError("truncated frame: {} bytes needed at offset {}, {} left", dst.size(), offset,
                       frame.size() - offset);
    }
    std::memcpy(dst.data(), frame.data() + offset, dst.size());
    offset += dst.size();
    return Status::ok();
  };
}

StoreByteReader sealedReader(tcp::SealedSocket& conn, TimePoint deadline) {
  return [&conn, deadline](std::span<std::uint8_t> dst) { return conn.read(dst, deadline); };
}

TimePoint deadlineFromTimeoutMs(std::uint64_t timeoutMs) {
  if (timeoutMs >= kMaxFiniteTimeoutMs) return TimePoint::max();
  return Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(timeoutMs));
}

std::uint64_t timeoutMsUntil(TimePoint deadline) {
  if (deadline == TimePoint::max()) return kStoreNoTimeout;
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  return static_cast<std::uint64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
}

Result<std::chrono::milliseconds> ioTimeoutFromKnob() {
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kTimeoutMs));
  return std::chrono::milliseconds(ms);
}

// Runs one request against the state; the answer carries any error for the client.
StoreResponse execute(StoreState& state, const StoreRequest& request) {
  StoreResponse response;
  response.op = request.op;
  switch (request.op) {
    case StoreOp::kSet:
      response.status = state.set(request.keys[0], request.value);
      break;
    case StoreOp::kGet: {
      auto value = state.get(request.keys[0], deadlineFromTimeoutMs(request.timeoutMs));
      if (value) {
        response.value = std::move(value).value();
      } else {
        response.status = value.status();
      }
      break;
    }
    case StoreOp::kWait:
      response.status = state.wait(request.keys, deadlineFromTimeoutMs(request.timeoutMs));
      break;
    case StoreOp::kAdd: {
      auto sum = state.add(request.keys[0], request.delta);
      if (sum) {
        response.number = sum.value();
      } else {
        response.status = sum.status();
      }
      break;
    }
    case StoreOp::kCheck:
    case StoreOp::kDelete: {
      auto yes = request.op == StoreOp::kCheck ? state.check(request.keys) : state.del(request.keys[0]);
      if (yes) {
        response.number = yes.value() ? 1 : 0;
      } else {
        response.status = yes.status();
      }
      break;
    }
  }
  return response;
}

}  // namespace

const char* toString(StoreOp op) {
  switch (op) {
    case StoreOp::kSet: return "SET";
    case StoreOp::kGet: return "GET";
    case StoreOp::kWait: return "WAIT";
    case StoreOp::kAdd: return "ADD";
    case StoreOp::kCheck: return "CHECK";
    case StoreOp::kDelete: return "DELETE";
  }
  return "?";
}

// ---- Codec -------------------------------------------------------------------------

Result<std::vector<std::uint8_t>> encodeStoreRequest(const StoreRequest& request) {
  if (!isValidOp(static_cast<std::uint8_t>(request.op))) {
    return invalidArgument("store request: unknown op {}", static_cast<int>(request.op));
  }
  if (auto problem = shapeProblem(request.op, request.keys.size(), request.value.size()); !problem.empty()) {
    return invalidArgument("store {}: {}", toString(request.op), problem);
  }
  std::size_t total = kStoreRequestHeaderBytes + request.value.size();
  for (const std::string& key : request.keys) {
    if (auto problem = keyProblem(key.size()); !problem.empty()) {
      return invalidArgument("store {} '{}': {}", toString(request.op), printable(key), problem);
    }
    total += 4 + key.size();
  }
  std::vector<std::uint8_t> out(total);
  std::uint8_t* p = out.data();
  wire::store<std::uint32_t>(p, kStoreMagic);
  wire::store<std::uint16_t>(p + 4, kStoreProtocolVersion);
  p[6] = static_cast<std::uint8_t>(request.op);
  p[7] = 0;
  wire::store<std::uint32_t>(p + 8, static_cast<std::uint32_t>(request.keys.size()));
  wire::store<std::uint32_t>(p + 12, static_cast<std::uint32_t>(request.value.size()));
  wire::store<std::uint64_t>(p + 16, request.timeoutMs);
  wire::store<std::int64_t>(p + 24, request.delta);
  p += kStoreRequestHeaderBytes;
  for (const std::string& key : request.keys) {
    wire::store<std::uint32_t>(p, static_cast<std::uint32_t>(key.size()));
    if (!key.empty()) std::memcpy(p + 4, key.data(), key.size());
    p += 4 + key.size();
  }
  if (!request.value.empty()) std::memcpy(p, request.value.data(), request.value.size());
  return out;
}

Result<StoreRequest> readStoreRequest(const StoreByteReader& read) {
  std::array<std::uint8_t, kStoreRequestHeaderBytes> header{};
  MERIDIAN_RETURN_IF_ERROR(read(header).withContext("store request header"));
  MERIDIAN_RETURN_IF_ERROR(checkPreamble(header.data(), "request"));
  const std::uint8_t opByte = header[6];
  if (!isValidOp(opByte)) return peerError("store request: unknown op {}", opByte);
  if (header[7] != 0) return peerError("store request: reserved byte is {}, expected 0", header[7]);
  const auto op = static_cast<StoreOp>(opByte);
  const auto keyCount = wire::load<std::uint32_t>(&header[8]);
  const auto valueBytes = wire::load<std::uint32_t>(&header[12]);
  if (auto problem = shapeProblem(op, keyCount, valueBytes); !problem.empty()) {
    return peerError("store request {}: {}", toString(op), problem);
  }

  StoreRequest request;
  request.op = op;
  request.timeoutMs = wire::load<std::uint64_t>(&header[16]);
  request.delta = wire::load<std::int64_t>(&header[24]);
  request.keys.reserve(keyCount);
  for (std::uint32_t i = 0; i < keyCount; ++i) {
    std::array<std::uint8_t, 4> lengthBytes{};
    MERIDIAN_RETURN_IF_ERROR(read(lengthBytes).withContext(fmt::format("store request key {} length", i)));
    const auto keyBytes = wire::load<std::uint32_t>(lengthBytes.data());
    if (auto problem = keyProblem(keyBytes); !problem.empty()) {
      return peerError("store request {}: key {}: {}", toString(op), i, problem);
    }
    std::string key(keyBytes, '\0');
    MERIDIAN_RETURN_IF_ERROR(read(bytesOf(key)).withContext(fmt::format("store request key {}", i)));
    request.keys.push_back(std::move(key));
  }
  request.value.resize(valueBytes);
  MERIDIAN_RETURN_IF_ERROR(read(request.value).withContext("store request value"));
  return request;
}

std::vector<std::uint8_t> encodeStoreResponse(const StoreResponse& response) {
  std::string_view message = response.status.message();
  if (message.size() > kStoreMaxErrorBytes) message = message.substr(0, kStoreMaxErrorBytes);
  const std::size_t payloadBytes = response.status.isOk() ? response.value.size() : message.size();
  std::vector<std::uint8_t> out(kStoreResponseHeaderBytes + payloadBytes);
  std::uint8_t* p = out.data();
  wire::store<std::uint32_t>(p, kStoreMagic);
  wire::store<std::uint16_t>(p + 4, kStoreProtocolVersion);
  p[6] = static_cast<std::uint8_t>(response.op);
  p[7] = static_cast<std::uint8_t>(response.status.code());
  wire::store<std::uint32_t>(p + 8, static_cast<std::uint32_t>(payloadBytes));
  wire::store<std::uint32_t>(p + 12, 0);
  wire::store<std::int64_t>(p + 16, response.number);
  if (payloadBytes > 0) {
    const void* payload = response.status.isOk() ? static_cast<const void*>(response.value.data())
                                                 : static_cast<const void*>(message.data());
    std::memcpy(p + kStoreResponseHeaderBytes, payload, payloadBytes);
  }
  return out;
}

Result<StoreResponse> readStoreResponse(const StoreByteReader& read, StoreOp expectedOp) {
  std::array<std::uint8_t, kStoreResponseHeaderBytes> header{};
  MERIDIAN_RETURN_IF_ERROR(read(header).withContext("store response header"));
  MERIDIAN_RETURN_IF_ERROR(checkPreamble(header.data(), "response"));
  if (header[6] != static_cast<std::uint8_t>(expectedOp)) {
    return peerError("store response: answers op {} to a {} request", header[6], toString(expectedOp));
  }
  const std::uint8_t codeByte = header[7];
  if (codeByte > static_cast<std::uint8_t>(StatusCode::kInternal)) {
    return peerError("store response: unknown status code {}", codeByte);
  }
  const auto code = static_cast<StatusCode>(codeByte);
  const auto payloadBytes = wire::load<std::uint32_t>(&header[8]);
  if (wire::load<std::uint32_t>(&header[12]) != 0) return peerError("store response: reserved field is not 0");
  const bool carriesValue = code == StatusCode::kOk && expectedOp == StoreOp::kGet;
  const std::size_t limit = code != StatusCode::kOk ? kStoreMaxErrorBytes : carriesValue ? kStoreMaxValueBytes : 0;
  if (payloadBytes > limit) {
    return peerError("store response to {}: a payload of {} bytes exceeds the limit of {} bytes",
                     toString(expectedOp), payloadBytes, limit);
  }

  StoreResponse response;
  response.op = expectedOp;
  response.number = wire::load<std::int64_t>(&header[16]);
  if (code == StatusCode::kOk) {
    response.value.resize(payloadBytes);
    MERIDIAN_RETURN_IF_ERROR(read(response.value).withContext("store response value"));
  } else {
    std::string message(payloadBytes, '\0');
    MERIDIAN_RETURN_IF_ERROR(read(bytesOf(message)).withContext("store response message"));
    response.status = Status(code, std::move(message));
  }
  return response;
}

Result<StoreRequest> decodeStoreRequest(std::span<const std::uint8_t> frame) {
  std::size_t offset = 0;
  auto request = readStoreRequest(bufferReader(frame, offset));
  if (request && offset != frame.size()) return peerError("store request: {} trailing bytes", frame.size() - offset);
  return request;
}

Result<StoreResponse> decodeStoreResponse(std::span<const std::uint8_t> frame, StoreOp expectedOp) {
  std::size_t offset = 0;
  auto response = readStoreResponse(bufferReader(frame, offset), expectedOp);
  if (response && offset != frame.size()) {
    return peerError("store response: {} trailing bytes", frame.size() - offset);
  }
  return response;
}

// ---- StoreState --------------------------------------------------------------------

StoreState::WaitOutcome StoreState::waitLocked(std::unique_lock<std::mutex>& lock, TimePoint deadline,
                                               const std::function<bool()>& ready) {
  if (ready()) return WaitOutcome::kReady;
  ++waiters_;
  WaitOutcome outcome = WaitOutcome::kTimedOut;
  while (true) {
    if (ready()) {
      outcome = WaitOutcome::kReady;
      break;
    }
    if (shutdown_) {
      outcome = WaitOutcome::kShutdown;
      break;
    }
    if (deadline == TimePoint::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      outcome = ready() ? WaitOutcome::kReady : WaitOutcome::kTimedOut;
      break;
    }
  }
  --waiters_;
  return outcome;
}

Status StoreState::set(const std::string& key, std::span<const std::uint8_t> value) {
  {
    std::lock_guard lock(mu_);
    values_.insert_or_assign(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }
  cv_.notify_all();
  return Status::ok();
}

Result<std::vector<std::uint8_t>> StoreState::get(const std::string& key, TimePoint deadline) {
  std::unique_lock lock(mu_);
  switch (waitLocked(lock, deadline, [&] { return values_.contains(key); })) {
    case WaitOutcome::kReady: return values_.find(key)->second;
    case WaitOutcome::kShutdown: return peerError("store shut down while GET waited for key '{}'", printable(key));
    case WaitOutcome::kTimedOut: break;
  }
  return timeoutError("store GET: timed out waiting for key '{}'", printable(key));
}

Status StoreState::wait(const std::vector<std::string>& keys, TimePoint deadline) {
  std::unique_lock lock(mu_);
  auto allPresent = [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return values_.contains(k); });
  };
  const WaitOutcome outcome = waitLocked(lock, deadline, allPresent);
  if (outcome == WaitOutcome::kReady) return Status::ok();
  const auto missing = std::count_if(keys.begin(), keys.end(), [&](const std::string& k) { return !values_.contains(k); });
  const auto firstMissing =
      std::find_if(keys.begin(), keys.end(), [&](const std::string& k) { return !values_.contains(k); });
  const std::string example = firstMissing == keys.end() ? std::string() : printable(*firstMissing);
  if (outcome == WaitOutcome::kShutdown) {
    return peerError("store shut down while WAIT waited for {} of {} keys (e.g. '{}')", missing, keys.size(), example);
  }
  return timeoutError("store WAIT: timed out with {} of {} keys missing (e.g. '{}')", missing, keys.size(), example);
}

Result<std::int64_t> StoreState::add(const std::string& key, std::int64_t delta) {
  std::int64_t sum = 0;
  {
    std::lock_guard lock(mu_);
    std::int64_t current = 0;
    auto it = values_.find(key);
    if (it != values_.end()) {
      const auto* first = reinterpret_cast<const char*>(it->second.data());
      const auto* last = first + it->second.size();
      auto [end, ec] = std::from_chars(first, last, current);
      if (it->second.empty() || ec != std::errc() || end != last) {
        return invalidArgument("store ADD '{}': the key holds a value that is not an integer counter", printable(key));
      }
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return invalidArgument("store ADD '{}': {} + {} overflows int64", printable(key), current, delta);
    }
    const std::string text = std::to_string(sum);
    values_.insert_or_assign(key, std::vector<std::uint8_t>(text.begin(), text.end()));
  }
  cv_.notify_all();
  return sum;
}

Result<bool> StoreState::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return values_.contains(k); });
}

Result<bool> StoreState::del(const std::string& key) {
  std::lock_guard lock(mu_);
  return values_.erase(key) > 0;
}

void StoreState::shutdown() {
  {
    std::lock_guard lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

std::size_t StoreState::waiterCount() const {
  std::lock_guard lock(mu_);
  return waiters_;
}

std::size_t StoreState::keyCount() const {
  std::lock_guard lock(mu_);
  return values_.size();
}

// ---- StoreServer -------------------------------------------------------------------

namespace {

// A store thread's body: nothing leaves the thread. What escapes is logged once, here; the
// thread ends (the accept thread: no new clients; a client's: that client is dropped).
template <typename Body>
void storeThread(const char* what, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    MLOG_ERROR(kCollectives, "store: {} stopped: {}", what, e.what());
  }
}

// Why `fd` cannot be a store's listening socket on `expectedPort` (0: any), or "" when it can.
std::string whyNotAListeningTcpSocket(int fd, std::uint16_t expectedPort) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fmt::format("descriptor {} is not open: {}", fd, errnoText(errno));
  if (!S_ISSOCK(st.st_mode)) return fmt::format("descriptor {} is not a socket", fd);
  auto option = [fd](int name) {
    int value = -1;
    socklen_t len = sizeof value;
    return ::getsockopt(fd, SOL_SOCKET, name, &value, &len) == 0 ? value : -1;
  };
  if (option(SO_DOMAIN) != AF_INET || option(SO_TYPE) != SOCK_STREAM || option(SO_PROTOCOL) != IPPROTO_TCP) {
    return fmt::format("descriptor {} is not an IPv4 TCP socket", fd);
  }
  if (option(SO_ACCEPTCONN) != 1) return fmt::format("descriptor {} is a TCP socket that is not listening", fd);
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return fmt::format("descriptor {}: getsockname: {}", fd, errnoText(errno));
  }
  if (expectedPort != 0 && ntohs(addr.sin_port) != expectedPort) {
    return fmt::format("descriptor {} listens on port {}, not the store's {}", fd, ntohs(addr.sin_port), expectedPort);
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& bindIp, std::uint16_t port,
                                                        std::string secret) {
  auto listenFd = tcp::listenOn(bindIp, port, /*nonBlocking=*/true);
  if (!listenFd) return listenFd.status().withContext("store server");
  return serve(std::move(listenFd).value(), std::move(secret));
}

Result<std::unique_ptr<StoreServer>> StoreServer::adopt(int listeningFd, std::uint16_t expectedPort, std::string secret) {
  if (std::string why = whyNotAListeningTcpSocket(listeningFd, expectedPort); !why.empty()) {
    return invalidArgument("store server: cannot adopt an inherited socket: {}", why);
  }
  UniqueFd fd(listeningFd);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0 || ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
    return internalError("store server: cannot set up the inherited socket: {}", errnoText(errno));
  }
  return serve(std::move(fd), std::move(secret));
}

Result<std::unique_ptr<StoreServer>> StoreServer::serve(UniqueFd listenFd, std::string secret) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::chrono::milliseconds ioTimeout, ioTimeoutFromKnob());
  MERIDIAN_ASSIGN_OR_RETURN(const WireSecurity mode, wireSecurityFromKnob());
  UniqueFd wakeFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wakeFd.valid()) return internalError("store server: eventfd: {}", std::strerror(errno));
  auto server = std::make_unique<StoreServer>(PrivateTag{}, std::move(listenFd), std::move(wakeFd),
                                              std::move(secret), ioTimeout);
  server->mode_ = mode;
  try {
    server->acceptThread_ =
        std::thread([s = server.get()] { storeThread("accept thread", [s] { s->acceptLoop(); }); });
  } catch (const std::system_error& e) {
    return internalError("store server: cannot start the accept thread: {}", e.what());
  }
  MLOG_INFO(kCollectives, "store: listening on {}", tcp::localAddress(server->listenFd_.get()));
  return server;
}

StoreServer::StoreServer(PrivateTag, UniqueFd listenFd, UniqueFd wakeFd, std::string secret,
                         std::chrono::milliseconds ioTimeout)
    : listenFd_(std::move(listenFd)), wakeFd_(std::move(wakeFd)), secret_(std::move(secret)), ioTimeout_(ioTimeout) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listenFd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) port_ = ntohs(addr.sin_port);
}

StoreServer::~StoreServer() {
  stopping_.store(true);
  const std::uint64_t one = 1;
  if (::write(wakeFd_.get(), &one, sizeof(one)) < 0) {
    MLOG_ERROR(kCollectives, "store: cannot wake the accept thread: {}", std::strerror(errno));
  }
  if (acceptThread_.joinable()) acceptThread_.join();
  // No client is added from here on. Wake every client thread wherever it blocks: in
  // the state (GET/WAIT) or on its socket; then wait for all of them.
  state_.shutdown();
  // A request already taken in is answered before its socket is shut: the usual end of a job
  // is rank 0 leaving the moment the last rank's "done" SET lands, and that SET's reply is
  // still on its way (a GET or WAIT woken by the shutdown just above answers with its error).
  // A client that does not read its reply holds this up for kDrainTimeout at most.
  const TimePoint drainDeadline = Clock::now() + kDrainTimeout;
  for (auto& client : clients_) {
    while (client->answering.load() && !client->done.load() && Clock::now() < drainDeadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  for (auto& client : clients_) ::shutdown(client->fd.get(), SHUT_RDWR);
  for (auto& client : clients_) {
    if (client->thread.joinable()) client->thread.join();
  }
  clients_.clear();
  MLOG_INFO(kCollectives, "store: stopped (port {})", port_);
}

void StoreServer::reapFinishedClients() {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if ((*it)->done.load(std::memory_order_acquire)) {
      (*it)->thread.join();
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

void StoreServer::acceptLoop() {
  pthread_setname_np(pthread_self(), "mer-store-acc");
  while (!stopping_.load()) {
    std::array<pollfd, 2> fds{pollfd{listenFd_.get(), POLLIN, 0}, pollfd{wakeFd_.get(), POLLIN, 0}};
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      MLOG_ERROR(kCollectives, "store: poll on the listening socket failed: {}; no new clients", std::strerror(errno));
      return;
    }
    if (stopping_.load() || fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int fd = ::accept4(listenFd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      MLOG_WARN(kCollectives, "store: accept: {}", std::strerror(err));
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let descriptors or memory free up
        continue;
      }
      return;
    }
    reapFinishedClients();
    auto client = std::make_unique<Client>();
    client->fd = UniqueFd(fd);
    Client& ref = *client;
    try {
      client->thread = std::thread([this, &ref] {
        storeThread("client thread", [this, &ref] { serveClient(ref); });
        ref.done.store(true, std::memory_order_release);  // also when serveClient did not get to it
      });
    } catch (const std::system_error& e) {
      MLOG_WARN(kCollectives, "store: cannot start a client thread, dropping the client: {}", e.what());
      continue;
    }
    clients_.push_back(std::move(client));
  }
}

void StoreServer::serveClient(Client& client) {
  pthread_setname_np(pthread_self(), "mer-store-cli");
  const int fd = client.fd.get();
  const std::string peer = tcp::peerAddress(fd);
  auto info = tcp::serverHandshake(fd, secret_, mode_, Clock::now() + kHandshakeTimeout);
  if (!info) {
    if (!stopping_.load()) {
      MLOG_WARN(kCollectives, "store: refused connection from {} (no valid job-secret handshake): {}", peer,
                info.status().toString());
    }
  } else if (info->info.kind != tcp::ConnectionKind::kStore) {
    MLOG_WARN(kCollectives, "store: refused connection from {}: it is not a store connection (kind {})", peer,
              static_cast<int>(info->info.kind));
  } else {
    tcp::SealedSocket conn(fd, info->keys);
    MLOG_DEBUG(kCollectives, "store: client {} connected", peer);
    while (!stopping_.load()) {
      // Wait for the next frame without a deadline: a close here is an orderly goodbye.
      std::uint8_t probe = 0;
      const ssize_t n = ::recv(fd, &probe, 1, MSG_PEEK);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        MLOG_DEBUG(kCollectives, "store: client {} disconnected", peer);
        break;
      }
      auto request = readStoreRequest(sealedReader(conn, Clock::now() + ioTimeout_));
      if (!request) {
        if (!stopping_.load()) MLOG_WARN(kCollectives, "store: dropping client {}: {}", peer, request.status().toString());
        break;
      }
      client.answering.store(true);  // before the request takes effect: see ~StoreServer
      const std::vector<std::uint8_t> reply = encodeStoreResponse(execute(state_, request.value()));
      Status sent = conn.send(reply, Clock::now() + ioTimeout_);
      client.answering.store(false);
      if (!sent) {
        if (!stopping_.load()) MLOG_WARN(kCollectives, "store: dropping client {}: {}", peer, sent.toString());
        break;
      }
    }
  }
  // The peer sees EOF now; the descriptor is closed when this thread is joined. (A peer
  // that is gone already makes it fail with ENOTCONN: nothing to do then.)
  (void)::shutdown(fd, SHUT_RDWR);
  client.done.store(true, std::memory_order_release);
}

// ---- TcpStore ----------------------------------------------------------------------

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& hostPort, std::string secret,
                                                    TimePoint deadline) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::chrono::milliseconds ioTimeout, ioTimeoutFromKnob());
  MERIDIAN_ASSIGN_OR_RETURN(const tcp::HostPort remote, tcp::parseHostPort(hostPort));
  auto fd = tcp::connectTo(remote, /*localIp=*/"", deadline);
  if (!fd) return fd.status().withContext(fmt::format("store at {}", hostPort));
  tcp::ConnectInfo info;
  info.kind = tcp::ConnectionKind::kStore;
  MERIDIAN_ASSIGN_OR_RETURN(const WireSecurity mode, wireSecurityFromKnob());
  auto keys = tcp::clientHandshake(fd->get(), secret, mode, info, deadline);
  if (!keys) {
    return keys.status().withContext(
        fmt::format("store at {}: authentication failed (every rank must hold the same job secret)", hostPort));
  }
  return std::make_unique<TcpStore>(PrivateTag{}, std::move(fd).value(), keys.value(), hostPort, ioTimeout);
}

TcpStore::TcpStore(PrivateTag, UniqueFd fd, const tcp::SessionKeys& keys, std::string address,
                   std::chrono::milliseconds ioTimeout)
    : fd_(std::move(fd)), conn_(fd_.get(), keys), address_(std::move(address)), ioTimeout_(ioTimeout) {}

TimePoint TcpStore::blockingReplyDeadline(TimePoint deadline) const {
  if (deadline >= TimePoint::max() - ioTimeout_) return TimePoint::max();
  return std::max(deadline, Clock::now()) + ioTimeout_;
}

Result<StoreResponse> TcpStore::roundTrip(const StoreRequest& request, TimePoint replyDeadline) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<std::uint8_t> frame, encodeStoreRequest(request));
  std::lock_guard lock(mu_);
  if (!broken_.isOk()) return broken_;
  Status failure = conn_.send(frame, ioDeadline());
  if (failure) {
    auto response = readStoreResponse(sealedReader(conn_, replyDeadline), request.op);
    if (response) return response;
    failure = response.status();
  }
  // The stream may be mid-frame now: never reuse it.
  failure = failure.withContext(fmt::format("store {} at {}", toString(request.op), address_));
  broken_ = peerError("store connection to {} is unusable after an earlier error: {}", address_, failure.message());
  (void)::shutdown(fd_.get(), SHUT_RDWR);  // only tells the server; ENOTCONN when it is gone already
  return failure;
}

Status TcpStore::set(const std::string& key, std::span<const std::uint8_t> value) {
  StoreRequest request;
  request.op = StoreOp::kSet;
  request.keys = {key};
  request.value.assign(value.begin(), value.end());
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, ioDeadline()));
  return response.status;
}

Result<std::vector<std::uint8_t>> TcpStore::get(const std::string& key, TimePoint deadline) {
  StoreRequest request;
  request.op = StoreOp::kGet;
  request.keys = {key};
  request.timeoutMs = timeoutMsUntil(deadline);
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, blockingReplyDeadline(deadline)));
  if (!response.status.isOk()) return response.status;
  return std::move(response.value);
}

Status TcpStore::wait(const std::vector<std::string>& keys, TimePoint deadline) {
  StoreRequest request;
  request.op = StoreOp::kWait;
  request.keys = keys;
  request.timeoutMs = timeoutMsUntil(deadline);
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, blockingReplyDeadline(deadline)));
  return response.status;
}

Result<std::int64_t> TcpStore::add(const std::string& key, std::int64_t delta) {
  StoreRequest request;
  request.op = StoreOp::kAdd;
  request.keys = {key};
  request.delta = delta;
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, ioDeadline()));
  if (!response.status.isOk()) return response.status;
  return response.number;
}

Result<bool> TcpStore::check(const std::vector<std::string>& keys) {
  StoreRequest request;
  request.op = StoreOp::kCheck;
  request.keys = keys;
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, ioDeadline()));
  if (!response.status.isOk()) return response.status;
  return response.number != 0;
}

Result<bool> TcpStore::del(const std::string& key) {
  StoreRequest request;
  request.op = StoreOp::kDelete;
  request.keys = {key};
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, ioDeadline()));
  if (!response.status.isOk()) return response.status;
  return response.number != 0;
}

// ---- Helpers -----------------------------------------------------------------------

Result<std::vector<std::vector<std::uint8_t>>> storeAllGather(Store& store, const std::string& prefix, int rank,
                                                              int worldSize, std::span<const std::uint8_t> blob,
                                                              TimePoint deadline) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    return invalidArgument("storeAllGather '{}': rank {} is outside a world of {}", printable(prefix), rank, worldSize);
  }
  MERIDIAN_RETURN_IF_ERROR(store.set(fmt::format("{}/{}", prefix, rank), blob));
  std::vector<std::vector<std::uint8_t>> all(static_cast<std::size_t>(worldSize));
  for (int r = 0; r < worldSize; ++r) {
    if (r == rank) {
      all[static_cast<std::size_t>(r)].assign(blob.begin(), blob.end());
      continue;
    }
    auto value = store.get(fmt::format("{}/{}", prefix, r), deadline);
    if (!value) {
      return value.status().withContext(
          fmt::format("storeAllGather '{}': rank {} waiting for rank {}", printable(prefix), rank, r));
    }
    all[static_cast<std::size_t>(r)] = std::move(value).value();
  }
  return all;
}

Status storeBarrier(Store& store, const std::string& prefix, int worldSize, TimePoint deadline) {
  if (worldSize < 1) return invalidArgument("storeBarrier '{}': world size {}", printable(prefix), worldSize);
  const std::string arrivedKey = prefix + "/arrived";
  const std::string releasedKey = prefix + "/released";
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t arrived, store.add(arrivedKey, 1));
  if (arrived > worldSize) {
    return invalidArgument("storeBarrier '{}': {} arrivals for {} ranks (is the prefix reused?)", printable(prefix),
                           arrived, worldSize);
  }
  if (arrived == worldSize) {
    const std::array<std::uint8_t, 1> one{1};
    MERIDIAN_RETURN_IF_ERROR(store.set(releasedKey, one));
  }
  Status released = store.wait({releasedKey}, deadline);
  if (released.code() == StatusCode::kTimeout) {
    // Say how far the barrier got: the counter exists, so this does not block.
    auto count = store.get(arrivedKey, Clock::now());
    const std::string seen = count ? std::string(count->begin(), count->end()) : std::string("?");
    return timeoutError("storeBarrier '{}': timed out with {} of {} ranks arrived", printable(prefix), seen,
                        worldSize);
  }
  return released.withContext(fmt::format("storeBarrier '{}'", printable(prefix)));
}

}  // namespace meridian::bootstrap
