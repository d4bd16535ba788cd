// A deterministic uniform [0, 1) source for tests: the same sequence on every standard
// library (std::uniform_real_distribution is not specified that tightly).
#pragma once

#include <cstdint>

namespace meridian::testing {

class Noise {
 public:
  explicit Noise(std::uint64_t seed) : x_(seed) {}
  double next() {
    x_ = x_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(x_ >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t x_;
};

}  // namespace meridian::testing
