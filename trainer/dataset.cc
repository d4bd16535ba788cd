// IDX reading and writing through zlib's gzFile API, and the epoch permutation.
#include "trainer/dataset.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <utility>

#include <zlib.h>

#include "core/check.h"

namespace meridian::trainer {
namespace {

constexpr std::uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
// gzread takes an unsigned count and returns an int: read in chunks well below INT_MAX.
// The buffer grows a chunk at a time, with what the file really holds.
constexpr std::size_t kReadChunk = std::size_t{16} << 20;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// IDX numbers are big-endian (core/wire.h is for our own little-endian formats).
std::uint32_t loadBe32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
void storeBe32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (24 - 8 * i));
}

// zlib's description of the last error on f, or the errno text for an I/O error.
std::string gzErrorText(gzFile f) {
  int errnum = Z_OK;
  const char* text = gzerror(f, &errnum);
  if (errnum == Z_ERRNO) return std::strerror(errno);
  return text != nullptr ? text : "unknown zlib error";
}

Result<GzFile> openForReading(const std::string& path) {
  errno = 0;
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) return invalidArgument("cannot open {}: {}", path, errno != 0 ? std::strerror(errno) : "out of memory");
  gzbuffer(f.get(), 1u << 17);
  return f;
}

// Appends exactly n bytes from f to out. Fewer means the file is truncated (or its gzip
// stream is damaged); `what` names the part being read for the message.
Status readExact(gzFile f, const std::string& path, const char* what, std::size_t n, std::vector<std::uint8_t>& out) {
  const std::size_t start = out.size();
  std::size_t got = 0;
  while (got < n) {
    const std::size_t want = std::min(n - got, kReadChunk);
    out.resize(start + got + want);
    const int r = gzread(f, out.data() + start + got, static_cast<unsigned>(want));
    if (r < 0) return invalidArgument("{}: cannot read the {}: {}", path, what, gzErrorText(f));
    got += static_cast<std::size_t>(r);
    if (static_cast<std::size_t>(r) < want) break;
  }
  out.resize(start + got);
  if (got < n) {
    int errnum = Z_OK;
    gzerror(f, &errnum);
    return invalidArgument("{}: truncated: the {} should be {} bytes but the file ends after {}{}", path, what, n,
                           got, errnum != Z_OK ? fmt::format(" ({})", gzErrorText(f)) : std::string());
  }
  return Status::ok();
}

// After the announced bytes the file must end.
Status expectEnd(gzFile f, const std::string& path, std::size_t announced) {
  std::uint8_t extra = 0;
  const int r = gzread(f, &extra, 1);
  if (r < 0) return invalidArgument("{}: cannot read: {}", path, gzErrorText(f));
  if (r > 0) return invalidArgument("{}: trailing bytes after the {} bytes its header announces", path, announced);
  return Status::ok();
}

// Reads the magic and dimensions of an IDX header.
Status readHeader(gzFile f, const std::string& path, std::uint32_t magic, const char* kind,
                  std::span<std::uint32_t> dims) {
  std::vector<std::uint8_t> buf;
  MERIDIAN_RETURN_IF_ERROR(readExact(f, path, "magic number", 4, buf));
  const std::uint32_t got = loadBe32(buf.data());
  if (got != magic) {
    return invalidArgument("{}: bad magic 0x{:08x}, expected 0x{:08x} (an IDX {} file)", path, got, magic, kind);
  }
  buf.clear();
  MERIDIAN_RETURN_IF_ERROR(readExact(f, path, "dimensions", 4 * dims.size(), buf));
  for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = loadBe32(buf.data() + 4 * i);
  return Status::ok();
}

Status checkDims(const std::string& path, std::uint64_t count, std::int64_t rows, std::int64_t cols,
                 const IdxLimits& limits = {}) {
  if (count > kIdxMaxCount) return invalidArgument("{}: {} examples, more than the limit of {}", path, count, kIdxMaxCount);
  if (rows < 1 || rows > kIdxMaxSide || cols < 1 || cols > kIdxMaxSide) {
    return invalidArgument("{}: images of {} x {}, outside 1..{} per side", path, rows, cols, kIdxMaxSide);
  }
  if ((limits.rows != 0 && rows != limits.rows) || (limits.cols != 0 && cols != limits.cols)) {
    return invalidArgument("{}: images of {} x {}, expected {} x {}", path, rows, cols, limits.rows, limits.cols);
  }
  // Checked before a byte of pixels is inflated: a header may announce what it likes.
  const std::uint64_t bytes = count * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols);
  if (count > limits.maxCount || bytes > kIdxMaxPixelBytes) {
    return invalidArgument("{}: the header announces {} images of {} x {} ({} bytes to inflate), more than the {} "
                           "images (and {} bytes) expected; not inflating it",
                           path, count, rows, cols, bytes, std::min(limits.maxCount, kIdxMaxCount), kIdxMaxPixelBytes);
  }
  return Status::ok();
}

