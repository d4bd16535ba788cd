// Link-state rows on the wire (JSON text: nlohmann's text parser keeps its own stack, so a
// deeply nested hostile message cannot exhaust the thread's) and the planner's view.
#include "routing/link_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/index.h"

namespace meridian::routing {

namespace {

using nlohmann::json;

json optional(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

// A figure from the wire: null (missing) or a finite number >= 0 (and <= max).
Result<std::optional<double>> figure(const json& j, const char* what, double max) {
  if (j.is_null()) return std::optional<double>{};
  if (!j.is_number()) return invalidArgument("link row: {} is not a number", what);
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < 0 || v > max) return invalidArgument("link row: {} = {} out of range", what, v);
  return std::optional<double>{v};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One ordered pair as one row sees it: the best smoothed RTT over the paths and the sum of
// their measured rates; with a shared-memory link, that link's rate alone (the TCP paths
// stand by beside it, and their rates are old news).
struct Pair {
  std::optional<double> srttUs;
  std::optional<double> rate;
  std::optional<double> sharedMemoryRate;
  std::optional<double> bestRate() const { return sharedMemoryRate ? sharedMemoryRate : rate; }
};

}  // namespace

std::vector<std::uint8_t> encodeLinkRow(const LinkRow& row) {
  json links = json::array();
  for (const LinkFigures& l : row.links) {
    links.push_back({l.peer, l.path, optional(l.minRttUs), optional(l.srttUs), optional(l.jitterUs), optional(l.loss),
                     optional(l.rateBytesPerSec), l.congested, static_cast<int>(l.kind)});
  }
  const std::string text = json{{"r", row.rank}, {"t", row.atUs}, {"l", std::move(links)}}.dump();
  return {text.begin(), text.end()};
}

Result<LinkRow> decodeLinkRow(std::span<const std::uint8_t> bytes, int worldSize) {
  if (bytes.size() > kMaxLinkRowBytes) {
    return invalidArgument("link row of {} bytes exceeds {}", bytes.size(), kMaxLinkRowBytes);
  }
  const json j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("link row: not a JSON object");
  const auto r = j.find("r"), t = j.find("t"), l = j.find("l");
  if (r == j.end() || !r->is_number_integer() || t == j.end() || !t->is_number_integer() || l == j.end() ||
      !l->is_array()) {
    return invalidArgument("link row: needs integer r and t and an array l");
  }
  LinkRow row;
  const auto rank = r->get<std::int64_t>();
  if (rank < 0 || rank >= worldSize) return invalidArgument("link row: rank {} outside 0..{}", rank, worldSize - 1);
  row.rank = static_cast<int>(rank);
  row.atUs = t->get<std::int64_t>();
  const std::size_t maxLinks = idx(std::max(worldSize - 1, 0)) * kMaxPathsPerPeer;
  if (l->size() > maxLinks) return invalidArgument("link row: {} links for {} ranks", l->size(), worldSize);
  constexpr double kMaxUs = 3.6e9;       // an hour
  constexpr double kMaxRate = 1e13;      // 80 Tbit/s
  for (const json& e : *l) {
    if (!e.is_array() || e.size() != 9 || !e[0].is_number_integer() || !e[1].is_number_integer() ||
        !e[7].is_boolean() || !e[8].is_number_integer()) {
      return invalidArgument("link row: a link is not [peer, path, 5 figures, congested, kind]");
    }
    LinkFigures f;
    const auto peer = e[0].get<std::int64_t>(), path = e[1].get<std::int64_t>();
    if (peer < 0 || peer >= worldSize || peer == rank) return invalidArgument("link row: peer {} of rank {}", peer, rank);
    if (path < 0 || path >= kMaxPathsPerPeer) return invalidArgument("link row: path {} out of range", path);
    f.peer = static_cast<int>(peer);
    f.path = static_cast<int>(path);
    MERIDIAN_ASSIGN_OR_RETURN(f.minRttUs, figure(e[2], "min RTT", kMaxUs));
    MERIDIAN_ASSIGN_OR_RETURN(f.srttUs, figure(e[3], "smoothed RTT", kMaxUs));
    MERIDIAN_ASSIGN_OR_RETURN(f.jitterUs, figure(e[4], "jitter", kMaxUs));
    MERIDIAN_ASSIGN_OR_RETURN(f.loss, figure(e[5], "loss", 1.0));
    MERIDIAN_ASSIGN_OR_RETURN(f.rateBytesPerSec, figure(e[6], "rate", kMaxRate));
    f.congested = e[7].get<bool>();
    const auto kind = e[8].get<std::int64_t>();
    if (kind < 0 || kind > static_cast<int>(transport::PathKind::kSharedMemory)) {
      return invalidArgument("link row: path kind {} out of range", kind);
    }
    f.kind = static_cast<transport::PathKind>(kind);
    row.links.push_back(f);
  }
  return row;
}

LinkStateTable::LinkStateTable(int worldSize) : worldSize_(worldSize), rows_(idx(std::max(worldSize, 0))) {}

Status LinkStateTable::update(LinkRow row) {
  if (row.rank < 0 || row.rank >= worldSize_) {
    return invalidArgument("link row of rank {} in a table of {} ranks", row.rank, worldSize_);
  }
  auto& slot = rows_[idx(row.rank)];
  if (slot && slot->atUs > row.atUs) return Status::ok();
  slot = std::move(row);
  return Status::ok();
}

namespace {

// pairs[i * n + j]: what rank i's row says about j.
std::vector<Pair> pairsOf(const std::vector<std::optional<LinkRow>>& rows, int n) {
  std::vector<Pair> pairs(idx(n) * idx(n));
  for (int i = 0; i < n; ++i) {
    if (!rows[idx(i)]) continue;
    for (const LinkFigures& f : rows[idx(i)]->links) {
      if (f.peer < 0 || f.peer >= n) continue;
      Pair& p = pairs[idx(i) * idx(n) + idx(f.peer)];
      if (f.srttUs) p.srttUs = p.srttUs ? std::min(*p.srttUs, *f.srttUs) : *f.srttUs;
      if (f.rateBytesPerSec && *f.rateBytesPerSec > 0) {
        auto& sum = f.kind == transport::PathKind::kSharedMemory ? p.sharedMemoryRate : p.rate;
        sum = sum.value_or(0) + *f.rateBytesPerSec;
      }
    }
  }
  return pairs;
}

std::optional<double> pairRtt(const std::vector<Pair>& pairs, int n, int i, int j) {
  const auto& a = pairs[idx(i) * idx(n) + idx(j)].srttUs;
  const auto& b = pairs[idx(j) * idx(n) + idx(i)].srttUs;
  if (a && b) return std::min(*a, *b);
  return a ? a : b;
}

}  // namespace

bool LinkStateTable::complete() const {
  const std::vector<Pair> pairs = pairsOf(rows_, worldSize_);
  for (int i = 0; i < worldSize_; ++i) {
    for (int j = i + 1; j < worldSize_; ++j) {
      if (!pairRtt(pairs, worldSize_, i, j)) return false;
    }
  }
  return true;
}

std::size_t LinkStateTable::measuredRates() const {
  std::size_t n = 0;
  for (const auto& row : rows_) {
    if (!row) continue;
    for (const auto& l : row->links) n += l.rateBytesPerSec ? 1 : 0;
  }
  return n;
}

std::vector<double> LinkStateTable::rttMatrixUs() const {
  const int n = worldSize_;
  const std::vector<Pair> pairs = pairsOf(rows_, n);
  std::vector<double> m(idx(n) * idx(n), -1.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      if (auto rtt = pairRtt(pairs, n, i, j)) m[idx(i) * idx(n) + idx(j)] = *rtt;
    }
  }
  return m;
}

NetworkView LinkStateTable::view(const std::vector<int>& regionOf, int regions) const {
  const int n = worldSize_;
  const std::vector<Pair> pairs = pairsOf(rows_, n);
  NetworkView v;
  v.ranks = n;
  v.regions = regions;
  v.regionOf = regionOf;
  v.links.assign(idx(n) * idx(n), LinkCost{});
  auto at = [&](int i, int j) -> const Pair& { return pairs[idx(i) * idx(n) + idx(j)]; };
  // Measured pairs, for the stand-ins: per region pair (unordered) and with their RTT. Pairs
  // on two hosts only: neither a shared-memory link nor the loopback TCP beside it says
  // anything about a pair on two hosts.
  std::vector<std::vector<double>> byRegions(idx(regions) * idx(regions));
  std::vector<std::pair<double, double>> rttRate;  // (RTT, rate)
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j || !at(i, j).rate || at(i, j).sharedMemoryRate || at(j, i).sharedMemoryRate) continue;
      const int a = std::min(regionOf[idx(i)], regionOf[idx(j)]), b = std::max(regionOf[idx(i)], regionOf[idx(j)]);
      byRegions[idx(a) * idx(regions) + idx(b)].push_back(*at(i, j).rate);
      if (auto rtt = pairRtt(pairs, n, i, j)) rttRate.emplace_back(*rtt, *at(i, j).rate);
    }
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const std::optional<double> rtt = pairRtt(pairs, n, i, j);
      if (!rtt) continue;  // unusable: rate 0
      LinkCost& link = v.links[idx(i) * idx(n) + idx(j)];
      link.latencySec = *rtt / 2 * 1e-6;
      if (auto own = at(i, j).bestRate()) {
        link.bytesPerSec = *own;
      } else if (auto back = at(j, i).bestRate()) {
        link.bytesPerSec = *back;
      } else {
        const int a = std::min(regionOf[idx(i)], regionOf[idx(j)]), b = std::max(regionOf[idx(i)], regionOf[idx(j)]);
        const auto& same = byRegions[idx(a) * idx(regions) + idx(b)];
        std::vector<double> near;
        for (const auto& [r, rate] : rttRate) {
          if (r <= *rtt * 1.5 && *rtt <= r * 1.5) near.push_back(rate);
        }
        if (!same.empty()) {
          link.bytesPerSec = median(same);
        } else if (!near.empty()) {
          link.bytesPerSec = median(near);
        } else {
          link.bytesPerSec = std::min(kPriorMaxBytesPerSec, kPriorWindowBytes / std::max(*rtt * 1e-6, 1e-6));
        }
      }
    }
  }
  return v;
}

}  // namespace meridian::routing
