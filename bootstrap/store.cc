// The bootstrap store: wire codec, StoreState and the TcpStore client (the server is in
// store_server.cc).
#include "bootstrap/store.h"

#include "bootstrap/store_detail.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "core/knobs.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace meridian::bootstrap {
namespace tcp = transport::tcp;

namespace detail {

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

Result<std::chrono::milliseconds> ioTimeoutFromKnob() {
  MERIDIAN_ASSIGN_OR_RETURN(const std::int64_t ms, readKnobInt(knobs::kTimeoutMs));
  return std::chrono::milliseconds(ms);
}

}  // namespace detail

namespace {

using detail::printable;

// Ops a client may send (kIdleClose is the server's alone).
bool isValidOp(std::uint8_t op) {
  return (op >= 1 && op <= 6) || op == static_cast<std::uint8_t>(StoreOp::kGetMany);  // kIdleClose: never asked
}

// GET-MANY's payload: per value, u32 valueBytes then the value.
std::vector<std::uint8_t> packValues(const std::vector<std::vector<std::uint8_t>>& values) {
  std::size_t bytes = 0;
  for (const auto& v : values) bytes += 4 + v.size();
  std::vector<std::uint8_t> out(bytes);
  std::uint8_t* p = out.data();
  for (const auto& v : values) {
    wire::store<std::uint32_t>(p, static_cast<std::uint32_t>(v.size()));
    if (!v.empty()) std::memcpy(p + 4, v.data(), v.size());
    p += 4 + v.size();
  }
  return out;
}

// Every length checked against what is left before anything is copied.
Result<std::vector<std::vector<std::uint8_t>>> unpackValues(std::span<const std::uint8_t> payload) {
  std::vector<std::vector<std::uint8_t>> values;
  std::size_t at = 0;
  while (at < payload.size()) {
    if (values.size() >= kStoreMaxKeys) return peerError("store GET-MANY response: more than {} values", kStoreMaxKeys);
    if (payload.size() - at < 4) return peerError("store GET-MANY response: a value length cut short at byte {}", at);
    const auto n = wire::load<std::uint32_t>(payload.data() + at);
    at += 4;
    if (n > payload.size() - at) {
      return peerError("store GET-MANY response: a value of {} bytes at byte {}, {} left", n, at, payload.size() - at);
    }
    values.emplace_back(payload.begin() + static_cast<std::ptrdiff_t>(at),
                        payload.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return values;
}

// The limits and the op's shape, checked from header fields alone (before any allocation).
// Empty when fine, else what is wrong.
std::string shapeProblem(StoreOp op, std::uint64_t keyCount, std::uint64_t valueBytes) {
  if (keyCount > kStoreMaxKeys) return fmt::format("{} keys exceed the limit of {}", keyCount, kStoreMaxKeys);
  if (valueBytes > kStoreMaxValueBytes) {
    return fmt::format("a value of {} bytes exceeds the limit of {} bytes", valueBytes, kStoreMaxValueBytes);
  }
  const bool multiKey = op == StoreOp::kWait || op == StoreOp::kCheck || op == StoreOp::kGetMany;
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

std::uint64_t timeoutMsUntil(TimePoint deadline) {
  if (deadline == TimePoint::max()) return kStoreNoTimeout;
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  return static_cast<std::uint64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
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
    case StoreOp::kIdleClose: return "IDLE-CLOSE";
    case StoreOp::kGetMany: return "GET-MANY";
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

std::size_t StoreRequestParser::wantBytes() const {
  switch (step_) {
    case Step::kHeader: return kStoreRequestHeaderBytes - fieldGot_;
    case Step::kKeyLength: return 4 - fieldGot_;
    case Step::kKey: return keyBytes_ - request_.keys.back().size();
    case Step::kValue: return static_cast<std::size_t>(valueBytes_ - valueGot_);
    case Step::kDone: return 0;
  }
  return 0;
}

std::string StoreRequestParser::what() const {
  switch (step_) {
    case Step::kHeader: return "store request header";
    case Step::kKeyLength: return fmt::format("store request key {} length", request_.keys.size());
    case Step::kKey: return fmt::format("store request key {}", request_.keys.size() - 1);
    case Step::kValue: return "store request value";
    case Step::kDone: return "store request";
  }
  return "store request";
}

Status StoreRequestParser::feed(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > wantBytes()) {
    step_ = Step::kDone;
    return internalError("store request parser: fed {} bytes where {} were due", bytes.size(), wantBytes());
  }
  switch (step_) {
    case Step::kHeader:
    case Step::kKeyLength:
      std::memcpy(field_.data() + fieldGot_, bytes.data(), bytes.size());
      fieldGot_ += bytes.size();
      return wantBytes() == 0 ? fieldDone() : Status::ok();
    case Step::kKey:
      request_.keys.back().append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      if (wantBytes() == 0) afterKeys();
      return Status::ok();
    case Step::kValue:
      if (!discardValue_) request_.value.insert(request_.value.end(), bytes.begin(), bytes.end());
      valueGot_ += bytes.size();
      if (valueGot_ == valueBytes_) step_ = Step::kDone;
      return Status::ok();
    case Step::kDone: break;
  }
  return Status::ok();
}

// A header or a key length is whole: check it, then expect what it announced.
Status StoreRequestParser::fieldDone() {
  fieldGot_ = 0;
  if (step_ == Step::kKeyLength) {
    keyBytes_ = wire::load<std::uint32_t>(field_.data());
    if (auto problem = keyProblem(keyBytes_); !problem.empty()) {
      step_ = Step::kDone;
      return peerError("store request {}: key {}: {}", toString(request_.op), request_.keys.size(), problem);
    }
    request_.keys.emplace_back();
    request_.keys.back().reserve(keyBytes_);
    step_ = Step::kKey;
    if (keyBytes_ == 0) afterKeys();
    return Status::ok();
  }
  step_ = Step::kDone;  // until the header passes
  const std::uint8_t* header = field_.data();
  MERIDIAN_RETURN_IF_ERROR(checkPreamble(header, "request"));
  const std::uint8_t opByte = header[6];
  if (!isValidOp(opByte)) return peerError("store request: unknown op {}", opByte);
  if (header[7] != 0) return peerError("store request: reserved byte is {}, expected 0", header[7]);
  const auto op = static_cast<StoreOp>(opByte);
  keyCount_ = wire::load<std::uint32_t>(header + 8);
  valueBytes_ = wire::load<std::uint32_t>(header + 12);
  if (auto problem = shapeProblem(op, keyCount_, valueBytes_); !problem.empty()) {
    return peerError("store request {}: {}", toString(op), problem);
  }
  request_ = StoreRequest{};
  request_.op = op;
  request_.timeoutMs = wire::load<std::uint64_t>(header + 16);
  request_.delta = wire::load<std::int64_t>(header + 24);
  request_.keys.reserve(keyCount_);
  step_ = Step::kKeyLength;
  if (keyCount_ == 0) afterKeys();
  return Status::ok();
}

// Every key announced so far is whole: the next key's length, or the value.
void StoreRequestParser::afterKeys() {
  if (request_.keys.size() < keyCount_) {
    step_ = Step::kKeyLength;
    return;
  }
  valueGot_ = 0;
  if (valueBytes_ == 0) {
    step_ = Step::kDone;
    return;
  }
  if (!discardValue_) request_.value.reserve(std::min<std::size_t>(valueBytes_, valueReserveBytes_));
  step_ = Step::kValue;
}

StoreRequest StoreRequestParser::take() {
  StoreRequest out = std::move(request_);
  request_ = StoreRequest{};
  step_ = Step::kHeader;
  fieldGot_ = 0;
  keyCount_ = keyBytes_ = valueBytes_ = 0;
  valueGot_ = 0;
  discardValue_ = false;
  return out;
}

Result<StoreRequest> readStoreRequest(const StoreByteReader& read) {
  // Large values come in pieces, so each read is bounded whatever the frame announced.
  constexpr std::size_t kPieceBytes = 64 * 1024;
  StoreRequestParser parser;
  std::vector<std::uint8_t> piece;
  while (!parser.done()) {
    piece.resize(std::min(parser.wantBytes(), kPieceBytes));
    MERIDIAN_RETURN_IF_ERROR(read(piece).withContext(parser.what()));
    MERIDIAN_RETURN_IF_ERROR(parser.feed(piece));
  }
  return parser.take();
}

std::vector<std::uint8_t> encodeStoreResponse(const StoreResponse& response) {
  std::string_view message = response.status.message();
  if (message.size() > kStoreMaxErrorBytes) message = message.substr(0, kStoreMaxErrorBytes);
  const std::vector<std::uint8_t> packed =
      response.op == StoreOp::kGetMany && response.status.isOk() ? packValues(response.values) : std::vector<std::uint8_t>{};
  const std::vector<std::uint8_t>& value = response.op == StoreOp::kGetMany ? packed : response.value;
  const std::size_t payloadBytes = response.status.isOk() ? value.size() : message.size();
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
    const void* payload = response.status.isOk() ? static_cast<const void*>(value.data())
                                                 : static_cast<const void*>(message.data());
    std::memcpy(p + kStoreResponseHeaderBytes, payload, payloadBytes);
  }
  return out;
}

Result<StoreResponse> readStoreResponse(const StoreByteReader& read, StoreOp expectedOp) {
  std::array<std::uint8_t, kStoreResponseHeaderBytes> header{};
  MERIDIAN_RETURN_IF_ERROR(read(header).withContext("store response header"));
  MERIDIAN_RETURN_IF_ERROR(checkPreamble(header.data(), "response"));
  const bool idleClose = header[6] == static_cast<std::uint8_t>(StoreOp::kIdleClose);
  if (header[6] != static_cast<std::uint8_t>(expectedOp) && !idleClose) {
    return peerError("store response: answers op {} to a {} request", header[6], toString(expectedOp));
  }
  const std::uint8_t codeByte = header[7];
  if (codeByte > static_cast<std::uint8_t>(StatusCode::kInternal)) {
    return peerError("store response: unknown status code {}", codeByte);
  }
  const auto code = static_cast<StatusCode>(codeByte);
  if (idleClose && code == StatusCode::kOk) return peerError("store response: an idle-close notice without a reason");
  const auto payloadBytes = wire::load<std::uint32_t>(&header[8]);
  if (wire::load<std::uint32_t>(&header[12]) != 0) return peerError("store response: reserved field is not 0");
  const bool carriesValue = code == StatusCode::kOk && (expectedOp == StoreOp::kGet || expectedOp == StoreOp::kGetMany);
  const std::size_t limit = code != StatusCode::kOk ? kStoreMaxErrorBytes : carriesValue ? kStoreMaxValueBytes : 0;
  if (payloadBytes > limit) {
    return peerError("store response to {}: a payload of {} bytes exceeds the limit of {} bytes",
                     toString(expectedOp), payloadBytes, limit);
  }

  StoreResponse response;
  response.op = idleClose ? StoreOp::kIdleClose : expectedOp;
  response.number = wire::load<std::int64_t>(&header[16]);
  if (code == StatusCode::kOk) {
    response.value.resize(payloadBytes);
    MERIDIAN_RETURN_IF_ERROR(read(response.value).withContext("store response value"));
    if (response.op == StoreOp::kGetMany) {
      MERIDIAN_ASSIGN_OR_RETURN(response.values, unpackValues(response.value));
      response.value.clear();
    }
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

Status StoreState::putLocked(const std::string& key, std::vector<std::uint8_t> value, const char* op) {
  auto it = values_.find(key);
  const std::uint64_t before = it == values_.end() ? 0 : key.size() + it->second.size();
  const std::uint64_t after = key.size() + value.size();
  if (after > before && heldBytes_ + reservedBytes_ + (after - before) > maxBytes_) {
    return invalidArgument(
        "store {} '{}': {} more bytes would take the store past its budget of {} bytes (MERIDIAN_STORE_MAX_BYTES; "
        "{} held, {} promised to values still arriving)",
        op, printable(key), after - before, maxBytes_, heldBytes_, reservedBytes_);
  }
  heldBytes_ = heldBytes_ - before + after;
  values_.insert_or_assign(key, std::move(value));
  return Status::ok();
}

Status StoreState::set(const std::string& key, std::span<const std::uint8_t> value) {
  {
    std::lock_guard lock(mu_);
    MERIDIAN_RETURN_IF_ERROR(putLocked(key, std::vector<std::uint8_t>(value.begin(), value.end()), "SET"));
  }
  cv_.notify_all();
  return Status::ok();
}

Status StoreState::reserve(std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (heldBytes_ + reservedBytes_ + bytes > maxBytes_) {
    return invalidArgument("it does not fit the store's budget of {} bytes (MERIDIAN_STORE_MAX_BYTES; {} held, {} in "
                           "values arriving)",
                           maxBytes_, heldBytes_, reservedBytes_);
  }
  reservedBytes_ += bytes;
  return Status::ok();
}

bool StoreState::fits(std::uint64_t bytes) const {
  std::lock_guard lock(mu_);
  return heldBytes_ + reservedBytes_ + bytes <= maxBytes_;
}

void StoreState::release(std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  reservedBytes_ -= std::min(bytes, reservedBytes_);
}

std::uint64_t StoreState::bytesHeld() const {
  std::lock_guard lock(mu_);
  return heldBytes_;
}

Result<std::vector<std::vector<std::uint8_t>>> Store::setAndGetMany(const std::string& key,
                                                                   std::span<const std::uint8_t> value,
                                                                   const std::vector<std::string>& keys,
                                                                   TimePoint deadline) {
  MERIDIAN_RETURN_IF_ERROR(set(key, value));
  return getMany(keys, deadline);
}

Result<std::vector<std::vector<std::uint8_t>>> Store::getMany(const std::vector<std::string>& keys, TimePoint deadline) {
  MERIDIAN_RETURN_IF_ERROR(wait(keys, deadline));
  std::vector<std::vector<std::uint8_t>> values;
  for (const auto& key : keys) {
    MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::uint8_t> v, get(key, deadline));
    values.push_back(std::move(v));
  }
  return values;
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
    MERIDIAN_RETURN_IF_ERROR(putLocked(key, std::vector<std::uint8_t>(text.begin(), text.end()), "ADD"));
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
  auto it = values_.find(key);
  if (it == values_.end()) return false;
  heldBytes_ -= key.size() + it->second.size();
  values_.erase(it);
  return true;
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

// ---- TcpStore ----------------------------------------------------------------------

Result<TcpStore::Dialed> TcpStore::dial(const std::string& hostPort, const std::string& secret, TimePoint deadline) {
  MERIDIAN_ASSIGN_OR_RETURN(const tcp::HostPort remote, tcp::parseHostPort(hostPort));
  auto fd = tcp::connectTo(remote, /*localIp=*/"", deadline);
  if (!fd) return fd.status().withContext(fmt::format("store at {}", hostPort));
  tcp::ConnectInfo info;
  info.kind = tcp::ConnectionKind::kStore;
  MERIDIAN_ASSIGN_OR_RETURN(const WireSecurity mode, wireSecurityFromKnob());
  auto keys = tcp::clientHandshake(fd->get(), secret, mode, info, deadline);
  // A timeout says "timed out waiting for the handshake"; a wrong secret says "job secret";
  // a connection the server closed says that. None is blamed on another.
  if (!keys) return keys.status().withContext(fmt::format("store at {}", hostPort));
  return Dialed{std::move(fd).value(), keys.value()};
}

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& hostPort, std::string secret,
                                                    TimePoint deadline) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::chrono::milliseconds ioTimeout, detail::ioTimeoutFromKnob());
  MERIDIAN_ASSIGN_OR_RETURN(Dialed dialed, dial(hostPort, secret, deadline));
  return std::make_unique<TcpStore>(PrivateTag{}, std::move(dialed.fd), dialed.keys, hostPort, std::move(secret),
                                    ioTimeout);
}

TcpStore::TcpStore(PrivateTag, UniqueFd fd, const tcp::SessionKeys& keys, std::string address, std::string secret,
                   std::chrono::milliseconds ioTimeout)
    : fd_(std::move(fd)),
      conn_(std::make_unique<tcp::SealedSocket>(fd_.get(), keys)),
      address_(std::move(address)),
      secret_(std::move(secret)),
      ioTimeout_(ioTimeout) {}

TimePoint TcpStore::blockingReplyDeadline(TimePoint deadline) const {
  if (deadline >= TimePoint::max() - ioTimeout_) return TimePoint::max();
  return std::max(deadline, Clock::now()) + ioTimeout_;
}

Result<bool> TcpStore::closedForIdleness() {
  pollfd p{fd_.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;  // nothing said: the connection is as we left it
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse note, readStoreResponse(
      [this](std::span<std::uint8_t> dst) { return conn_->read(dst, ioDeadline()); }, StoreOp::kIdleClose));
  if (note.op != StoreOp::kIdleClose) return peerError("the server sent an answer nobody asked for");
  return true;
}

Status TcpStore::reconnect() {
  MERIDIAN_ASSIGN_OR_RETURN(Dialed dialed, dial(address_, secret_, ioDeadline()));
  conn_.reset();
  fd_ = std::move(dialed.fd);
  conn_ = std::make_unique<tcp::SealedSocket>(fd_.get(), dialed.keys);
  reconnects_.fetch_add(1);
  MLOG_DEBUG(kCollectives, "store: reconnected to {} after the server closed an idle connection", address_);
  return Status::ok();
}

Result<std::vector<StoreResponse>> TcpStore::exchange(std::span<const std::uint8_t> frames,
                                                      std::span<const StoreRequest> requests, TimePoint replyDeadline) {
  MERIDIAN_RETURN_IF_ERROR(conn_->send(frames, ioDeadline()));
  std::vector<StoreResponse> responses;
  for (const StoreRequest& request : requests) {
    MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response,
                              readStoreResponse([&](std::span<std::uint8_t> dst) { return conn_->read(dst, replyDeadline); },
                                                request.op));
    const bool idleClose = response.op == StoreOp::kIdleClose;
    responses.push_back(std::move(response));
    if (idleClose) break;  // nothing after it was executed
  }
  return responses;
}

Result<StoreResponse> TcpStore::roundTrip(const StoreRequest& request, TimePoint replyDeadline) {
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<StoreResponse> responses, roundTrips({&request, 1}, replyDeadline));
  return std::move(responses.front());
}

