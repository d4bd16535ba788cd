// The metrics registry every layer records into and monitoring/ serves. Registration
// (by name + fixed labels) takes a lock and returns a reference that stays valid for the
// registry's life; recording on the hot path is a relaxed atomic, never a lock.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace meridian {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(std::uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> v_{0};
};

class Gauge {
 public:
  void set(double v) { bits_.store(std::bit_cast<std::uint64_t>(v), std::memory_order_relaxed); }
  void add(double d);
  double value() const { return std::bit_cast<double>(bits_.load(std::memory_order_relaxed)); }

 private:
  std::atomic<std::uint64_t> bits_{std::bit_cast<std::uint64_t>(0.0)};
};

// Fixed upper bounds chosen at registration; an implicit +Inf bucket follows them.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upperBounds);
  void observe(double v);
  const std::vector<double>& upperBounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds_.size() + 1 entries.
  std::vector<std::uint64_t> bucketCounts() const;
  std::uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;
  std::atomic<std::uint64_t> count_{0};
  Gauge sum_;
};

enum class MetricType { kCounter, kGauge, kHistogram };

struct MetricSample {
  MetricLabels labels;
  double value = 0;                      // counter or gauge
  std::vector<double> upperBounds;       // histogram
  std::vector<std::uint64_t> buckets;    // histogram, per bucket
  std::uint64_t count = 0;               // histogram
  double sum = 0;                        // histogram
};

struct MetricFamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<MetricSample> samples;
};

class MetricsRegistry {
 public:
  // The process-wide registry.
  static MetricsRegistry& global();

  // Names follow meridian_<layer>_<what>_<unit>; labels are sorted by key. Asking again
  // with the same name and labels returns the same metric; a type clash throws CheckError.
  Counter& counter(const std::string& name, const std::string& help, MetricLabels labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, MetricLabels labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, MetricLabels labels,
                       std::vector<double> upperBounds);

  // Labels added to every sample of every family in snapshot() (e.g. rank, region); a
  // sample's own label with the same key wins. Replaces the previous const labels.
  // Throws CheckError on an invalid or repeated label name.
  void setConstLabels(MetricLabels labels);
  // Every sample whose own labels include key=value (and every label of `when`) also gets
  // `extra` in snapshot(), e.g. annotate("peer", "3", {{"peer_region", "virginia"}},
  // {{"prober", "0"}}): peer numbers are per communicator, so `when` names the one meant.
  // Calling again for the same key=value and `when` replaces its extra labels. The sample's
  // own labels win over annotations, annotations over const labels. Throws CheckError on an
  // invalid or repeated label name.
  void annotate(std::string key, std::string value, MetricLabels extra, MetricLabels when = {});

  // Every family by name, samples with their labels (own, annotations, const) sorted by key.
  std::vector<MetricFamilySnapshot> snapshot() const;

 private:
  struct Family {
    std::string help;
    MetricType type;
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
    std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, const std::string& help, MetricType type, MetricLabels& labels);
  // A sample's labels as snapshot() shows them (caller holds mu_).
  MetricLabels decorated(const MetricLabels& own) const;

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  MetricLabels constLabels_;
  struct Annotation {
    MetricLabels when;
    MetricLabels extra;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Annotation>> annotations_;  // (key, value) -> ...
};

// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> exponentialBuckets(double start, double factor, int count);

}  // namespace meridian
