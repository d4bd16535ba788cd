// The text exposition of a registry: prometheus-cpp's format over our snapshot.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "monitoring/exposition.h"

namespace meridian::monitoring {
namespace {

TEST(ExpositionTest, RendersCountersGaugesAndHistogramsExactly) {
  MetricsRegistry r;
  r.counter("meridian_test_sent_bytes_total", "Bytes sent.", {{"peer", "1"}}).add(42);
  r.gauge("meridian_test_rtt_seconds", "Round trip \\ per\npath.", {{"path", "a\"b\\c\nd"}}).set(0.25);
  Histogram& h = r.histogram("meridian_test_op_seconds", "Op latency.", {}, {0.5, 2});
  for (double v : {0.25, 0.5, 1.0, 4.0}) h.observe(v);
  EXPECT_EQ(renderText(r),
            "# HELP meridian_test_op_seconds Op latency.\n"
            "# TYPE meridian_test_op_seconds histogram\n"
            "meridian_test_op_seconds_count 4\n"
            "meridian_test_op_seconds_sum 5.75\n"
            "meridian_test_op_seconds_bucket{le=\"0.5\"} 2\n"
            "meridian_test_op_seconds_bucket{le=\"2\"} 3\n"
            "meridian_test_op_seconds_bucket{le=\"+Inf\"} 4\n"
            "# HELP meridian_test_rtt_seconds Round trip \\\\ per\\npath.\n"
            "# TYPE meridian_test_rtt_seconds gauge\n"
            "meridian_test_rtt_seconds{path=\"a\\\"b\\\\c\\nd\"} 0.25\n"
            "# HELP meridian_test_sent_bytes_total Bytes sent.\n"
            "# TYPE meridian_test_sent_bytes_total counter\n"
            "meridian_test_sent_bytes_total{peer=\"1\"} 42\n");
}

TEST(ExpositionTest, ConstLabelsAndAnnotationsAppearSortedByKey) {
  MetricsRegistry r;
  r.counter("meridian_test_sent_bytes_total", "Bytes sent.", {{"peer", "3"}, {"path", "0"}}).add(7);
  r.histogram("meridian_test_op_seconds", "Op latency.", {{"peer", "3"}}, {1}).observe(0.5);
  r.setConstLabels({{"rank", "0"}, {"region", "london"}});
  r.annotate("peer", "3", {{"peer_region", "virginia"}});
  r.annotate("path", "0", {{"plane", "wan-a"}});
  const std::string text = renderText(r);
  const std::string histLabels = "peer=\"3\",peer_region=\"virginia\",rank=\"0\",region=\"london\"";
  for (const std::string& line : std::vector<std::string>{
           "meridian_test_sent_bytes_total{path=\"0\",peer=\"3\",peer_region=\"virginia\",plane=\"wan-a\","
           "rank=\"0\",region=\"london\"} 7\n",
           "meridian_test_op_seconds_count{" + histLabels + "} 1\n",
           "meridian_test_op_seconds_sum{" + histLabels + "} 0.5\n",
           "meridian_test_op_seconds_bucket{" + histLabels + ",le=\"1\"} 1\n",
           "meridian_test_op_seconds_bucket{" + histLabels + ",le=\"+Inf\"} 1\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
}

TEST(ExpositionTest, FamiliesKeepNamesHelpAndCumulativeBuckets) {
  MetricsRegistry r;
  Histogram& h = r.histogram("meridian_test_x_seconds", "x", {{"k", "v"}}, {1, 2, 3});
  for (double v : {0.5, 1.5, 1.5, 2.5, 9.0}) h.observe(v);
  r.counter("meridian_test_y_total", "y").add(3);
  auto families = toPrometheusFamilies(r.snapshot());
  ASSERT_EQ(families.size(), 2u);
  EXPECT_EQ(families[0].name, "meridian_test_x_seconds");
  EXPECT_EQ(families[0].help, "x");
  EXPECT_EQ(families[0].type, prometheus::MetricType::Histogram);
  ASSERT_EQ(families[0].metric.size(), 1u);
  const auto& m = families[0].metric[0];
  ASSERT_EQ(m.label.size(), 1u);
  EXPECT_EQ(m.label[0].name, "k");
  EXPECT_EQ(m.label[0].value, "v");
  ASSERT_EQ(m.histogram.bucket.size(), 4u);
  const std::vector<std::uint64_t> cumulative{1, 3, 4, 5};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.histogram.bucket[i].cumulative_count, cumulative[i]) << i;
  EXPECT_EQ(m.histogram.bucket[2].upper_bound, 3.0);
  EXPECT_TRUE(std::isinf(m.histogram.bucket[3].upper_bound));
  EXPECT_EQ(m.histogram.sample_count, 5u);
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, 15.0);
  EXPECT_EQ(families[1].type, prometheus::MetricType::Counter);
  EXPECT_EQ(families[1].metric[0].counter.value, 3.0);
}

TEST(ExpositionTest, MalformedHandMadeHistogramDoesNotCrash) {
  MetricFamilySnapshot f;
  f.name = "meridian_test_z_seconds";
  f.type = MetricType::kHistogram;
  MetricSample tooFew;  // two bounds, one count
  tooFew.upperBounds = {1, 2};
  tooFew.buckets = {4};
  MetricSample tooMany;  // one bound (then +Inf written out), four counts
  tooMany.upperBounds = {1, std::numeric_limits<double>::infinity()};
  tooMany.buckets = {1, 2, 3, 4};
  f.samples = {tooFew, tooMany, MetricSample{}};
  auto families = toPrometheusFamilies({f});
  ASSERT_EQ(families[0].metric.size(), 3u);
  const auto& a = families[0].metric[0].histogram;
  ASSERT_EQ(a.bucket.size(), 3u);
  EXPECT_EQ(a.bucket[1].cumulative_count, 4u);
  EXPECT_EQ(a.sample_count, 4u);
  const auto& b = families[0].metric[1].histogram;
  ASSERT_EQ(b.bucket.size(), 2u);
  EXPECT_EQ(b.bucket[0].cumulative_count, 1u);
  EXPECT_EQ(b.bucket[1].cumulative_count, 10u);
  const auto& c = families[0].metric[2].histogram;
  ASSERT_EQ(c.bucket.size(), 1u);
  EXPECT_EQ(c.sample_count, 0u);
}

}  // namespace
}  // namespace meridian::monitoring
