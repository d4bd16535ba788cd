# Finds Meridian's dependencies (all from Debian). Required ones fail the configure
# with the package to install; optional ones switch their option off with a warning.
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)        # libssl-dev: HMAC for the job-secret handshake
find_package(fmt REQUIRED)            # libfmt-dev
find_package(spdlog REQUIRED)         # libspdlog-dev
find_package(nlohmann_json REQUIRED)  # nlohmann-json3-dev
find_package(ZLIB QUIET)              # zlib1g-dev: the trainer reads gzip'd IDX datasets
if(NOT ZLIB_FOUND)
  message(FATAL_ERROR "zlib not found: apt-get install zlib1g-dev")
endif()
# OpenBLAS: the CPU backend's GEMM (libopenblas-dev). Its own cblas.h (next to
# openblas_config.h) declares openblas_set_num_threads; the generic one may not.
find_library(OPENBLAS_LIBRARY openblas)
find_path(OPENBLAS_INCLUDE_DIR openblas_config.h
          PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial openblas)
if(NOT OPENBLAS_LIBRARY OR NOT OPENBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-dev")
endif()
add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
target_include_directories(OpenBLAS::OpenBLAS SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(OpenBLAS::OpenBLAS INTERFACE ${OPENBLAS_LIBRARY})
# prometheus-cpp: the monitoring layer's HTTP exposer (civetweb) and text format.
find_package(prometheus-cpp CONFIG QUIET)  # prometheus-cpp-dev
if(NOT prometheus-cpp_FOUND OR NOT TARGET prometheus-cpp::pull)
  message(FATAL_ERROR "prometheus-cpp not found: apt-get install prometheus-cpp-dev")
endif()
# libfabric: the RDMA paths (transport/fabric: verbs, efa, tcp;ofi_rxm, shm providers).
# libibverbs: listing InfiniBand ports and their speeds beside it.
find_package(PkgConfig REQUIRED)       # pkg-config
pkg_check_modules(LIBFABRIC QUIET IMPORTED_TARGET libfabric>=1.17)
if(NOT LIBFABRIC_FOUND)
  message(FATAL_ERROR "libfabric >= 1.17 not found: apt-get install libfabric-dev")
endif()
pkg_check_modules(IBVERBS QUIET IMPORTED_TARGET libibverbs)
if(NOT IBVERBS_FOUND)
  message(FATAL_ERROR "libibverbs not found: apt-get install libibverbs-dev")
endif()
find_package(CLI11 CONFIG QUIET)      # libcli11-dev
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT CLI11_INCLUDE_DIR)
    message(FATAL_ERROR "CLI11 not found: apt-get install libcli11-dev")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

if(MERIDIAN_BUILD_TESTS)
  find_package(GTest REQUIRED)        # libgtest-dev libgmock-dev
  find_package(benchmark QUIET)       # libbenchmark-dev
endif()

# CUDA: AUTO means on when nvcc is found.
if(MERIDIAN_ENABLE_CUDA STREQUAL "AUTO" OR MERIDIAN_ENABLE_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(MERIDIAN_ENABLE_CUDA ON)
    # .cu files build as C++20 like the rest (CUDA_STANDARD follows CXX_STANDARD). CMake 3.25
    # does not know nvcc's C++20 flag, which nvcc has had since 12.0: tell it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
    endif()
  else()
    if(MERIDIAN_ENABLE_CUDA STREQUAL "ON")
      message(WARNING "MERIDIAN_ENABLE_CUDA=ON but nvcc was not found: CUDA kernels are off")
    endif()
    set(MERIDIAN_ENABLE_CUDA OFF)
  endif()
endif()

if(NOT MERIDIAN_FUZZ)
  find_package(MPI QUIET COMPONENTS CXX)
endif()  # libopenmpi-dev, for the side-by-side benchmark

message(STATUS "Meridian: CUDA=${MERIDIAN_ENABLE_CUDA} sanitize=${MERIDIAN_SANITIZE} MPI=${MPI_CXX_FOUND}")
