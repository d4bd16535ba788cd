// Small file helpers every layer uses the same way.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace meridian {

// Writes `bytes` to `path` so that readers see either the old file or the whole new one:
// into `path`.tmp.<pid> first, then rename. The temporary file is removed on failure.
// Not fsync'd: for hand-over and state files, not for data that must survive a crash
// (checkpoints do their own).
Status writeFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace meridian
