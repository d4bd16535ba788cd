// Helpers for the backend tests: a buffer in a backend's memory that uploads and downloads
// host vectors, seeded random inputs, and element-wise comparisons that name the index.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace meridian::kernels::testing {

// `n` elements of T in `backend`'s memory (zeroed), freed with it. Not copyable.
template <typename T>
class BackendBuffer {
 public:
  BackendBuffer(Backend& backend, std::size_t n)
      : backend_(&backend), n_(n), data_(static_cast<T*>(backend.alloc(n * sizeof(T)))) {}
  BackendBuffer(Backend& backend, const std::vector<T>& host) : BackendBuffer(backend, host.size()) {
    backend_->copyToDevice(data_, host.data(), host.size() * sizeof(T));
  }
  ~BackendBuffer() { backend_->free(data_); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  T* get() const { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    backend_->copyToHost(host.data(), data_, n_ * sizeof(T));
    return host;
  }

 private:
  Backend* backend_;
  std::size_t n_;
  T* data_;
};

// Uniform in [lo, hi), reproducible from `seed`.
inline std::vector<float> randomFloats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<std::int32_t> randomLabels(std::size_t n, int classes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, classes - 1);
  std::vector<std::int32_t> v(n);
  for (std::int32_t& x : v) x = dist(rng);
  return v;
}

// One gemm call's operands: random A, B and C stored row-major (A m x k, or k x m when
// transposed; B k x n or n x k; C m x n), every row padded by a few unused elements so the
// strides lda/ldb/ldc are above the minimum.
struct GemmCase {
  bool transA, transB;
  int m, n, k;
  int lda, ldb, ldc;
  std::vector<float> a, b, c;

  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " transA=" + std::to_string(transA) + " transB=" + std::to_string(transB);
  }
};

struct GemmShape {
  int m, n, k;
};

// Every shape with all four transpose combinations.
inline std::vector<GemmCase> gemmCases(const std::vector<GemmShape>& shapes, std::uint64_t seed) {
  std::vector<GemmCase> cases;
  for (const GemmShape& s : shapes) {
    for (const bool transA : {false, true}) {
      for (const bool transB : {false, true}) {
        const int aRows = transA ? s.k : s.m, aCols = transA ? s.m : s.k;
        const int bRows = transB ? s.n : s.k, bCols = transB ? s.k : s.n;
        GemmCase g{transA, transB, s.m, s.n, s.k, aCols + 3, bCols + 2, s.n + 5, {}, {}, {}};
        g.a = randomFloats(static_cast<std::size_t>(aRows * g.lda), seed++);
        g.b = randomFloats(static_cast<std::size_t>(bRows * g.ldb), seed++);
        g.c = randomFloats(static_cast<std::size_t>(s.m * g.ldc), seed++);
        cases.push_back(std::move(g));
      }
    }
  }
  return cases;
}

// |actual - expected| <= abs + rel * |expected| element by element; stops at the first few
// mismatches so a broken kernel does not print a million lines.
template <typename A, typename E>
void expectNear(const std::vector<A>& actual, const std::vector<E>& expected, double rel, double abs) {
  ASSERT_EQ(actual.size(), expected.size());
  int failures = 0;
  for (std::size_t i = 0; i < actual.size() && failures < 5; ++i) {
    const auto a = static_cast<double>(actual[i]);
    const auto e = static_cast<double>(expected[i]);
    if (!(std::fabs(a - e) <= abs + rel * std::fabs(e))) {
      ADD_FAILURE() << "element " << i << ": got " << a << ", want " << e << " (rel " << rel << ", abs " << abs
                    << ")";
      ++failures;
    }
  }
}

}  // namespace meridian::kernels::testing
