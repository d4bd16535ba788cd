// makeCudaBackend and cudaAvailable for a build without CUDA (MERIDIAN_ENABLE_CUDA off), so
// callers link either way and learn at run time why there is no GPU backend.
#include <memory>

#include "kernels/backend.h"

namespace meridian::kernels {

bool cudaAvailable() { return false; }

Result<std::unique_ptr<Backend>> makeCudaBackend(int /*ordinal*/) {
  return Status(StatusCode::kInvalidArgument, "Meridian was built without CUDA (nvcc not found at configure time)");
}

}  // namespace meridian::kernels