Status writeIdx(const std::string& path, std::span<const std::uint32_t> header, const std::uint8_t* data,
                std::size_t bytes) {
  errno = 0;
  GzFile f(gzopen(path.c_str(), "wb"));
  if (!f) return invalidArgument("cannot create {}: {}", path, errno != 0 ? std::strerror(errno) : "out of memory");
  std::vector<std::uint8_t> head(4 * header.size());
  for (std::size_t i = 0; i < header.size(); ++i) storeBe32(head.data() + 4 * i, header[i]);
  auto put = [&](const std::uint8_t* p, std::size_t n) -> Status {
    while (n > 0) {
      const std::size_t chunk = std::min(n, kReadChunk);
      if (gzwrite(f.get(), p, static_cast<unsigned>(chunk)) != static_cast<int>(chunk)) {
        return invalidArgument("cannot write {}: {}", path, gzErrorText(f.get()));
      }
      p += chunk;
      n -= chunk;
    }
    return Status::ok();
  };
  MERIDIAN_RETURN_IF_ERROR(put(head.data(), head.size()));
  MERIDIAN_RETURN_IF_ERROR(put(data, bytes));
  errno = 0;
  const int rc = gzclose(f.release());
  if (rc != Z_OK) {
    return invalidArgument("cannot write {}: {}", path,
                           rc == Z_ERRNO && errno != 0 ? std::strerror(errno) : fmt::format("zlib error {}", rc));
  }
  return Status::ok();
}

// splitmix64 (Steele, Lea, Flood 2014): a strong 64-bit mixer.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform draw from [0, bound), bound >= 1, by rejection: values below 2^64 mod bound
// are redrawn, so the remaining range is a whole multiple of bound.
std::uint64_t boundedDraw(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const std::uint64_t x = gen();
    if (x >= threshold) return x % bound;
  }
}

}  // namespace

Result<Dataset> loadIdx(const std::string& imagesPath, const std::string& labelsPath, int classes,
                        const IdxLimits& limits) {
  if (classes < 1 || classes > 256) return invalidArgument("loadIdx: {} classes, expected 1..256", classes);
  Dataset d;
  d.classes = classes;

  MERIDIAN_ASSIGN_OR_RETURN(GzFile images, openForReading(imagesPath));
  std::array<std::uint32_t, 3> dims{};
  MERIDIAN_RETURN_IF_ERROR(readHeader(images.get(), imagesPath, kIdxImagesMagic, "image", dims));
  MERIDIAN_RETURN_IF_ERROR(checkDims(imagesPath, dims[0], dims[1], dims[2], limits));
  d.count = dims[0];
  d.rows = static_cast<int>(dims[1]);
  d.cols = static_cast<int>(dims[2]);

  MERIDIAN_ASSIGN_OR_RETURN(GzFile labels, openForReading(labelsPath));
  std::array<std::uint32_t, 1> labelDims{};
  MERIDIAN_RETURN_IF_ERROR(readHeader(labels.get(), labelsPath, kIdxLabelsMagic, "label", labelDims));
  if (labelDims[0] != d.count) {
    return invalidArgument("{} holds {} labels but {} holds {} images", labelsPath, labelDims[0], imagesPath,
                           d.count);
  }

  const std::size_t pixels = d.count * d.features();
  MERIDIAN_RETURN_IF_ERROR(readExact(images.get(), imagesPath, "pixels", pixels, d.images));
  MERIDIAN_RETURN_IF_ERROR(expectEnd(images.get(), imagesPath, pixels));
  MERIDIAN_RETURN_IF_ERROR(readExact(labels.get(), labelsPath, "labels", d.count, d.labels));
  MERIDIAN_RETURN_IF_ERROR(expectEnd(labels.get(), labelsPath, d.count));

  for (std::size_t i = 0; i < d.count; ++i) {
    if (d.labels[i] >= classes) {
      return invalidArgument("{}: label {} of example {} is not below the {} classes", labelsPath, d.labels[i], i,
                             classes);
    }
  }
  return d;
}

Result<Dataset> loadFashionMnist(const std::string& dir, bool train) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  const std::string imagesPath = prefix + "-images-idx3-ubyte.gz";
  const std::string labelsPath = prefix + "-labels-idx1-ubyte.gz";
  for (const std::string& path : {imagesPath, labelsPath}) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return invalidArgument("Fashion-MNIST {} file {} not found: apt-get install dataset-fashion-mnist",
                             train ? "train" : "test", path);
    }
  }
  const IdxLimits limits{train ? kFashionMnistTrainCount : kFashionMnistTestCount, kFashionMnistSide,
                         kFashionMnistSide};
  Result<Dataset> d = loadIdx(imagesPath, labelsPath, 10, limits);
  if (!d.isOk()) return d.status().withContext("Fashion-MNIST");
  return d;
}

Status writeIdxImages(const std::string& path, std::size_t count, int rows, int cols, const std::uint8_t* data) {
  MERIDIAN_RETURN_IF_ERROR(checkDims(path, count, rows, cols));
  const std::array<std::uint32_t, 4> header{kIdxImagesMagic, static_cast<std::uint32_t>(count),
                                            static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(cols)};
  return writeIdx(path, header, data, count * static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
}

Status writeIdxLabels(const std::string& path, std::size_t count, const std::uint8_t* labels) {
  if (count > kIdxMaxCount) return invalidArgument("{}: {} labels, more than the limit of {}", path, count, kIdxMaxCount);
  const std::array<std::uint32_t, 2> header{kIdxLabelsMagic, static_cast<std::uint32_t>(count)};
  return writeIdx(path, header, labels, count);
}

std::vector<std::uint32_t> epochPermutation(std::size_t count, std::uint64_t seed, std::uint64_t epoch) {
  MERIDIAN_CHECK_LE(count, std::size_t{UINT32_MAX});
  std::vector<std::uint32_t> order(count);
  for (std::size_t i = 0; i < count; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::mt19937_64 gen(splitmix64(seed ^ splitmix64(epoch)));
  for (std::size_t i = count; i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(boundedDraw(gen, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace meridian::trainer