Result<std::vector<StoreResponse>> TcpStore::roundTrips(std::span<const StoreRequest> requests, TimePoint replyDeadline) {
  std::vector<std::uint8_t> frames;
  for (const StoreRequest& request : requests) {
    MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::uint8_t> frame, encodeStoreRequest(request));
    if (frames.empty()) {
      frames = std::move(frame);  // one request (most calls): its frame as it is
    } else {
      frames.insert(frames.end(), frame.begin(), frame.end());
    }
  }
  std::lock_guard lock(mu_);
  if (!broken_.isOk()) return broken_;
  // The server closes a connection idle for MERIDIAN_STORE_IDLE_TIMEOUT_MS, saying so first;
  // nothing sent after that notice was executed, so the requests go again on a new one.
  auto idleClosed = [](const Result<std::vector<StoreResponse>>& r) {
    return r.isOk() && !r->empty() && r->back().op == StoreOp::kIdleClose;
  };
  Result<bool> idle = closedForIdleness();
  Status failure = idle.status();
  if (idle.isOk() && idle.value()) failure = reconnect();
  if (failure) {
    auto responses = exchange(frames, requests, replyDeadline);
    if (idleClosed(responses)) {
      // The server answers requests one at a time: a notice can only come first.
      failure = responses->size() == 1 ? reconnect() : peerError("closed for idleness between pipelined requests");
      if (failure) responses = exchange(frames, requests, replyDeadline);
      if (idleClosed(responses)) responses = peerError("closed for idleness twice in a row");
    }
    if (failure && responses) return responses;
    if (failure) failure = responses.status();
  }
  // The stream may be mid-frame now: never reuse it.
  failure = failure.withContext(fmt::format("store {} at {}", toString(requests.front().op), address_));
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

