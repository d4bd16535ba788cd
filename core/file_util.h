// Small file helpers every layer uses the same way: atomic replacement of a file, and the
// per-user private directory for files other users must not be able to plant or swap.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "core/status.h"

namespace meridian {

struct AtomicWriteOptions {
  // fsync the new file before the rename and its directory after it: the new content
  // survives a crash once the call returns. Off for hand-over and state files.
  bool durable = false;
  mode_t mode = 0644;  // of the new file, before the umask
};

// Writes `bytes` to `path` so that readers see either the old file or the whole new one:
// into a temporary `path`.tmp.<16 random hex digits> created with O_CREAT | O_EXCL |
// O_NOFOLLOW (never an existing file, never through a symlink), then renamed over `path`.
// The temporary file is removed on failure. A temporary name never ends in the target's
// extension, so a reader globbing `*.json` never sees one.
Status writeFileAtomically(const std::string& path, std::string_view bytes, const AtomicWriteOptions& options = {});

// Where the per-user private directory may live: the candidates privateRuntimeDir() tries,
// in order. Empty members are skipped.
struct PrivateDirRoots {
  std::string runtimeDir;  // $XDG_RUNTIME_DIR
  std::string runUserDir;  // /run/user/<euid>
  std::string tmpDir;      // /tmp: the last resort, where a per-user directory is made
};
// The roots for this process: $XDG_RUNTIME_DIR, /run/user/<euid> and /tmp.
PrivateDirRoots defaultPrivateDirRoots();

// Meridian's per-user private directory, created when missing: <runtime>/meridian when a
// runtime root is a directory (not a symlink) owned by this effective user that nobody else
// may use (mode & 077 == 0); else <tmp>/meridian-<euid>. The directory itself is made 0700
// and checked as ensurePrivateDirectory does; kInvalidArgument with the reason otherwise
// (e.g. someone else made /tmp/meridian-1000 first).
Result<std::string> privateRuntimeDir(const PrivateDirRoots& roots = defaultPrivateDirRoots());

// Creates `path` (mode 0700; its parents as needed) unless it exists, then checks it with
// lstat and, opened with O_NOFOLLOW, fstat: a directory, not a symlink, owned by this
// effective user, with none of `forbiddenModeBits` set (077: private; 022: nobody else may
// write). kInvalidArgument naming the path and what is wrong with it.
Status ensurePrivateDirectory(const std::string& path, mode_t forbiddenModeBits = 077);

}  // namespace meridian
