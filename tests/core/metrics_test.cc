// The metrics registry: identity by name and labels, types, histograms, concurrency.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/metrics.h"

namespace meridian {
namespace {

TEST(MetricsTest, SameNameAndLabelsIsTheSameMetric) {
  MetricsRegistry r;
  Counter& a = r.counter("meridian_test_things_total", "things", {{"peer", "1"}, {"path", "0"}});
  Counter& b = r.counter("meridian_test_things_total", "things", {{"path", "0"}, {"peer", "1"}});
  Counter& c = r.counter("meridian_test_things_total", "things", {{"path", "1"}, {"peer", "1"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  a.add(3);
  b.add();
  EXPECT_EQ(a.value(), 4u);
}

TEST(MetricsTest, TypeClashAndBadNamesThrow) {
  MetricsRegistry r;
  r.counter("meridian_test_x", "x");
  EXPECT_THROW(r.gauge("meridian_test_x", "x"), CheckError);
  EXPECT_THROW(r.counter("9starts_with_digit", "x"), CheckError);
  EXPECT_THROW(r.counter("meridian_ok", "x", {{"bad-label", "v"}}), CheckError);
}

TEST(MetricsTest, GaugeSetsAndAdds) {
  MetricsRegistry r;
  Gauge& g = r.gauge("meridian_test_rate_bytes_per_second", "rate");
  g.set(2.5);
  g.add(-1.0);
  EXPECT_DOUBLE_EQ(g.value(), 1.5);
}

TEST(MetricsTest, HistogramCountsIntoBuckets) {
  MetricsRegistry r;
  Histogram& h = r.histogram("meridian_test_latency_seconds", "lat", {}, {0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.001, 0.005, 0.05, 1.0}) h.observe(v);
  auto b = h.bucketCounts();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0], 2u);  // <= 0.001 (upper bounds are inclusive)
  EXPECT_EQ(b[1], 1u);
  EXPECT_EQ(b[2], 1u);
  EXPECT_EQ(b[3], 1u);  // +Inf
  EXPECT_EQ(h.count(), 5u);
  EXPECT_NEAR(h.sum(), 1.0565, 1e-12);
  EXPECT_THROW(r.histogram("meridian_test_latency_seconds", "lat", {}, {1.0}), CheckError);
}

TEST(MetricsTest, ConcurrentRecordingLosesNothing) {
  MetricsRegistry r;
  Counter& c = r.counter("meridian_test_concurrent_total", "c");
  Histogram& h = r.histogram("meridian_test_concurrent_seconds", "h", {}, exponentialBuckets(1e-6, 10, 6));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c.add();
        h.observe(1e-5);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.value(), 400000u);
  EXPECT_EQ(h.count(), 400000u);
  EXPECT_NEAR(h.sum(), 4.0, 1e-6);
}

TEST(MetricsTest, SnapshotListsFamiliesWithSamples) {
  MetricsRegistry r;
  r.counter("meridian_test_a_total", "a", {{"k", "v"}}).add(2);
  r.gauge("meridian_test_b", "b").set(7);
  auto snap = r.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].name, "meridian_test_a_total");
  EXPECT_EQ(snap[0].type, MetricType::kCounter);
  ASSERT_EQ(snap[0].samples.size(), 1u);
  EXPECT_EQ(snap[0].samples[0].value, 2.0);
  EXPECT_EQ(snap[0].samples[0].labels[0].second, "v");
  EXPECT_EQ(snap[1].samples[0].value, 7.0);
}

TEST(MetricsTest, ConstLabelsGoOnEverySampleButASamplesOwnLabelWins) {
  MetricsRegistry r;
  r.counter("meridian_test_a_total", "a", {{"peer", "1"}}).add();
  r.gauge("meridian_test_b", "b", {{"rank", "7"}}).set(1);
  r.histogram("meridian_test_c_seconds", "c", {}, {1.0}).observe(0.5);
  r.setConstLabels({{"region", "london"}, {"rank", "0"}});
  auto snap = r.snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[0].samples[0].labels, (MetricLabels{{"peer", "1"}, {"rank", "0"}, {"region", "london"}}));
  EXPECT_EQ(snap[1].samples[0].labels, (MetricLabels{{"rank", "7"}, {"region", "london"}}));
  EXPECT_EQ(snap[2].samples[0].labels, (MetricLabels{{"rank", "0"}, {"region", "london"}}));
  r.setConstLabels({});  // replaces
  EXPECT_EQ(r.snapshot()[0].samples[0].labels, (MetricLabels{{"peer", "1"}}));
}

