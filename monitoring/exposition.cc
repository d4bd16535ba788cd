// Snapshot -> prometheus-cpp families -> text.
#include "monitoring/exposition.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>
#include <prometheus/text_serializer.h>

namespace meridian::monitoring {

namespace {

prometheus::MetricType toPrometheusType(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return prometheus::MetricType::Counter;
    case MetricType::kGauge: return prometheus::MetricType::Gauge;
    case MetricType::kHistogram: return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

// prometheus-cpp writes HELP as given; the format escapes backslash and newline there.
std::string escapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Per-bucket counts -> cumulative buckets ending with +Inf. Tolerates a hand-made sample
// whose bucket list does not match its bounds: missing counts are 0, extra ones and those
// above a non-finite bound fall into +Inf.
prometheus::ClientMetric::Histogram toHistogram(const MetricSample& s) {
  prometheus::ClientMetric::Histogram h;
  std::uint64_t cumulative = 0;
  std::size_t i = 0;
  for (; i < s.upperBounds.size() && std::isfinite(s.upperBounds[i]); ++i) {
    if (i < s.buckets.size()) cumulative += s.buckets[i];
    h.bucket.push_back({cumulative, s.upperBounds[i]});
  }
  for (; i < s.buckets.size(); ++i) cumulative += s.buckets[i];
  h.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  h.sample_count = cumulative;
  h.sample_sum = s.sum;
  return h;
}

}  // namespace

std::vector<prometheus::MetricFamily> toPrometheusFamilies(const std::vector<MetricFamilySnapshot>& snapshot) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(snapshot.size());
  for (const MetricFamilySnapshot& f : snapshot) {
    prometheus::MetricFamily pf;
    pf.name = f.name;
    pf.help = escapeHelp(f.help);
    pf.type = toPrometheusType(f.type);
    pf.metric.reserve(f.samples.size());
    for (const MetricSample& s : f.samples) {
      prometheus::ClientMetric m;
      m.label.reserve(s.labels.size());
      for (const auto& [name, value] : s.labels) m.label.push_back({name, value});
      switch (f.type) {
        case MetricType::kCounter: m.counter.value = s.value; break;
        case MetricType::kGauge: m.gauge.value = s.value; break;
        case MetricType::kHistogram: m.histogram = toHistogram(s); break;
      }
      pf.metric.push_back(std::move(m));
    }
    out.push_back(std::move(pf));
  }
  return out;
}

std::string renderText(const MetricsRegistry& registry) {
  return prometheus::TextSerializer().Serialize(toPrometheusFamilies(registry.snapshot()));
}

}  // namespace meridian::monitoring
