// SHA-256 digests, finite checks and their comparison across ranks.
#include "trainer/integrity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/evp.h>

#include "core/check.h"

namespace meridian::trainer {
namespace {

constexpr std::size_t kDigestWords = sizeof(Sha256) / sizeof(std::int64_t);

struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

std::string shortHex(const std::int64_t* words) {
  Sha256 d{};
  std::memcpy(d.data(), words, d.size());
  return trainer::shortHex(d);
}

}  // namespace

std::string shortHex(const Sha256& digest) {
  return fmt::format("{:02x}", fmt::join(digest.begin(), digest.begin() + 8, ""));
}

Sha256 sha256(std::initializer_list<std::span<const std::uint8_t>> parts) {
  Sha256 out{};
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  for (std::span<const std::uint8_t> part : parts) ok = ok && EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1;
  unsigned int len = 0;
  ok = ok && EVP_DigestFinal_ex(ctx.get(), out.data(), &len) == 1 && len == out.size();
  MERIDIAN_CHECK(ok);  // SHA-256 of memory fails only when OpenSSL is broken
  return out;
}

Sha256 datasetDigest(const Dataset& d) {
  const std::uint64_t dims[4] = {d.count, static_cast<std::uint64_t>(d.rows), static_cast<std::uint64_t>(d.cols),
                                 static_cast<std::uint64_t>(d.classes)};
  return sha256({{reinterpret_cast<const std::uint8_t*>(dims), sizeof(dims)}, d.images, d.labels});
}

std::size_t firstNonFinite(std::span<const float> values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return values.size();
}

Status checkFiniteSections(const std::vector<CheckpointSection>& sections) {
  for (const CheckpointSection& s : sections) {
    if (s.name == "meta") continue;
    if (s.data.size() % sizeof(float) != 0)
      return invalidArgument("section '{}' has {} bytes, not a whole number of floats", s.name, s.data.size());
    // The bytes of a vector<uint8_t> need not be aligned for float: copy in blocks.
    float block[1024];
    for (std::size_t at = 0; at < s.data.size(); at += sizeof(block)) {
      const std::size_t bytes = std::min(sizeof(block), s.data.size() - at);
      std::memcpy(block, s.data.data() + at, bytes);
      const std::span<const float> values(block, bytes / sizeof(float));
      const std::size_t bad = firstNonFinite(values);
      if (bad < values.size())
        return invalidArgument("section '{}' holds {} at element {}", s.name, values[bad], at / sizeof(float) + bad);
    }
  }
  return Status();
}

Result<std::vector<std::int64_t>> gatherFromEveryRank(SyncComm* comm, std::int64_t mine) {
  if (comm == nullptr) return std::vector<std::int64_t>{mine};
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm->size()));
  MERIDIAN_RETURN_IF_ERROR(comm->allgather(&mine, all.data(), 1, kernels::DataType::kI64));
  return all;
}

Result<std::vector<int>> ranksThatFailed(SyncComm* comm, bool failed) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<std::int64_t> all, gatherFromEveryRank(comm, failed ? 1 : 0));
  std::vector<int> out;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r] != 0) out.push_back(static_cast<int>(r));
  }
  return out;
}

Status checkSameOnEveryRank(SyncComm* comm, const Sha256& digest, std::string_view what) {
  if (comm == nullptr || comm->size() == 1) return Status();
  std::int64_t words[kDigestWords];
  std::memcpy(words, digest.data(), sizeof(words));
  std::vector<std::int64_t> all(kDigestWords * static_cast<std::size_t>(comm->size()));
  MERIDIAN_RETURN_IF_ERROR(comm->allgather(words, all.data(), kDigestWords, kernels::DataType::kI64));
  std::vector<int> differ;
  for (int r = 1; r < comm->size(); ++r) {
    if (std::memcmp(all.data(), all.data() + kDigestWords * static_cast<std::size_t>(r), sizeof(words)) != 0)
      differ.push_back(r);
  }
  if (differ.empty()) return Status();
  return invalidArgument("ranks hold different {}: rank(s) {} differ from rank 0 (SHA-256 {}... on rank 0, {}... on "
                         "rank {})",
                         what, fmt::join(differ, ", "), shortHex(all.data()),
                         shortHex(all.data() + kDigestWords * static_cast<std::size_t>(differ.front())), differ.front());
}

}  // namespace meridian::trainer
