// CheckError construction.
#include "core/check.h"

namespace meridian {

void throwCheckError(const char* file, int line, const std::string& what) {
  throw CheckError(fmt::format("{} at {}:{}", what, file, line));
}

}  // namespace meridian
