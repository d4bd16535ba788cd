// The MLP's backward against finite differences, width parsing, gradient buckets and the
// int8 wire blocks.
#include "trainer/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "trainer/sync.h"

namespace meridian::trainer {
namespace {

struct GradCase {
  kernels::Activation act;
  const char* name;
};

class MlpGradientTest : public ::testing::TestWithParam<GradCase> {};

// Every parameter's analytic gradient against a central difference of the mean loss. The
// loss is computed in float, so the step is large enough to stay above its rounding.
TEST_P(MlpGradientTest, BackwardMatchesFiniteDifferences) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {6, 5, 4, 3};
  cfg.activation = GetParam().act;
  const int rows = 4;
  Mlp model(*backend, cfg, rows, 42);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < rows * 6; ++i) model.input()[i] = normal(rng);
  for (int i = 0; i < rows; ++i) model.labels()[i] = i % 3;
  // Bigger weights than the initialiser's, so GELU's curvature and ReLU's kinks matter.
  for (std::size_t i = 0; i < model.paramCount(); ++i) model.params()[i] = 0.7f * normal(rng);

  model.forwardBackward(rows, 1.0f, nullptr);
  std::vector<float> analytic(model.grads(), model.grads() + model.paramCount());
  const float eps = 2e-3f;
  int checked = 0;
  for (std::size_t i = 0; i < model.paramCount(); ++i) {
    const float saved = model.params()[i];
    model.params()[i] = saved + eps;
    const double up = model.forward(rows).lossSum / rows;
    model.params()[i] = saved - eps;
    const double down = model.forward(rows).lossSum / rows;
    model.params()[i] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    EXPECT_NEAR(static_cast<double>(analytic[i]), numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << GetParam().name << " parameter " << i;
    ++checked;
  }
  EXPECT_EQ(checked, (6 * 5 + 5) + (5 * 4 + 4) + (4 * 3 + 3));
}

INSTANTIATE_TEST_SUITE_P(Activations, MlpGradientTest,
                         ::testing::Values(GradCase{kernels::Activation::kRelu, "relu"},
                                           GradCase{kernels::Activation::kGelu, "gelu"}),
                         [](const ::testing::TestParamInfo<GradCase>& p) { return std::string(p.param.name); });

TEST(Mlp, LayoutIsLastLayerFirstAndBackwardReportsLayersInThatOrder) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {8, 6, 4};
  Mlp model(*backend, cfg, 2, 1);
  EXPECT_EQ(model.paramOffset(1), 0u);
  EXPECT_EQ(model.layerEnd(1), 6u * 4 + 4);
  EXPECT_EQ(model.paramOffset(0), model.layerEnd(1));
  EXPECT_EQ(model.layerEnd(0), model.paramCount());
  std::vector<int> order;
  model.forwardBackward(2, 1.0f, [&](int l) { order.push_back(l); });
  EXPECT_EQ(order, (std::vector<int>{1, 0}));
}

TEST(Mlp, SameSeedSameWeightsOtherSeedOtherWeights) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {10, 7, 3};
  Mlp a(*backend, cfg, 1, 5), b(*backend, cfg, 1, 5), c(*backend, cfg, 1, 6);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), a.paramCount() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.params(), c.params(), a.paramCount() * sizeof(float)), 0);
}

TEST(Widths, ParseAndRefuse) {
  auto ok = parseWidths("784-1024-10");
  ASSERT_TRUE(ok.isOk());
  EXPECT_EQ(*ok, (std::vector<int>{784, 1024, 10}));
  EXPECT_EQ(formatWidths(*ok), "784-1024-10");
  for (const char* bad : {"", "784", "784--10", "784-x-10", "784-0-10", "784-99999999999-10", "-784-10"}) {
    auto r = parseWidths(bad);
    EXPECT_FALSE(r.isOk()) << bad;
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(Buckets, CoverTheGradientsInBackwardOrder) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {100, 50, 30, 10};  // layer sizes 5050, 1530, 310 floats
  Mlp model(*backend, cfg, 1, 1);
  for (std::size_t bytes : {std::size_t{4}, std::size_t{1000}, std::size_t{4096}, std::size_t{1} << 20}) {
    const auto buckets = planBuckets(model, bytes);
    ASSERT_FALSE(buckets.empty());
    std::size_t pos = 0;
    int prevLayer = model.layers();
    for (const Bucket& b : buckets) {
      EXPECT_EQ(b.begin, pos) << bytes;
      EXPECT_GT(b.end, b.begin);
      EXPECT_LE(b.end - b.begin, std::max<std::size_t>(1, bytes / 4)) << bytes;
      EXPECT_LE(b.lastLayer, prevLayer);
      // Complete once its lowest layer is: nothing of a lower layer inside it.
      EXPECT_LE(model.paramOffset(b.lastLayer), b.end - 1);
      EXPECT_GE(model.layerEnd(b.lastLayer), b.end);
      prevLayer = b.lastLayer;
      pos = b.end;
    }
    EXPECT_EQ(pos, model.paramCount());
  }
  // One big bucket: everything, complete with layer 0.
  const auto one = planBuckets(model, std::size_t{1} << 30);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].lastLayer, 0);
}

