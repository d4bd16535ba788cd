// Checkpoint files: atomic writes (temp file, fsync, rename, fsync dir), verified reads
// (bounds before allocation, HMAC-SHA256 over the body) and the directory's bookkeeping.
#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>

#include <fmt/ranges.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/wire.h"

namespace meridian::trainer {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'M', 'R', 'D', 'C', 'K', 'P', 'T', '1'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 8 + 4;       // magic, version, step, count
constexpr std::size_t kSectionFixedBytes = 2 + 8;         // name length, data length
constexpr std::size_t kDigestBytes = 32;                  // HMAC-SHA256
constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kSuffix = ".mrc";
// Small pieces are gathered into one write; data at least this large goes straight out.
constexpr std::size_t kDirectWriteBytes = 64 * 1024;

template <typename... Args>
Status corrupt(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  return invalidArgument("{}: corrupt checkpoint ({})", path, fmt::format(f, std::forward<Args>(args)...));
}

// The step of a file named exactly like checkpointPath() names it, else nothing.
std::optional<std::uint64_t> parseCheckpointName(std::string_view name) {
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) || !name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  std::uint64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (fmt::format("{:012d}", step) != digits) return std::nullopt;  // canonical names only
  return step;
}

// Steps of the files in dir named like checkpoints, newest first; nullopt when dir does
// not exist.
Result<std::optional<std::vector<std::uint64_t>>> listCheckpointSteps(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec) && !ec) return std::optional<std::vector<std::uint64_t>>();
  std::vector<std::uint64_t> steps;
  fs::directory_iterator it(dir, ec);
  if (ec) return invalidArgument("cannot list checkpoint directory {}: {}", dir, ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (std::optional<std::uint64_t> step = parseCheckpointName(it->path().filename().native())) {
      steps.push_back(*step);
    }
  }
  if (ec) return invalidArgument("cannot list checkpoint directory {}: {}", dir, ec.message());
  std::sort(steps.rbegin(), steps.rend());
  return std::optional<std::vector<std::uint64_t>>(std::move(steps));
}

struct MacFree {
  void operator()(EVP_MAC* mac) const { EVP_MAC_free(mac); }
};
struct MacCtxFree {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};

// Writes a checkpoint file's bytes to fd, signing them as they go (HMAC-SHA256 under the
// checkpoint key, OpenSSL's EVP_MAC: core/secret.h's hmacSha256 takes the whole message
// at once); finish() appends the digest. Errors name the file being written.
class SigningWriter {
 public:
  SigningWriter(int fd, const std::string& path) : fd_(fd), path_(path) {}

  Status start(const CheckpointKey& key) {
    mac_.reset(EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr));
    if (mac_) ctx_.reset(EVP_MAC_CTX_new(mac_.get()));
    char digest[] = OSSL_DIGEST_NAME_SHA2_256;
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_construct_end()};
    if (!ctx_ || EVP_MAC_init(ctx_.get(), key.data(), key.size(), params) != 1) {
      return internalError("HMAC-SHA256 initialisation failed in OpenSSL");
    }
    return Status::ok();
  }

  Status put(const std::uint8_t* p, std::size_t n) {
    if (n == 0) return Status::ok();
    if (EVP_MAC_update(ctx_.get(), p, n) != 1) return internalError("HMAC-SHA256 failed in OpenSSL");
    if (n < kDirectWriteBytes) {
      pending_.insert(pending_.end(), p, p + n);
      return pending_.size() >= kDirectWriteBytes ? flush() : Status::ok();
    }
    MERIDIAN_RETURN_IF_ERROR(flush());
    return writeAll(p, n);
  }

  template <typename T>
  Status putInt(T v) {
    std::uint8_t b[sizeof(T)];
    wire::store(b, v);
    return put(b, sizeof(T));
  }

  Status finish() {
    std::uint8_t digest[EVP_MAX_MD_SIZE];
    std::size_t len = 0;
    if (EVP_MAC_final(ctx_.get(), digest, &len, sizeof(digest)) != 1 || len != kDigestBytes) {
      return internalError("HMAC-SHA256 failed in OpenSSL");
    }
    pending_.insert(pending_.end(), digest, digest + kDigestBytes);
    return flush();
  }

 private:
  Status flush() {
    Status st = writeAll(pending_.data(), pending_.size());
    pending_.clear();
    return st;
  }

  Status writeAll(const std::uint8_t* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return invalidArgument("cannot write {}: {}", path_, errnoText(errno));
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return Status::ok();
  }

  int fd_;
  const std::string& path_;
  std::unique_ptr<EVP_MAC, MacFree> mac_;
  std::unique_ptr<EVP_MAC_CTX, MacCtxFree> ctx_;
  std::vector<std::uint8_t> pending_;
};

