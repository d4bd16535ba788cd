// Meridian's metrics snapshot as prometheus-cpp metric families, and its text exposition.
// The HTTP side is in monitoring/exporter.h.
#pragma once

#include <string>
#include <vector>

#include <prometheus/metric_family.h>

#include "core/metrics.h"

namespace meridian::monitoring {

// Our snapshot as prometheus-cpp families: same names, help and labels; counters and
// gauges as such; histograms with cumulative bucket counts (+Inf last), sample_count and
// sample_sum. _count is the +Inf bucket's count, so the two agree even when observations
// race the snapshot. Help text is escaped as the text format wants (\\ and \n).
std::vector<prometheus::MetricFamily> toPrometheusFamilies(const std::vector<MetricFamilySnapshot>& snapshot);

// The text exposition of a registry (prometheus::TextSerializer over toPrometheusFamilies).
std::string renderText(const MetricsRegistry& registry);

}  // namespace meridian::monitoring