// A one-rank "group" whose allreduces finish when waited for (the average of one is itself).
class LoneComm final : public SyncComm {
 public:
  class Done final : public Pending {
   public:
    explicit Done(int* waits) : waits_(waits) {}
    Status wait() override {
      ++*waits_;
      return Status();
    }

   private:
    int* waits_;
  };
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::unique_ptr<Pending> allreduceAsync(void*, std::size_t, kernels::DataType, kernels::ReduceOp) override {
    return std::make_unique<Done>(&waits);
  }
  Status allreduce(void*, std::size_t, kernels::DataType, kernels::ReduceOp) override { return Status(); }
  Status allgather(const void*, void*, std::size_t, kernels::DataType) override { return Status(); }
  Status barrier() override { return Status(); }
  int waits = 0;
};

TEST(GradientSyncTest, HandsEachBucketToTheOptimizerOnceAveragedInBucketOrder) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {100, 50, 30, 10};
  Mlp model(*backend, cfg, 1, 1);
  LoneComm comm;
  GradientSync sync(*backend, &comm, model, 4096, Wire::kF32);
  ASSERT_GT(sync.buckets().size(), 2u);
  std::vector<std::pair<std::size_t, std::size_t>> seen;
  for (int layer = model.layers() - 1; layer >= 0; --layer) sync.onLayerDone(layer);
  ASSERT_TRUE(sync.finish([&](std::size_t b, std::size_t e) {
    // Handed over only after its own allreduce was waited for.
    EXPECT_EQ(comm.waits, static_cast<int>(seen.size()) + 1);
    seen.emplace_back(b, e);
  }).isOk());
  ASSERT_EQ(seen.size(), sync.buckets().size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, sync.buckets()[i].begin);
    EXPECT_EQ(seen[i].second, sync.buckets()[i].end);
  }
  // Without peers there is nothing to wait for: the whole buffer at once.
  GradientSync alone(*backend, nullptr, model, 4096, Wire::kF32);
  seen.clear();
  ASSERT_TRUE(alone.finish([&](std::size_t b, std::size_t e) { seen.emplace_back(b, e); }).isOk());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], std::make_pair(std::size_t{0}, model.paramCount()));
}

TEST(Int8Wire, RoundTripWithinHalfAStepPerBlock) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t n = 3 * kInt8Block + 17;
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  x[5] = 40.0f;  // one block with a large value: its scale is coarse, the others stay fine
  std::vector<std::uint8_t> packed(int8PackedBytes(n));
  EXPECT_EQ(packed.size(), 4 * sizeof(float) + n);
  packInt8(x.data(), n, packed.data());
  std::vector<float> y(n, 1.0f);
  unpackInt8Add(packed.data(), n, y.data());
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t lo = i / kInt8Block * kInt8Block;
    float absmax = 0;
    for (std::size_t j = lo; j < std::min(n, lo + kInt8Block); ++j) absmax = std::max(absmax, std::fabs(x[j]));
    EXPECT_NEAR(y[i] - 1.0f, x[i], 0.5f * absmax / 127.0f + 1e-6f) << i;
  }
  // A block of zeros and a corrupt (NaN) scale decode to zero, never NaN.
  std::vector<float> zeros(10, 0.0f), out(10, 0.0f);
  std::vector<std::uint8_t> p(int8PackedBytes(10));
  packInt8(zeros.data(), 10, p.data());
  const float nan = std::nanf("");
  std::memcpy(p.data(), &nan, sizeof nan);
  unpackInt8Add(p.data(), 10, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(WireFormats, ParseAndSize) {
  EXPECT_EQ(parseWire("bf16").value(), Wire::kBF16);
  EXPECT_FALSE(parseWire("fp8").isOk());
  EXPECT_EQ(wireBytesPerElement(Wire::kF32), 4);
  EXPECT_LT(wireBytesPerElement(Wire::kInt8), 1.02);
}

}  // namespace
}  // namespace meridian::trainer
