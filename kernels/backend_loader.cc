// makeCudaBackend and cudaAvailable: the CUDA backend lives in its own shared library,
// libmeridian_kernels_cuda.so, opened with dlopen the first time a GPU backend is asked for.
// Why not link it: cuBLAS and the CUDA runtime bring over 100 KiB of static thread-local
// storage, and every thread of a process that links them must then fit it in its stack,
// which threads made by libraries with small stacks (civetweb's, serving the metrics) do
// not. Loaded on demand, CPU-only runs never carry them (nor need the CUDA libraries at all).
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace meridian::kernels {
namespace {

#if defined(MERIDIAN_HAVE_CUDA)
using DeviceCountFn = int (*)(char*, std::size_t);
using MakeFn = Backend* (*)(int, char*, std::size_t);

struct CudaLibrary {
  DeviceCountFn deviceCount = nullptr;
  MakeFn make = nullptr;
  std::string error;  // why it could not be loaded
};

// MERIDIAN_CUDA_BACKEND (a path), else where the build put it, else the loader's search path.
const CudaLibrary& cudaLibrary() {
  static CudaLibrary lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // No driver, no device: the runtime and cuBLAS it would bring (a third of a second of a
    // process's start here, mapping and relocating them) are not loaded to find that out.
    if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr) {
      const char* e = ::dlerror();
      lib.error = std::string("no CUDA driver (") + (e != nullptr ? e : "libcuda.so.1") + ")";
      return;
    }
    std::vector<std::string> candidates;
    if (const char* p = std::getenv("MERIDIAN_CUDA_BACKEND")) candidates.emplace_back(p);
    candidates.emplace_back(MERIDIAN_CUDA_BACKEND_PATH);
    candidates.emplace_back("libmeridian_kernels_cuda.so");
    std::string why;
    for (const auto& path : candidates) {
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* e = ::dlerror();
        why += (why.empty() ? "" : "; ") + std::string(e != nullptr ? e : path.c_str());
        continue;
      }
      lib.deviceCount = reinterpret_cast<DeviceCountFn>(::dlsym(handle, "meridianCudaDeviceCount"));
      lib.make = reinterpret_cast<MakeFn>(::dlsym(handle, "meridianMakeCudaBackend"));
      if (lib.deviceCount != nullptr && lib.make != nullptr) return;
      why += (why.empty() ? "" : "; ") + path + ": not Meridian's CUDA backend";
      lib.deviceCount = nullptr;
      lib.make = nullptr;
    }
    lib.error = "the CUDA backend library could not be loaded (" + why + ")";
  });
  return lib;
}
#endif

}  // namespace

bool cudaAvailable() {
#if defined(MERIDIAN_HAVE_CUDA)
  const CudaLibrary& lib = cudaLibrary();
  char error[256] = {0};
  return lib.deviceCount != nullptr && lib.deviceCount(error, sizeof error) > 0;
#else
  return false;
#endif
}

Result<std::unique_ptr<Backend>> makeCudaBackend(int ordinal) {
#if defined(MERIDIAN_HAVE_CUDA)
  const CudaLibrary& lib = cudaLibrary();
  if (lib.make == nullptr) return Status(StatusCode::kInvalidArgument, "no CUDA backend: " + lib.error);
  char error[512] = {0};
  const int count = lib.deviceCount(error, sizeof error);
  if (count < 0) return Status(StatusCode::kInvalidArgument, std::string("no CUDA device: ") + error);
  if (count == 0) return Status(StatusCode::kInvalidArgument, "no CUDA device: cudaGetDeviceCount found none");
  if (ordinal < 0 || ordinal >= count) {
    return Status(StatusCode::kInvalidArgument, "CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                                    std::to_string(count) + " visible)");
  }
  Backend* backend = lib.make(ordinal, error, sizeof error);
  if (backend == nullptr) {
    return Status(StatusCode::kInvalidArgument, "CUDA device " + std::to_string(ordinal) + " cannot be used: " + error);
  }
  return std::unique_ptr<Backend>(backend);
#else
  (void)ordinal;
  return Status(StatusCode::kInvalidArgument, "Meridian was built without CUDA (nvcc not found at configure time)");
#endif
}

}  // namespace meridian::kernels