// A temporary file next to the checkpoint: removed unless it was renamed into place.
class TempFile {
 public:
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  Status create(const std::string& dir, std::uint64_t step) {
    for (int attempt = 0;; ++attempt) {
      std::uint8_t nonce[8];
      randomBytes(nonce);
      std::string path = fmt::format("{}/.ckpt-{:012d}.mrc.tmp-{:02x}", dir, step, fmt::join(nonce, ""));
      fd_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (fd_.valid()) {
        path_ = std::move(path);
        return Status::ok();
      }
      if (errno != EEXIST || attempt == 3) return invalidArgument("cannot create {}: {}", path, errnoText(errno));
    }
  }
  // fsync and close; the data is on disk when this returns ok.
  Status sync() {
    if (::fsync(fd_.get()) != 0) return invalidArgument("cannot fsync {}: {}", path_, errnoText(errno));
    if (::close(fd_.release()) != 0) return invalidArgument("cannot close {}: {}", path_, errnoText(errno));
    return Status::ok();
  }
  Status renameTo(const std::string& target) {
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      return invalidArgument("cannot rename {} to {}: {}", path_, target, errnoText(errno));
    }
    path_.clear();
    return Status::ok();
  }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

 private:
  UniqueFd fd_;
  std::string path_;
};

// Makes the rename durable. Some file systems cannot fsync a directory (EINVAL): fine.
Status syncDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return invalidArgument("cannot open directory {} to fsync it: {}", dir, errnoText(errno));
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    return invalidArgument("cannot fsync directory {}: {}", dir, errnoText(errno));
  }
  return Status::ok();
}

Status checkSections(const std::vector<CheckpointSection>& sections) {
  if (sections.size() > kCheckpointMaxSections) {
    return invalidArgument("checkpoint: {} sections, more than the limit of {}", sections.size(),
                           kCheckpointMaxSections);
  }
  std::set<std::string_view> names;
  for (const CheckpointSection& s : sections) {
    if (s.name.empty() || s.name.size() > kCheckpointMaxNameBytes) {
      return invalidArgument("checkpoint: section name '{}' is {} bytes, expected 1..{}", s.name, s.name.size(),
                             kCheckpointMaxNameBytes);
    }
    if (!names.insert(s.name).second) return invalidArgument("checkpoint: two sections are named '{}'", s.name);
  }
  return Status::ok();
}

// Deletes the checkpoints older than `step` beyond the newest `keep` that verify (the one
// of `step`, just written, counted): a file that does not verify takes no place among
// them. Failures are logged: the new checkpoint is already safe.
void pruneCheckpoints(const std::string& dir, const CheckpointKey& key, std::uint64_t step, int keep) {
  Result<std::optional<std::vector<std::uint64_t>>> listed = listCheckpointSteps(dir);
  if (!listed.isOk() || !listed.value()) {
    MLOG_WARN(kTrainer, "checkpoint: not pruning old checkpoints: {}", listed.status().message());
    return;
  }
  std::vector<std::uint64_t> newer;
  std::size_t kept = 0;
  for (std::uint64_t s : *listed.value()) {  // newest first
    if (s > step) {
      newer.push_back(s);
    } else if (kept < static_cast<std::size_t>(keep)) {
      if (s == step) {
        ++kept;
      } else if (Result<Checkpoint> old = readCheckpoint(checkpointPath(dir, s), key); old.isOk()) {
        ++kept;
      } else {
        MLOG_WARN(kTrainer, "checkpoint: not counting step {} among the {} kept: {}", s, keep, old.status().message());
      }
    } else {
      const std::string path = checkpointPath(dir, s);
      if (::unlink(path.c_str()) != 0) {
        MLOG_WARN(kTrainer, "checkpoint: cannot delete old checkpoint {}: {}", path, errnoText(errno));
      } else {
        MLOG_DEBUG(kTrainer, "checkpoint: deleted old checkpoint {}", path);
      }
    }
  }
  if (!newer.empty()) {
    MLOG_WARN(kTrainer,
              "checkpoint: {} holds checkpoints of steps after {} (steps {}), left by a run that was rolled "
              "back; loadLatestCheckpoint prefers them unless given a maxStep",
              dir, step, fmt::join(newer, ", "));
  }
}

