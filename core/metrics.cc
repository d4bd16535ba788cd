// The metrics registry.
#include "core/metrics.h"

#include <algorithm>

#include "core/check.h"

namespace meridian {

void Gauge::add(double d) {
  std::uint64_t old = bits_.load(std::memory_order_relaxed);
  while (!bits_.compare_exchange_weak(old, std::bit_cast<std::uint64_t>(std::bit_cast<double>(old) + d),
                                      std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> upperBounds) : bounds_(std::move(upperBounds)) {
  MERIDIAN_CHECK_MSG(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram bounds must be sorted");
  buckets_ = std::make_unique<std::atomic<std::uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.add(v);
}

std::vector<std::uint64_t> Histogram::bucketCounts() const {
  std::vector<std::uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

double Histogram::sum() const { return sum_.value(); }

MetricsRegistry& MetricsRegistry::global() {
  static MetricsRegistry* registry = new MetricsRegistry();  // never destroyed: used by exit-time threads
  return *registry;
}

namespace {
bool validName(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Sorts `labels` by key after checking each name is valid and appears once.
void checkLabelSet(MetricLabels& labels, const char* what) {
  for (const auto& [k, v] : labels) MERIDIAN_CHECK_MSG(validName(k), "invalid label name '{}' in {}", k, what);
  std::sort(labels.begin(), labels.end());
  auto twice = std::adjacent_find(labels.begin(), labels.end(),
                                  [](const auto& a, const auto& b) { return a.first == b.first; });
  MERIDIAN_CHECK_MSG(twice == labels.end(), "label '{}' given twice in {}", twice->first, what);
}

bool hasKey(const MetricLabels& labels, const std::string& key) {
  return std::any_of(labels.begin(), labels.end(), [&](const auto& kv) { return kv.first == key; });
}
}  // namespace

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help,
                                                 MetricType type, MetricLabels& labels) {
  MERIDIAN_CHECK_MSG(validName(name), "invalid metric name '{}'", name);
  for (const auto& [k, v] : labels) MERIDIAN_CHECK_MSG(validName(k), "invalid label name '{}' on {}", k, name);
  std::sort(labels.begin(), labels.end());
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.help = help;
    it->second.type = type;
  }
  MERIDIAN_CHECK_MSG(it->second.type == type, "metric {} registered twice with different types", name);
  return it->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, MetricLabels labels) {
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kCounter, labels);
  auto& slot = f.counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, MetricLabels labels) {
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kGauge, labels);
  auto& slot = f.gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help, MetricLabels labels,
                                      std::vector<double> upperBounds) {
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kHistogram, labels);
  auto& slot = f.histograms[labels];
  if (!slot) {
    slot = std::make_unique<Histogram>(std::move(upperBounds));
  } else {
    MERIDIAN_CHECK_MSG(slot->upperBounds() == upperBounds, "histogram {} re-registered with other buckets", name);
  }
  return *slot;
}

void MetricsRegistry::setConstLabels(MetricLabels labels) {
  checkLabelSet(labels, "const labels");
  std::lock_guard lock(mu_);
  constLabels_ = std::move(labels);
}

void MetricsRegistry::annotate(std::string key, std::string value, MetricLabels extra, MetricLabels when) {
  MERIDIAN_CHECK_MSG(validName(key), "invalid label name '{}' to annotate", key);
  checkLabelSet(extra, "an annotation");
  checkLabelSet(when, "an annotation's condition");
  std::sort(when.begin(), when.end());
  std::lock_guard lock(mu_);
  auto& list = annotations_[{std::move(key), std::move(value)}];
  for (auto& a : list) {
    if (a.when == when) {
      a.extra = std::move(extra);
      return;
    }
  }
  list.push_back(Annotation{std::move(when), std::move(extra)});
}

MetricLabels MetricsRegistry::decorated(const MetricLabels& own) const {
  if (constLabels_.empty() && annotations_.empty()) return own;
  MetricLabels out = own;
  auto addMissing = [&out](const MetricLabels& extra) {
    for (const auto& kv : extra) {
      if (!hasKey(out, kv.first)) out.push_back(kv);
    }
  };
  for (const auto& kv : own) {
    auto it = annotations_.find(kv);
    if (it == annotations_.end()) continue;
    for (const auto& a : it->second) {
      bool applies = true;
      for (const auto& cond : a.when) applies = applies && std::find(own.begin(), own.end(), cond) != own.end();
      if (applies) addMissing(a.extra);
    }
  }
  addMissing(constLabels_);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<MetricFamilySnapshot> MetricsRegistry::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<MetricFamilySnapshot> out;
  out.reserve(families_.size());
  for (const auto& [name, f] : families_) {
    MetricFamilySnapshot s;
    s.name = name;
    s.help = f.help;
    s.type = f.type;
    for (const auto& [labels, c] : f.counters) {
      MetricSample m;
      m.labels = decorated(labels);
      m.value = static_cast<double>(c->value());
      s.samples.push_back(std::move(m));
    }
    for (const auto& [labels, g] : f.gauges) {
      MetricSample m;
      m.labels = decorated(labels);
      m.value = g->value();
      s.samples.push_back(std::move(m));
    }
    for (const auto& [labels, h] : f.histograms) {
      MetricSample m;
      m.labels = decorated(labels);
      m.upperBounds = h->upperBounds();
      m.buckets = h->bucketCounts();
      m.count = h->count();
      m.sum = h->sum();
      s.samples.push_back(std::move(m));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<double> exponentialBuckets(double start, double factor, int count) {
  MERIDIAN_CHECK_GT(start, 0.0);
  MERIDIAN_CHECK_GT(factor, 1.0);
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

}  // namespace meridian
