// The model's backward (MLP and CNN) against finite differences, the model text,
// gradient buckets and the int8 wire blocks.
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
  const char* model;  // parseModel's text
  const char* name;
};

class ModelGradientTest : public ::testing::TestWithParam<GradCase> {};

// Every parameter's analytic gradient against a central difference of the mean loss. The
// loss is computed in float, so the step is large enough to stay above its rounding, and
// small enough that a ReLU kink or a near-tie in a pooling window is rarely crossed.
TEST_P(ModelGradientTest, BackwardMatchesFiniteDifferences) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.activation = GetParam().act;
  ASSERT_TRUE(parseModel(GetParam().model, &cfg).isOk());
  const int rows = 4;
  Model model(*backend, cfg, rows, 42);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < rows * model.inputs(); ++i) model.input()[i] = normal(rng);
  for (int i = 0; i < rows; ++i) model.labels()[i] = i % model.classes();
  // Bigger weights than the initialiser's, so GELU's curvature and ReLU's kinks matter.
  for (std::size_t i = 0; i < model.paramCount(); ++i) model.params()[i] = 0.7f * normal(rng);

  model.forwardBackward(rows, 1.0f, nullptr);
  std::vector<float> analytic(model.grads(), model.grads() + model.paramCount());
  const float eps = 1e-3f;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < model.paramCount(); ++i) {
    const float saved = model.params()[i];
    model.params()[i] = saved + eps;
    const double up = model.forward(rows).lossSum / rows;
    model.params()[i] = saved - eps;
    const double down = model.forward(rows).lossSum / rows;
    model.params()[i] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    EXPECT_NEAR(static_cast<double>(analytic[i]), numeric, 2e-3 + 2e-2 * std::fabs(numeric))
        << GetParam().name << " parameter " << i;
    ++checked;
  }
  EXPECT_EQ(checked, model.paramCount());
}

// The CNN: 4 x 4 images, two conv blocks (2 then 3 channels, 4 -> 2 -> 1 pixels a side),
// then dense 3 -> 4 -> 3: every path of convBackward, col2im included, is covered.
INSTANTIATE_TEST_SUITE_P(Models, ModelGradientTest,
                         ::testing::Values(GradCase{kernels::Activation::kRelu, "6-5-4-3", "mlp_relu"},
                                           GradCase{kernels::Activation::kGelu, "6-5-4-3", "mlp_gelu"},
                                           GradCase{kernels::Activation::kRelu, "16-c2-c3-4-3", "cnn_relu"},
                                           GradCase{kernels::Activation::kGelu, "16-c2-c3-4-3", "cnn_gelu"},
                                           GradCase{kernels::Activation::kGelu, "36-c3-5", "cnn_one_block"}),
                         [](const ::testing::TestParamInfo<GradCase>& p) { return std::string(p.param.name); });

TEST(Model, ConvLayoutCountsTapsAndBackwardReportsEveryLayer) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  ASSERT_TRUE(parseModel("784-c16-c32-128-10", &cfg).isOk());
  EXPECT_EQ(cfg.widths, (std::vector<int>{784, 128, 10}));
  EXPECT_EQ(cfg.convChannels, (std::vector<int>{16, 32}));
  Model model(*backend, cfg, 3, 1);
  ASSERT_EQ(model.layers(), 4);
  EXPECT_TRUE(model.isConv(0));
  EXPECT_TRUE(model.isConv(1));
  EXPECT_FALSE(model.isConv(2));
  EXPECT_EQ(model.layerEnd(3), 128u * 10 + 10);
  EXPECT_EQ(model.layerEnd(2) - model.paramOffset(2), 7u * 7 * 32 * 128 + 128);  // 28 -> 14 -> 7 pixels
  EXPECT_EQ(model.layerEnd(1) - model.paramOffset(1), 25u * 16 * 32 + 32);
  EXPECT_EQ(model.layerEnd(0) - model.paramOffset(0), 25u * 1 * 16 + 16);
  EXPECT_EQ(model.layerEnd(0), model.paramCount());
  std::vector<int> order;
  for (int i = 0; i < 3 * 784; ++i) model.input()[i] = static_cast<float>(i % 29) / 29.0f;
  const kernels::LossStats stats = model.forwardBackward(3, 1.0f, [&](int l) { order.push_back(l); });
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1, 0}));
  EXPECT_TRUE(std::isfinite(stats.lossSum));
  // Freshly initialised: roughly uniform predictions over 10 classes.
  EXPECT_NEAR(stats.lossSum / 3, std::log(10.0), 1.0);
}