Result<std::vector<std::vector<std::uint8_t>>> TcpStore::getMany(const std::vector<std::string>& keys,
                                                                TimePoint deadline) {
  StoreRequest request;
  request.op = StoreOp::kGetMany;
  request.keys = keys;
  request.timeoutMs = timeoutMsUntil(deadline);
  MERIDIAN_ASSIGN_OR_RETURN(StoreResponse response, roundTrip(request, blockingReplyDeadline(deadline)));
  return valuesOf(std::move(response), keys.size());
}

Result<std::vector<std::vector<std::uint8_t>>> TcpStore::valuesOf(StoreResponse response, std::size_t keys) const {
  if (!response.status.isOk()) return response.status;
  if (response.values.size() != keys) {
    return peerError("store GET-MANY at {}: {} values for {} keys", address_, response.values.size(), keys);
  }
  return std::move(response.values);
}

Result<std::vector<std::vector<std::uint8_t>>> TcpStore::setAndGetMany(const std::string& key,
                                                                      std::span<const std::uint8_t> value,
                                                                      const std::vector<std::string>& keys,
                                                                      TimePoint deadline) {
  // Both requests leave together: the server answers them in order, so the SET is in before
  // the GET-MANY waits, and the pair costs one round trip.
  std::array<StoreRequest, 2> requests;
  requests[0].op = StoreOp::kSet;
  requests[0].keys = {key};
  requests[0].value.assign(value.begin(), value.end());
  requests[1].op = StoreOp::kGetMany;
  requests[1].keys = keys;
  requests[1].timeoutMs = timeoutMsUntil(deadline);
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<StoreResponse> responses, roundTrips(requests, blockingReplyDeadline(deadline)));
  if (responses.size() != requests.size()) return internalError("store: {} answers to 2 requests", responses.size());
  if (!responses[0].status.isOk()) return responses[0].status.withContext(fmt::format("store SET of '{}'", printable(key)));
  return valuesOf(std::move(responses[1]), keys.size());
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
  // This rank's blob in and every other rank's out in one round trip to a TcpStore's server:
  // a round trip per read costs seconds for a few ranks across an ocean.
  std::vector<std::string> keys;
  for (int r = 0; r < worldSize; ++r) {
    if (r != rank) keys.push_back(fmt::format("{}/{}", prefix, r));
  }
  std::vector<std::vector<std::uint8_t>> all(static_cast<std::size_t>(worldSize));
  all[static_cast<std::size_t>(rank)].assign(blob.begin(), blob.end());
  const std::string mine = fmt::format("{}/{}", prefix, rank);
  if (keys.empty()) {
    MERIDIAN_RETURN_IF_ERROR(store.set(mine, blob));
    return all;
  }
  auto values = store.setAndGetMany(mine, blob, keys, deadline);
  if (!values) {
    return values.status().withContext(fmt::format("storeAllGather '{}': rank {} waiting for the {} others",
                                                   printable(prefix), rank, keys.size()));
  }
  for (int r = 0, i = 0; r < worldSize; ++r) {
    if (r != rank) all[static_cast<std::size_t>(r)] = std::move(values.value()[static_cast<std::size_t>(i++)]);
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
