// A small learnable stand-in for Fashion-MNIST (28x28 images, 10 classes, the same file
// names), written as gzip'd IDX into a directory: class c lights up rows 2c..2c+2 on top
// of pseudo-random noise, so a small MLP learns it in a few dozen steps.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "trainer/dataset.h"

namespace meridian::testing {

inline Status writeSyntheticSplit(const std::string& dir, const std::string& prefix, std::size_t count,
                                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> images(count * 28 * 28);
  std::vector<std::uint8_t> labels(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::uint8_t>(rng() % 10);
    labels[i] = label;
    std::uint8_t* img = images.data() + i * 28 * 28;
    for (int p = 0; p < 28 * 28; ++p) img[p] = static_cast<std::uint8_t>(rng() % 90);
    for (int r = 2 * label; r < 2 * label + 3; ++r)
      for (int c = 4; c < 24; ++c) img[r * 28 + c] = static_cast<std::uint8_t>(160 + rng() % 90);
  }
  MERIDIAN_RETURN_IF_ERROR(trainer::writeIdxImages(dir + "/" + prefix + "-images-idx3-ubyte.gz", count, 28, 28,
                                                   images.data()));
  return trainer::writeIdxLabels(dir + "/" + prefix + "-labels-idx1-ubyte.gz", count, labels.data());
}

// train: 1024 examples, test ("t10k"): 256.
inline Status writeSyntheticFashion(const std::string& dir) {
  MERIDIAN_RETURN_IF_ERROR(writeSyntheticSplit(dir, "train", 1024, 7));
  return writeSyntheticSplit(dir, "t10k", 256, 8);
}

}  // namespace meridian::testing
