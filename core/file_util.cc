// Atomic file replacement and the per-user private directory (file_util.h).
#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include <fmt/format.h>

#include "core/fd.h"
#include "core/secret.h"

namespace meridian {

namespace {

// A temporary name nobody can predict: planting a symlink there ahead of us needs the name.
Result<std::string> temporaryNameFor(const std::string& path) {
  std::string name = path + ".tmp.";
  try {
    name += randomHex(8);
  } catch (const std::exception& e) {
    return internalError("cannot draw a temporary name for {}: {}", path, e.what());
  }
  return name;
}

Status writeAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return internalError("cannot write {}: {}", path, errnoText(errno));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return Status::ok();
}

// Makes a rename in `dir` durable. Some file systems cannot fsync a directory (EINVAL): fine.
Status syncDirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return internalError("cannot open directory {} to fsync it: {}", dir, errnoText(errno));
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return internalError("cannot fsync directory {}: {}", dir, errnoText(errno));
  return Status::ok();
}

// Why `st` (of `path`) is not a directory only this user controls, or "" when it is.
std::string whyNotPrivate(const struct stat& st, mode_t forbiddenModeBits) {
  if (S_ISLNK(st.st_mode)) return "it is a symlink";
  if (!S_ISDIR(st.st_mode)) return "it is not a directory";
  if (st.st_uid != ::geteuid()) return fmt::format("it is owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
  if ((st.st_mode & forbiddenModeBits) != 0) {
    return fmt::format("its mode {:04o} lets other users in (want none of {:03o})", st.st_mode & 07777, forbiddenModeBits);
  }
  return {};
}

// A runtime root fit to hold the private directory.
bool usableRoot(const std::string& root) {
  struct stat st {};
  return !root.empty() && root.front() == '/' && ::lstat(root.c_str(), &st) == 0 && whyNotPrivate(st, 077).empty();
}

}  // namespace

Status writeFileAtomically(const std::string& path, std::string_view bytes, const AtomicWriteOptions& options) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::string tmp, temporaryNameFor(path));
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, options.mode));
  if (!fd.valid()) return internalError("cannot create {}: {}", tmp, errnoText(errno));
  Status st = writeAll(fd.get(), bytes, tmp);
  if (st.isOk() && options.durable && ::fsync(fd.get()) != 0) st = internalError("cannot fsync {}: {}", tmp, errnoText(errno));
  if (st.isOk() && ::close(fd.release()) != 0) st = internalError("cannot write {}: {}", tmp, errnoText(errno));
  if (st.isOk() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = internalError("cannot rename {} to {}: {}", tmp, path, errnoText(errno));
  }
  if (!st.isOk()) {
    (void)::unlink(tmp.c_str());  // ours: created exclusively above
    return st;
  }
  return options.durable ? syncDirectoryOf(path) : Status::ok();
}

PrivateDirRoots defaultPrivateDirRoots() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  return {xdg != nullptr ? xdg : "", fmt::format("/run/user/{}", ::geteuid()), "/tmp"};
}

Result<std::string> privateRuntimeDir(const PrivateDirRoots& roots) {
  std::string dir;
  if (usableRoot(roots.runtimeDir)) {
    dir = roots.runtimeDir + "/meridian";
  } else if (usableRoot(roots.runUserDir)) {
    dir = roots.runUserDir + "/meridian";
  } else if (!roots.tmpDir.empty()) {
    dir = fmt::format("{}/meridian-{}", roots.tmpDir, ::geteuid());
  } else {
    return invalidArgument("no place for a private directory: no runtime directory and no temporary directory");
  }
  MERIDIAN_RETURN_IF_ERROR(ensurePrivateDirectory(dir));
  return dir;
}

Status ensurePrivateDirectory(const std::string& path, mode_t forbiddenModeBits) {
  if (path.empty()) return invalidArgument("private directory: empty path");
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return invalidArgument("cannot create {}: {}", parent.string(), ec.message());
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return invalidArgument("cannot create {}: {}", path, errnoText(errno));
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return invalidArgument("cannot stat {}: {}", path, errnoText(errno));
  if (std::string why = whyNotPrivate(st, forbiddenModeBits); !why.empty()) {
    return invalidArgument("refusing directory {}: {}", path, why);
  }
  // The same again through a descriptor, in case it was swapped between the two looks.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return invalidArgument("refusing directory {}: cannot open it: {}", path, errnoText(errno));
  if (::fstat(fd.get(), &st) != 0) return invalidArgument("cannot stat {}: {}", path, errnoText(errno));
  if (std::string why = whyNotPrivate(st, forbiddenModeBits); !why.empty()) {
    return invalidArgument("refusing directory {}: {}", path, why);
  }
  return Status::ok();
}

}  // namespace meridian