TEST(Model, LayoutIsLastLayerFirstAndBackwardReportsLayersInThatOrder) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {8, 6, 4};
  Model model(*backend, cfg, 2, 1);
  EXPECT_EQ(model.paramOffset(1), 0u);
  EXPECT_EQ(model.layerEnd(1), 6u * 4 + 4);
  EXPECT_EQ(model.paramOffset(0), model.layerEnd(1));
  EXPECT_EQ(model.layerEnd(0), model.paramCount());
  std::vector<int> order;
  model.forwardBackward(2, 1.0f, [&](int l) { order.push_back(l); });
  EXPECT_EQ(order, (std::vector<int>{1, 0}));
}

TEST(Model, SameSeedSameWeightsOtherSeedOtherWeights) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {10, 7, 3};
  Model a(*backend, cfg, 1, 5), b(*backend, cfg, 1, 5), c(*backend, cfg, 1, 6);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), a.paramCount() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.params(), c.params(), a.paramCount() * sizeof(float)), 0);
}

TEST(ModelText, ParsesFormatsAndRefusesWithTheReason) {
  for (const char* text : {"784-1024-10", "784-c16-c32-128-10", "784-c8-10", "16-c2-c3-4-3"}) {
    ModelConfig cfg;
    ASSERT_TRUE(parseModel(text, &cfg).isOk()) << text;
    EXPECT_EQ(formatModel(cfg), text);
  }
  ModelConfig cfg;
  cfg.activation = kernels::Activation::kGelu;
  ASSERT_TRUE(parseModel("784-1024-10", &cfg).isOk());
  EXPECT_EQ(cfg.widths, (std::vector<int>{784, 1024, 10}));
  EXPECT_TRUE(cfg.convChannels.empty());
  EXPECT_EQ(cfg.activation, kernels::Activation::kGelu) << "the activation is not the text's business";
  const std::pair<const char*, const char*> refused[] = {
      {"", "is not a width"},
      {"784", "need at least inputs and classes"},
      {"784--10", "is not a width"},
      {"784-x-10", "is not a width"},
      {"784-0-10", "is not a width"},
      {"784-99999999999-10", "is not a width"},
      {"-784-10", "is not a width"},
      {"784-c0-10", "is not a width"},
      {"784-c-10", "is not a width"},
      {"784-128-c16-10", "go right after the input"},
      {"c16-784-10", "go right after the input"},
      {"784-c16", "need at least inputs and classes"},
      {"785-c16-10", "not a square number"},
      {"784-c4-c4-c4-10", "cannot halve"},
  };
  for (const auto& [text, why] : refused) {
    ModelConfig untouched;
    const Status st = parseModel(text, &untouched);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(why), std::string::npos) << text << ": " << st.message();
    EXPECT_EQ(untouched.widths, ModelConfig{}.widths) << "a refused text leaves the config alone";
  }
}

TEST(Buckets, CoverTheGradientsInBackwardOrder) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {100, 50, 30, 10};  // layer sizes 5050, 1530, 310 floats
  Model model(*backend, cfg, 1, 1);
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
  Model model(*backend, cfg, 1, 1);
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

// Set-up code that returns a Status builds the model and the gradient sync through create():
// what the constructors refuse comes back as kInvalidArgument, never as an exception.
TEST(Model, CreateRefusesABadConfigOrBatchWithAStatus) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {784};  // no layer at all
  Result<std::unique_ptr<Model>> m = internalError("not run");
  EXPECT_NO_THROW(m = Model::create(*backend, cfg, 4, 1));
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  cfg.widths = {16, 8, 4};
  EXPECT_NO_THROW(m = Model::create(*backend, cfg, 0, 1));
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().message(), "Model: need a batch of at least one row (not 0)");
  m = Model::create(*backend, cfg, 2, 1);
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m.value()->paramCount(), std::size_t{16 * 8 + 8 + 8 * 4 + 4});
}

TEST(GradientSyncTest, CreateRefusesInt8WithAStatus) {
  auto backend = kernels::makeCpuBackend(1);
  ModelConfig cfg;
  cfg.widths = {16, 8, 4};
  Model model(*backend, cfg, 1, 1);
  Result<std::unique_ptr<GradientSync>> s = internalError("not run");
  EXPECT_NO_THROW(s = GradientSync::create(*backend, nullptr, model, 4096, Wire::kInt8));
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("int8"), std::string::npos) << s.status().toString();
  EXPECT_TRUE(GradientSync::create(*backend, nullptr, model, 4096, Wire::kBF16).isOk());
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