Result<std::vector<std::uint8_t>> readWholeFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return invalidArgument("cannot read {}: {}", path, errnoText(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return invalidArgument("cannot read {}: {}", path, errnoText(errno));
  if (!S_ISREG(st.st_mode)) return invalidArgument("cannot read {}: not a regular file", path);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return invalidArgument("cannot read {}: {}", path, errnoText(errno));
    }
    if (r == 0) break;  // the file shrank while being read: the checks below see a truncated file
    got += static_cast<std::size_t>(r);
  }
  bytes.resize(got);
  return bytes;
}

// readCheckpoint, then the caller's check (a failure reads like any other defect).
Result<Checkpoint> readAndCheck(const std::string& path, const CheckpointKey& key,
                                       const CheckpointCheck& check) {
  MERIDIAN_ASSIGN_OR_RETURN(Checkpoint ckpt, readCheckpoint(path, key));
  if (check) {
    if (Status st = check(ckpt); !st.isOk()) return corrupt(path, "{}", st.message());
  }
  return ckpt;
}

}  // namespace

const CheckpointSection* Checkpoint::find(std::string_view name) const {
  for (const CheckpointSection& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string checkpointPath(const std::string& dir, std::uint64_t step) {
  return fmt::format("{}/{}{:012d}{}", dir, kPrefix, step, kSuffix);
}

CheckpointKey checkpointKey(std::string_view secret) {
  static constexpr std::string_view kLabel = "meridian checkpoint key v2";
  return hmacSha256({reinterpret_cast<const std::uint8_t*>(secret.data()), secret.size()},
                    {reinterpret_cast<const std::uint8_t*>(kLabel.data()), kLabel.size()});
}

Result<std::string> checkpointKeyFile(const std::string& dir) {
  if (dir.empty()) return invalidArgument("checkpoint key: no checkpoint directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalidArgument("cannot create checkpoint directory {}: {}", dir, ec.message());
  const std::string path = dir + "/checkpoint.key";
  auto readKey = [&]() -> Result<std::string> {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) return invalidArgument("checkpoint key {}: {}", path, errnoText(errno));
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      return invalidArgument("checkpoint key {}: not a regular file of this user with mode 0600; refusing it", path);
    }
    char buf[65] = {};
    const ssize_t n = ::read(fd.get(), buf, 64);
    if (n != 64) return invalidArgument("checkpoint key {}: {} bytes, expected 64 hex digits", path, n);
    return std::string(buf, 64);
  };
  if (::access(path.c_str(), F_OK) == 0) return readKey();
  // Made whole under a random name, then linked into place: link() fails if another rank
  // got there first, and nobody ever reads a half-written key.
  const std::string key = randomHex(32);
  const std::string tmp = fmt::format("{}/.checkpoint.key.{}", dir, randomHex(8));
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) return invalidArgument("checkpoint key {}: {}", tmp, errnoText(errno));
    if (::write(fd.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()) || ::fsync(fd.get()) != 0) {
      ::unlink(tmp.c_str());
      return invalidArgument("checkpoint key {}: {}", tmp, errnoText(errno));
    }
  }
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int linkErrno = errno;
  ::unlink(tmp.c_str());
  if (linked != 0 && linkErrno != EEXIST) return invalidArgument("checkpoint key {}: {}", path, errnoText(linkErrno));
  return readKey();
}

Result<CheckpointSecret> checkpointSecretFromEnvironment(const std::string& dir) {
  if (knobIsSet(knobs::kCheckpointSecret)) return CheckpointSecret{knobString(knobs::kCheckpointSecret)};
  if (knobIsSet(knobs::kSecret) || knobIsSet(knobs::kSecretFile)) {
    MERIDIAN_ASSIGN_OR_RETURN(std::string secret, readJobSecret());
    return CheckpointSecret{std::move(secret)};
  }
  MERIDIAN_ASSIGN_OR_RETURN(std::string key, checkpointKeyFile(dir));
  return CheckpointSecret{std::move(key)};
}

