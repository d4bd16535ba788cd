// Training data: images and labels in the IDX format of (Fashion-)MNIST, and the order
// in which an epoch visits them.
//
// IDX (http://yann.lecun.com/exdb/mnist/): big-endian u32 magic 0x0000080N (unsigned
// bytes, N dimensions), N big-endian u32 dimensions, then the bytes, row-major. Images
// are 0x00000803 (count, rows, cols), labels 0x00000801 (count). Files may be gzip'd or
// plain: zlib's gzFile API reads both.
//
// The default data set is Fashion-MNIST from Debian's dataset-fashion-mnist package.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::trainer {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Sanity limits on what an IDX header may announce.
inline constexpr int kIdxMaxSide = 4096;                     // rows and cols: 1..kIdxMaxSide
inline constexpr std::size_t kIdxMaxCount = 10'000'000;      // examples
inline constexpr std::size_t kIdxMaxPixelBytes = std::size_t{1} << 30;  // count x rows x cols

// What a caller knows of the data it wants. The header is held to it before a byte of
// pixels is inflated, and inflating stops one byte past what the header announced, so a
// small gzip that expands to gigabytes costs at most the expected size in memory and time.
struct IdxLimits {
  std::size_t maxCount = kIdxMaxCount;  // examples
  int rows = 0, cols = 0;               // the image size wanted; 0: any in 1..kIdxMaxSide
};

// Fashion-MNIST: 60000 training and 10000 test images of 28 x 28.
inline constexpr std::size_t kFashionMnistTrainCount = 60'000;
inline constexpr std::size_t kFashionMnistTestCount = 10'000;
inline constexpr int kFashionMnistSide = 28;

struct Dataset {
  std::size_t count = 0;   // examples
  int rows = 0, cols = 0;  // image size (28 x 28)
  int classes = 10;        // labels are in [0, classes)
  std::vector<std::uint8_t> images;  // count * rows * cols, row-major per image
  std::vector<std::uint8_t> labels;  // count
  std::size_t features() const { return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols); }
};

// Reads an IDX image file (magic 0x00000803, dims count, rows, cols) and label file
// (0x00000801, count), gzip'd or plain. Checks the magic numbers, that the counts agree,
// that the dimensions are sane (see the limits above) and within `limits`, that each file
// holds exactly the announced bytes (a short file or trailing bytes is an error; reading
// stops at the first byte too many) and that each label is below `classes` (1..256).
// Memory grows with the bytes actually read, so a header that lies about its size fails
// as truncated rather than allocating what it announced. Errors: kInvalidArgument naming
// the file and what is wrong.
Result<Dataset> loadIdx(const std::string& imagesPath, const std::string& labelsPath, int classes = 10,
                        const IdxLimits& limits = {});

// The "train" (at most 60000 examples) or "test" (at most 10000) split of Fashion-MNIST
// in `dir` (usually kFashionMnistDir), 28 x 28 images. A missing file is an error naming
// the Debian package.
Result<Dataset> loadFashionMnist(const std::string& dir, bool train);

// Writers (gzip'd IDX), for tests and tools. They refuse dimensions loadIdx would refuse.
Status writeIdxImages(const std::string& path, std::size_t count, int rows, int cols, const std::uint8_t* data);
Status writeIdxLabels(const std::string& path, std::size_t count, const std::uint8_t* labels);

// The order of an epoch: a permutation of [0, count) that depends only on (seed, epoch),
// bit-exact across standard libraries and platforms, so a resumed run visits the same
// examples. Fisher-Yates driven by std::mt19937_64 (whose output the standard fixes)
// seeded with splitmix64 of seed and epoch, and an unbiased bounded draw of our own
// (std::shuffle and std::uniform_int_distribution vary between implementations).
// count must fit in 32 bits (MERIDIAN_CHECK).
std::vector<std::uint32_t> epochPermutation(std::size_t count, std::uint64_t seed, std::uint64_t epoch);

}  // namespace meridian::trainer
