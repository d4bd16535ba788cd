#include "core/file_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace meridian {

Status writeFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return internalError("cannot write {}", tmp);
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    return internalError("cannot rename {} to {}: {}", tmp, path, why);
  }
  return Status::ok();
}

}  // namespace meridian