Status writeCheckpoint(const std::string& dir, const CheckpointKey& key, std::uint64_t step,
                       const std::vector<CheckpointSection>& sections, int keep) {
  if (dir.empty()) return invalidArgument("checkpoint: the directory name is empty");
  if (keep < 1) return invalidArgument("checkpoint: keep is {}, expected at least 1", keep);
  MERIDIAN_RETURN_IF_ERROR(checkSections(sections));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalidArgument("cannot create checkpoint directory {}: {}", dir, ec.message());

  const std::string target = checkpointPath(dir, step);
  TempFile tmp;
  MERIDIAN_RETURN_IF_ERROR(tmp.create(dir, step));
  SigningWriter out(tmp.fd(), tmp.path());
  MERIDIAN_RETURN_IF_ERROR(out.start(key));
  MERIDIAN_RETURN_IF_ERROR(out.put(reinterpret_cast<const std::uint8_t*>(kMagic), sizeof(kMagic)));
  MERIDIAN_RETURN_IF_ERROR(out.putInt(kCheckpointVersion));
  MERIDIAN_RETURN_IF_ERROR(out.putInt(step));
  MERIDIAN_RETURN_IF_ERROR(out.putInt(static_cast<std::uint32_t>(sections.size())));
  for (const CheckpointSection& s : sections) {
    MERIDIAN_RETURN_IF_ERROR(out.putInt(static_cast<std::uint16_t>(s.name.size())));
    MERIDIAN_RETURN_IF_ERROR(out.put(reinterpret_cast<const std::uint8_t*>(s.name.data()), s.name.size()));
    MERIDIAN_RETURN_IF_ERROR(out.putInt(static_cast<std::uint64_t>(s.data.size())));
    MERIDIAN_RETURN_IF_ERROR(out.put(s.data.data(), s.data.size()));
  }
  MERIDIAN_RETURN_IF_ERROR(out.finish());
  MERIDIAN_RETURN_IF_ERROR(tmp.sync());
  MERIDIAN_RETURN_IF_ERROR(tmp.renameTo(target));
  MERIDIAN_RETURN_IF_ERROR(syncDirectory(dir));
  MLOG_DEBUG(kTrainer, "checkpoint: wrote {} ({} sections)", target, sections.size());
  pruneCheckpoints(dir, key, step, keep);
  return Status::ok();
}