TEST(MetricsTest, AnnotationsExtendMatchingSamples) {
  MetricsRegistry r;
  r.counter("meridian_test_sent_bytes_total", "s", {{"peer", "3"}, {"path", "0"}}).add();
  r.counter("meridian_test_sent_bytes_total", "s", {{"peer", "4"}, {"path", "1"}}).add();
  r.gauge("meridian_test_rtt_seconds", "rtt", {{"peer", "3"}, {"peer_region", "mine"}}).set(1);
  r.setConstLabels({{"plane", "const"}, {"rank", "0"}});
  r.annotate("peer", "3", {{"peer_region", "virginia"}});
  r.annotate("path", "0", {{"plane", "wan-a"}});
  r.annotate("path", "9", {{"plane", "unused"}});
  auto snap = r.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  ASSERT_EQ(snap[0].name, "meridian_test_rtt_seconds");
  // The sample's own peer_region wins over the annotation.
  EXPECT_EQ(snap[0].samples[0].labels,
            (MetricLabels{{"peer", "3"}, {"peer_region", "mine"}, {"plane", "const"}, {"rank", "0"}}));
  ASSERT_EQ(snap[1].samples.size(), 2u);
  EXPECT_EQ(snap[1].samples[0].labels,
            (MetricLabels{{"path", "0"}, {"peer", "3"}, {"peer_region", "virginia"}, {"plane", "wan-a"}, {"rank", "0"}}));
  EXPECT_EQ(snap[1].samples[1].labels, (MetricLabels{{"path", "1"}, {"peer", "4"}, {"plane", "const"}, {"rank", "0"}}));
  r.annotate("peer", "3", {{"peer_region", "oregon"}});  // replaces
  EXPECT_EQ(r.snapshot()[1].samples[0].labels[2], (std::pair<std::string, std::string>{"peer_region", "oregon"}));
}

// Peer numbers are per communicator: an annotation with a condition labels only the series
// of the communicator it names (its prober or device label).
TEST(MetricsTest, ConditionalAnnotationsLabelOnlyTheirCommunicatorsSeries) {
  MetricsRegistry r;
  r.gauge("meridian_test_rtt_seconds", "rtt", {{"peer", "1"}, {"prober", "0"}}).set(1);     // world
  r.gauge("meridian_test_rtt_seconds", "rtt", {{"peer", "1"}, {"prober", "x0"}}).set(2);    // cross-region
  r.gauge("meridian_test_rtt_seconds", "rtt", {{"peer", "1"}, {"prober", "in0"}}).set(3);   // unlabelled
  r.annotate("peer", "1", {{"peer_region", "london"}}, {{"prober", "0"}});
  r.annotate("peer", "1", {{"peer_region", "virginia"}}, {{"prober", "x0"}});
  auto snap = r.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  std::map<std::string, std::string> regionOf;
  for (const auto& sample : snap[0].samples) {
    std::string prober, region = "-";
    for (const auto& [k, v] : sample.labels) {
      if (k == "prober") prober = v;
      if (k == "peer_region") region = v;
    }
    regionOf[prober] = region;
  }
  EXPECT_EQ(regionOf["0"], "london");
  EXPECT_EQ(regionOf["x0"], "virginia");
  EXPECT_EQ(regionOf["in0"], "-");
  // The same condition again replaces; another condition adds.
  r.annotate("peer", "1", {{"peer_region", "singapore"}}, {{"prober", "x0"}});
  const auto again = r.snapshot();
  for (const auto& sample : again[0].samples) {
    if (std::find(sample.labels.begin(), sample.labels.end(), std::make_pair(std::string("prober"), std::string("x0"))) !=
        sample.labels.end()) {
      EXPECT_NE(std::find(sample.labels.begin(), sample.labels.end(),
                          std::make_pair(std::string("peer_region"), std::string("singapore"))),
                sample.labels.end());
    }
  }
}

TEST(MetricsTest, BadConstLabelsAndAnnotationsThrow) {
  MetricsRegistry r;
  EXPECT_THROW(r.setConstLabels({{"bad-name", "x"}}), CheckError);
  EXPECT_THROW(r.setConstLabels({{"rank", "0"}, {"rank", "1"}}), CheckError);
  EXPECT_THROW(r.annotate("", "3", {{"peer_region", "x"}}), CheckError);
  EXPECT_THROW(r.annotate("peer", "3", {{"9x", "x"}}), CheckError);
  EXPECT_TRUE(r.snapshot().empty());
}

TEST(MetricsTest, LabelHooksAreThreadSafe) {
  MetricsRegistry r;
  r.counter("meridian_test_a_total", "a", {{"peer", "1"}}).add();
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) {
      r.setConstLabels({{"rank", std::to_string(i)}});
      r.annotate("peer", "1", {{"peer_region", std::to_string(i)}});
    }
  });
  for (int i = 0; i < 2000; ++i) {
    auto snap = r.snapshot();
    ASSERT_EQ(snap.size(), 1u);
    EXPECT_GE(snap[0].samples[0].labels.size(), 1u);
  }
  writer.join();
  EXPECT_EQ(r.snapshot()[0].samples[0].labels,
            (MetricLabels{{"peer", "1"}, {"peer_region", "1999"}, {"rank", "1999"}}));
}

}  // namespace
}  // namespace meridian