Result<Checkpoint> readCheckpoint(const std::string& path, const CheckpointKey& key) {
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<std::uint8_t> bytes, readWholeFile(path));
  const std::size_t size = bytes.size();
  const std::uint8_t* p = bytes.data();
  if (size < kHeaderBytes + kDigestBytes) {
    return corrupt(path, "truncated: {} bytes, less than a header and digest ({})", size,
                   kHeaderBytes + kDigestBytes);
  }
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) return corrupt(path, "bad magic, not a Meridian checkpoint");
  const auto version = wire::load<std::uint32_t>(p + 8);
  if (version != kCheckpointVersion) {
    return corrupt(path, "format version {}{}, this build reads version {}", version,
                   version == 1 ? " (an unkeyed SHA-256 digest, which anyone can recompute: not trusted)" : "",
                   kCheckpointVersion);
  }
  Checkpoint ckpt;
  ckpt.path = path;
  ckpt.step = wire::load<std::uint64_t>(p + 12);
  const auto count = wire::load<std::uint32_t>(p + 20);
  if (count > kCheckpointMaxSections) {
    return corrupt(path, "{} sections, more than the limit of {}", count, kCheckpointMaxSections);
  }
  if (count * kSectionFixedBytes > size - kHeaderBytes - kDigestBytes) {
    return corrupt(path, "truncated or damaged: {} sections cannot fit in {} bytes", count, size);
  }

  // Walk the sections, checking every length against what is left, before allocating.
  struct Span {
    std::size_t nameAt, nameBytes, dataAt, dataBytes;
  };
  std::vector<Span> spans;
  spans.reserve(count);
  std::set<std::string_view> names;
  std::size_t at = kHeaderBytes;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (size - at < kSectionFixedBytes) return corrupt(path, "truncated in the header of section {}", i);
    const std::size_t nameBytes = wire::load<std::uint16_t>(p + at);
    if (nameBytes < 1 || nameBytes > kCheckpointMaxNameBytes) {
      return corrupt(path, "section {} has a name of {} bytes, expected 1..{}", i, nameBytes,
                     kCheckpointMaxNameBytes);
    }
    if (size - at - 2 < nameBytes + 8) return corrupt(path, "truncated in the name of section {}", i);
    const std::string_view name(reinterpret_cast<const char*>(p + at + 2), nameBytes);
    if (!names.insert(name).second) return corrupt(path, "two sections are named '{}'", name);
    const std::size_t dataAt = at + 2 + nameBytes + 8;
    const auto dataBytes = wire::load<std::uint64_t>(p + dataAt - 8);
    if (dataBytes > size - dataAt) {
      return corrupt(path, "truncated: section '{}' announces {} bytes, {} remain", name, dataBytes, size - dataAt);
    }
    spans.push_back({at + 2, nameBytes, dataAt, static_cast<std::size_t>(dataBytes)});
    at = dataAt + static_cast<std::size_t>(dataBytes);
  }
  if (size - at < kDigestBytes) return corrupt(path, "truncated: {} bytes of the 32-byte digest", size - at);
  if (size - at > kDigestBytes) return corrupt(path, "{} trailing bytes after the digest", size - at - kDigestBytes);

  const Hmac256 digest = hmacSha256(key, {p, at});
  Hmac256 stored{};
  std::copy(p + at, p + size, stored.begin());
  if (!equalDigests(digest, stored)) {
    return corrupt(path, "HMAC-SHA256 does not verify: damaged, or signed with another key (MERIDIAN_SECRET or "
                   "MERIDIAN_CHECKPOINT_SECRET differ from the run that wrote it)");
  }

  ckpt.sections.reserve(spans.size());
  for (const Span& s : spans) {
    ckpt.sections.push_back({std::string(reinterpret_cast<const char*>(p + s.nameAt), s.nameBytes),
                             std::vector<std::uint8_t>(p + s.dataAt, p + s.dataAt + s.dataBytes)});
  }
  return ckpt;
}

Result<std::vector<std::uint64_t>> validCheckpointSteps(const std::string& dir, const CheckpointKey& key,
                                                        const CheckpointCheck& check) {
  MERIDIAN_ASSIGN_OR_RETURN(std::optional<std::vector<std::uint64_t>> listed, listCheckpointSteps(dir));
  std::vector<std::uint64_t> valid;
  if (!listed) return valid;
  for (std::uint64_t step : *listed) {
    Result<Checkpoint> ckpt = readAndCheck(checkpointPath(dir, step), key, check);
    if (ckpt.isOk()) {
      valid.push_back(step);
    } else {
      MLOG_WARN(kTrainer, "checkpoint: skipping step {}: {}", step, ckpt.status().message());
    }
  }
  return valid;
}

Result<Checkpoint> loadLatestCheckpoint(const std::string& dir, const CheckpointKey& key, std::uint64_t maxStep,
                                        const CheckpointCheck& check) {
  MERIDIAN_ASSIGN_OR_RETURN(std::optional<std::vector<std::uint64_t>> listed, listCheckpointSteps(dir));
  const std::string bound = maxStep == UINT64_MAX ? std::string() : fmt::format(" at or below step {}", maxStep);
  if (!listed) return invalidArgument("no valid checkpoint in {}{} (the directory does not exist)", dir, bound);
  std::vector<std::string> rejected;
  for (std::uint64_t step : *listed) {
    if (step > maxStep) continue;
    Result<Checkpoint> ckpt = readAndCheck(checkpointPath(dir, step), key, check);
    if (ckpt.isOk()) {
      if (!rejected.empty()) MLOG_WARN(kTrainer, "checkpoint: resuming from the older {}", ckpt->path);
      return ckpt;
    }
    MLOG_WARN(kTrainer, "checkpoint: falling back past {}", ckpt.status().message());
    rejected.push_back(ckpt.status().message());
  }
  if (rejected.empty()) return invalidArgument("no valid checkpoint in {}{} (no checkpoint files)", dir, bound);
  return invalidArgument("no valid checkpoint in {}{}; rejected: {}", dir, bound, fmt::join(rejected, "; "));
}

}  // namespace meridian::trainer
