// The planner's cost model and its search over algorithms, ring orders, groups and hubs
// (planner.h has the formulas and the assumptions behind them).
#include "routing/planner.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "core/check.h"
#include "core/index.h"

namespace meridian::routing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// alpha + bytes * beta over one link; +infinity when the link is unusable.
double linkSec(const LinkCost& l, double bytes) {
  if (!(l.bytesPerSec > 0)) return kInf;
  return l.latencySec + bytes / l.bytesPerSec;
}
double linkSec(const NetworkView& v, int src, int dst, double bytes) { return linkSec(v.link(src, dst), bytes); }
// Combining `bytes` of a received vector into the local one (0 when the rate is unknown).
double reduceSec(const NetworkView& v, double bytes) { return v.reduceBytesPerSec > 0 ? bytes / v.reduceBytesPerSec : 0; }

std::vector<int> identityOrder(int n) {
  std::vector<int> o(idx(std::max(n, 0)));
  std::iota(o.begin(), o.end(), 0);
  return o;
}

bool isPermutation(const std::vector<int>& order, int n) {
  if (order.size() != idx(n)) return false;
  std::vector<char> seen(idx(n), 0);
  for (int r : order) {
    if (r < 0 || r >= n || seen[idx(r)] != 0) return false;
    seen[idx(r)] = 1;
  }
  return true;
}

// What a plan's (possibly empty) order stands for; a malformed one is the caller's bug.
std::vector<int> orderOrIdentity(const std::vector<int>& order, int n, const char* what) {
  if (order.empty()) return identityOrder(n);
  MERIDIAN_CHECK_MSG(isPermutation(order, n), "{} is not a permutation of 0..{}", what, n - 1);
  return order;
}

std::string fmtSec(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

// ---- The cost model ------------------------------------------------------------------------

struct Hop {
  int src = -1;
  int dst = -1;
  double sec = 0;
};

// The slowest hop of the cyclic ring `ring` when every rank sends `chunk` bytes to its successor
// at once: the duration of one ring step. A ring of fewer than two ranks has no hop (0 s).
Hop ringBottleneck(const NetworkView& v, const std::vector<int>& ring, double chunk) {
  Hop worst;
  const std::size_t n = ring.size();
  if (n < 2) return worst;
  for (std::size_t k = 0; k < n; ++k) {
    const int s = ring[k], d = ring[(k + 1) % n];
    const double t = linkSec(v, s, d, chunk);
    if (worst.src < 0 || t > worst.sec) worst = {s, d, t};
  }
  return worst;
}

double ringSec(const NetworkView& v, const std::vector<int>& ring, double bytes) {
  const std::size_t n = ring.size();
  if (n < 2) return 0;
  const double nd = static_cast<double>(n);
  const double step = ringBottleneck(v, ring, bytes / nd).sec;
  return (nd - 1.0) * (std::max(step, reduceSec(v, bytes / nd)) + step);
}

// Recursive doubling with the fold-in of collectives' recursiveDoublingAllreduce, on the
// virtual numbering `order` (order[v] is the rank playing virtual rank v).
double halvingDoublingSec(const NetworkView& v, const std::vector<int>& order, double bytes) {
  const int n = static_cast<int>(order.size());
  if (n < 2) return 0;
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int extra = n - p;
  auto at = [&](int vr) { return order[idx(vr)]; };
  double fold = 0, unfold = 0;
  for (int k = 0; k < extra; ++k) {
    fold = std::max(fold, linkSec(v, at(2 * k), at(2 * k + 1), bytes) + reduceSec(v, bytes));
    unfold = std::max(unfold, linkSec(v, at(2 * k + 1), at(2 * k), bytes));
  }
  // Survivor s of the doubling: the odd one of fold pair s, or an unpaired rank.
  auto survivor = [&](int s) { return s < extra ? at(2 * s + 1) : at(s + extra); };
  double total = fold + unfold;
  for (int mask = 1; mask < p; mask <<= 1) {
    double round = 0;
    for (int s = 0; s < p; ++s) round = std::max(round, linkSec(v, survivor(s), survivor(s ^ mask), bytes));
    total += round + reduceSec(v, bytes);
  }
  return total;
}

// Binomial reduce to `root` and binomial broadcast back (collectives' binomialReduce /
// binomialBroadcast) on the virtual numbering `order`: a rank's tree position is its distance
// after root in the order.
double treeSec(const NetworkView& v, const std::vector<int>& order, int root, double bytes) {
  const int n = static_cast<int>(order.size());
  if (n < 2) return 0;
  const int rootPos = static_cast<int>(std::find(order.begin(), order.end(), root) - order.begin());
  auto at = [&](int vr) { return order[idx((vr + rootPos) % n)]; };
  double total = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    // Senders of this round of the reduce: lowest set bit == mask; the broadcast mirrors it.
    double up = 0, down = 0;
    for (int vr = mask; vr < n; vr += 2 * mask) {
      up = std::max(up, linkSec(v, at(vr), at(vr - mask), bytes));
      down = std::max(down, linkSec(v, at(vr - mask), at(vr), bytes));
    }
    total += up + reduceSec(v, bytes) + down;
  }
  return total;
}

// The cross-region ring of local index i: the i-th rank of each group, in crossOrder.
std::vector<int> crossRing(const std::vector<std::vector<int>>& groups, const std::vector<int>& cross, std::size_t i) {
  std::vector<int> ring;
  ring.reserve(cross.size());
  for (int k : cross) ring.push_back(groups[idx(k)][i]);
  return ring;
}

double hierarchicalSec(const NetworkView& v, const std::vector<std::vector<int>>& groups,
                       const std::vector<int>& cross, double bytes) {
  const std::size_t g = groups.front().size();
  const double gd = static_cast<double>(g), rd = static_cast<double>(groups.size());
  double total = 0;
  if (g > 1) {
    double intra = 0;
    for (const auto& grp : groups) intra = std::max(intra, ringBottleneck(v, grp, bytes / gd).sec);
    total += (gd - 1.0) * (std::max(intra, reduceSec(v, bytes / gd)) + intra);
  }
  if (groups.size() > 1) {
    const double shard = bytes / (gd * rd);
    double step = 0;
    if (groups.size() <= kDirectCrossMaxRegions) {
      // Direct exchange: the i-th ranks of every two groups trade one shard each way at once.
      for (std::size_t i = 0; i < g; ++i) {
        for (const auto& from : groups) {
          for (const auto& to : groups) {
            if (&from != &to) step = std::max(step, linkSec(v, from[i], to[i], shard));
          }
        }
      }
      total += 2.0 * step + (rd - 1.0) * reduceSec(v, shard);
    } else {
      for (std::size_t i = 0; i < g; ++i) step = std::max(step, ringBottleneck(v, crossRing(groups, cross, i), shard).sec);
      total += (rd - 1.0) * (std::max(step, reduceSec(v, shard)) + step);
    }
  }
  return total;
}

double parameterServerSec(const NetworkView& v, int hub, double bytes) {
  double push = 0, pull = 0;
  for (int j = 0; j < v.ranks; ++j) {
    if (j == hub) continue;
    push = std::max(push, linkSec(v, j, hub, bytes));
    pull = std::max(pull, linkSec(v, hub, j, bytes));
  }
  return std::max(push, static_cast<double>(v.ranks - 1) * reduceSec(v, bytes)) + pull;
}

// The region-ordered cross order of a hierarchical plan, after checking that its groups fit.
std::vector<int> checkedCrossOrder(const NetworkView& v, const Plan& plan) {
  MERIDIAN_CHECK_MSG(!plan.groups.empty(), "hierarchical plan without groups");
  const std::size_t g = plan.groups.front().size();
  std::vector<int> all;
  for (const auto& grp : plan.groups) {
    MERIDIAN_CHECK_MSG(!grp.empty() && grp.size() == g, "hierarchical groups must be non-empty and of equal size");
    all.insert(all.end(), grp.begin(), grp.end());
  }
  MERIDIAN_CHECK_MSG(isPermutation(all, v.ranks), "hierarchical groups must hold each of the {} ranks once", v.ranks);
  return orderOrIdentity(plan.crossOrder, static_cast<int>(plan.groups.size()), "cross-region order");
}

// ---- The ring search -----------------------------------------------------------------------

// Unusable links get a large finite cost in the search, so that move deltas never compute
// inf - inf while any ring of usable links still wins.
constexpr double kUnusableSec = 1e9;

struct Score {
  double max = 0;
  double sum = 0;
};

// Phase 1 order: bottleneck, then total. Ties keep the incumbent.
bool lexBetter(const Score& a, const Score& b) {
  return a.max < b.max || (a.max == b.max && a.sum < b.sum - 1e-12 * std::max(1.0, b.sum));
}

class RingSearch {
 public:
  // cost[i * n + j]: the cost of the hop i -> j.
  RingSearch(std::size_t n, std::vector<double> cost) : n_(n), cost_(std::move(cost)) {}

  Score score(const std::vector<int>& t) const {
    Score s;
    for (std::size_t k = 0; k < n_; ++k) {
      const double e = c(t[k], t[(k + 1) % n_]);
      s.max = std::max(s.max, e);
      s.sum += e;
    }
    return s;
  }

  // Greedy: always on to the cheapest unvisited rank (ties: lower index).
  std::vector<int> nearestNeighbour(int start) const {
    std::vector<int> t{start};
    std::vector<int> left;  // unvisited, increasing, so the first strict minimum is the lowest index
    for (std::size_t j = 0; j < n_; ++j) {
      if (static_cast<int>(j) != start) left.push_back(static_cast<int>(j));
    }
    while (!left.empty()) {
      const double* row = &cost_[idx(t.back()) * n_];
      std::size_t best = 0;
      double bestCost = row[idx(left[0])];
      for (std::size_t k = 1; k < left.size(); ++k) {
        const double cost = row[idx(left[k])];
        if (cost < bestCost) {
          bestCost = cost;
          best = k;
        }
      }
      t.push_back(left[best]);
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(best));
    }
    return t;
  }

  // Local search from `tour`, in place. cap < 0: phase 1, a move must improve (bottleneck,
  // total) lexicographically. cap >= 0: phase 2, a move must lower the total and keep the
  // bottleneck <= cap; the fixed cap stops the bottleneck creeping up move by move (an infinite
  // cap: the total alone).
  void improve(std::vector<int>& tour, double cap) const {
    if (n_ < 3) return;
    State st;
    st.t = std::move(tour);
    rebuild(st);
    // Every accepted move strictly improves a finite order, so this only bounds the time.
    int movesLeft = 20 * static_cast<int>(n_) + 100;
    bool improved = true;
    while (improved && movesLeft > 0) {
      improved = orOpt(st, cap, movesLeft);
      improved = twoOpt(st, cap, movesLeft) || improved;
    }
    tour = std::move(st.t);
  }

 private:
  struct State {
    std::vector<int> t;
    std::vector<double> e;  // e[k]: cost of the hop t[k] -> t[k+1 mod n]
    std::vector<double> prefMax, sufMax;
    std::array<int, 4> top{};  // positions of the 4 costliest hops, costliest first (-1: none)
    Score s;
  };

  double c(int i, int j) const { return cost_[idx(i) * n_ + idx(j)]; }

  void rebuild(State& st) const {
    st.e.assign(n_, 0.0);
    st.s = {};
    for (std::size_t k = 0; k < n_; ++k) {
      st.e[k] = c(st.t[k], st.t[(k + 1) % n_]);
      st.s.max = std::max(st.s.max, st.e[k]);
      st.s.sum += st.e[k];
    }
    st.prefMax.assign(n_, 0.0);
    st.sufMax.assign(n_, 0.0);
    for (std::size_t k = 0; k < n_; ++k) st.prefMax[k] = std::max(k > 0 ? st.prefMax[k - 1] : 0.0, st.e[k]);
    for (std::size_t k = n_; k-- > 0;) st.sufMax[k] = std::max(k + 1 < n_ ? st.sufMax[k + 1] : 0.0, st.e[k]);
    st.top.fill(-1);
    for (std::size_t k = 0; k < n_; ++k) {
      int pos = static_cast<int>(k);
      for (int& slot : st.top) {
        if (slot < 0 || st.e[idx(pos)] > st.e[idx(slot)]) std::swap(slot, pos);
        if (pos < 0) break;
      }
    }
  }

  bool accept(const State& st, double newMax, double newSum, double cap) const {
    if (cap < 0) return lexBetter({newMax, newSum}, st.s);
    return newMax <= cap && newSum < st.s.sum - 1e-12 * std::max(1.0, st.s.sum);
  }

  // Moves the run of `len` ranks at positions s.. (cyclic) to between t[q] and t[q+1].
  bool orOpt(State& st, double cap, int& movesLeft) const {
    bool any = false;
    const std::size_t n = n_;
    for (std::size_t len = 1; len <= 3 && len + 2 <= n; ++len) {
      for (std::size_t s = 0; s < n && movesLeft > 0; ++s) {
        const std::size_t before = (s + n - 1) % n, last = (s + len - 1) % n;
        const int prev = st.t[before], first = st.t[s], lastRank = st.t[last], next = st.t[(s + len) % n];
        // No accepted move may add a hop above this (the incumbent's bottleneck, or the cap).
        const double limit = cap < 0 ? st.s.max : cap;
        const double joined = c(prev, next);
        if (joined > limit) continue;
        const double base = st.s.sum - st.e[before] - st.e[last] + joined;
        // Hops after the run up to the one into it: every place the run can go other than its own.
        std::size_t q = (s + len) % n;
        for (std::size_t step = len; step + 1 < n; ++step, q = q + 1 == n ? 0 : q + 1) {
          const int a = st.t[q], b = st.t[q + 1 == n ? 0 : q + 1];
          const double in1 = c(a, first), in2 = c(lastRank, b);
          if (in1 > limit || in2 > limit) continue;
          const double newSum = base - st.e[q] + in1 + in2;
          double rest = 0;
          for (int pos : st.top) {
            if (pos < 0) break;
            const std::size_t up = idx(pos);
            if (up != before && up != last && up != q) {
              rest = st.e[up];
              break;
            }
          }
          const double newMax = std::max({rest, joined, in1, in2});
          if (!accept(st, newMax, newSum, cap)) continue;
          std::vector<int> run, others;
          for (std::size_t k = 0; k < len; ++k) run.push_back(st.t[(s + k) % n]);
          for (std::size_t k = 0; k < n - len; ++k) others.push_back(st.t[(s + len + k) % n]);
          const auto at = std::find(others.begin(), others.end(), a) + 1;
          others.insert(at, run.begin(), run.end());
          st.t = std::move(others);
          rebuild(st);
          any = true;
          --movesLeft;
          break;  // positions moved: carry on from the next start
        }
      }
    }
    return any;
  }

  // Reverses t[a..b] (1 <= a < b <= n-1; t[0] stays put), which turns around every hop inside.
  bool twoOpt(State& st, double cap, int& movesLeft) const {
    bool any = false;
    const std::size_t n = n_;
    for (std::size_t a = 1; a + 1 < n && movesLeft > 0; ++a) {
      const double limit = cap < 0 ? st.s.max : cap;  // as in orOpt
      double revSum = 0, revMax = 0, fwdSum = 0;
      for (std::size_t b = a + 1; b < n; ++b) {
        const double rev = c(st.t[b], st.t[b - 1]);
        revSum += rev;
        revMax = std::max(revMax, rev);
        fwdSum += st.e[b - 1];
        if (revMax > limit) break;  // only grows with b
        const double in1 = c(st.t[a - 1], st.t[b]), in2 = c(st.t[a], st.t[b + 1 < n ? b + 1 : 0]);
        if (in1 > limit || in2 > limit) continue;
        const double newSum = st.s.sum - st.e[a - 1] - st.e[b] - fwdSum + revSum + in1 + in2;
        // Hops a-1..b change; the rest keep their cost.
        const double outside = std::max(a >= 2 ? st.prefMax[a - 2] : 0.0, b + 1 < n ? st.sufMax[b + 1] : 0.0);
        const double newMax = std::max({outside, revMax, in1, in2});
        if (!accept(st, newMax, newSum, cap)) continue;
        std::reverse(st.t.begin() + static_cast<std::ptrdiff_t>(a), st.t.begin() + static_cast<std::ptrdiff_t>(b) + 1);
        rebuild(st);
        any = true;
        --movesLeft;
        break;  // the sums above are stale: carry on from the next a
      }
    }
    return any;
  }

  std::size_t n_;
  std::vector<double> cost_;
};

// How many search steps one threshold probe of lowerBottleneck may take, per rank.
constexpr int kProbeStepsPerRank = 16;

// A Hamiltonian cycle through the allowed hops (allowed[i * n + j]): depth-first from rank 0,
// trying first the successor with the fewest ways on (Warnsdorff's rule; ties: the cheaper hop,
// then the lower rank), and backing off as soon as an unvisited rank is left with no way in or
// no way on. Gives up after `budget` steps, so a "no" may be wrong; deterministic.
class CycleSearch {
 public:
  CycleSearch(std::size_t n, const std::vector<char>& allowed, const std::vector<double>& cost, int budget)
      : n_(n),
        allowed_(allowed),
        allowedIn_(n * n),
        cost_(cost),
        budget_(budget),
        visited_(n, 0),
        onward_(n, 0),
        inward_(n, 0),
        nextAt_(n) {
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        allowedIn_[j * n + i] = allowed[i * n + j];
        onward_[i] += allowed[i * n + j];
        inward_[j] += allowed[i * n + j];
      }
    }
  }

  // The cycle (starting at rank 0), or empty.
  std::vector<int> run() {
    visit(0);
    path_.push_back(0);
    if (extend()) return path_;
    return {};
  }

 private:
  bool ok(std::size_t i, std::size_t j) const { return allowed_[i * n_ + j] != 0; }

  void visit(std::size_t v) {
    visited_[v] = 1;
    const char* in = &allowedIn_[v * n_];
    const char* out = &allowed_[v * n_];
    for (std::size_t u = 0; u < n_; ++u) {
      onward_[u] -= in[u];
      inward_[u] -= out[u];
    }
  }
  void unvisit(std::size_t v) {
    visited_[v] = 0;
    const char* in = &allowedIn_[v * n_];
    const char* out = &allowed_[v * n_];
    for (std::size_t u = 0; u < n_; ++u) {
      onward_[u] += in[u];
      inward_[u] += out[u];
    }
  }

  // Whether the path ending at `end` can still be completed as far as degrees tell.
  bool viable(std::size_t end) const {
    if (path_.size() < n_ && onward_[end] == 0) return false;
    for (std::size_t u = 0; u < n_; ++u) {
      if (visited_[u] != 0) continue;
      if (inward_[u] == 0 && !ok(end, u)) return false;
      if (onward_[u] == 0 && !ok(u, 0)) return false;
    }
    return true;
  }

  bool extend() {
    const std::size_t v = idx(path_.back());
    if (path_.size() == n_) return ok(v, 0);
    if (--budget_ < 0) return false;
    std::vector<std::size_t>& next = nextAt_[path_.size() - 1];  // reused across the search
    next.clear();
    for (std::size_t u = 0; u < n_; ++u) {
      if (visited_[u] == 0 && ok(v, u)) next.push_back(u);
    }
    std::sort(next.begin(), next.end(), [&](std::size_t x, std::size_t y) {
      if (onward_[x] != onward_[y]) return onward_[x] < onward_[y];
      if (cost_[v * n_ + x] != cost_[v * n_ + y]) return cost_[v * n_ + x] < cost_[v * n_ + y];
      return x < y;
    });
    for (std::size_t u : next) {
      visit(u);
      path_.push_back(static_cast<int>(u));
      if (viable(u) && extend()) return true;
      path_.pop_back();
      unvisit(u);
      if (budget_ < 0) return false;
    }
    return false;
  }

  std::size_t n_;
  const std::vector<char>& allowed_;
  std::vector<char> allowedIn_;  // transposed: allowedIn_[j * n + i] = allowed hop i -> j
  const std::vector<double>& cost_;
  int budget_;
  std::vector<char> visited_;
  std::vector<int> onward_;  // allowed hops from a rank to unvisited ranks
  std::vector<int> inward_;  // allowed hops into a rank from unvisited ranks
  std::vector<int> path_;
  std::vector<std::vector<std::size_t>> nextAt_;  // per depth: the successors to try
};

// Whether every rank reaches every other over the allowed hops: a cycle through all needs it,
// and it fails fast on the thresholds that cut a region off, where the search would wander.
bool stronglyConnected(std::size_t n, const std::vector<char>& allowed) {
  for (const bool forward : {true, false}) {
    std::vector<char> seen(n, 0);
    std::vector<std::size_t> stack{0};
    seen[0] = 1;
    std::size_t reached = 1;
    while (!stack.empty()) {
      const std::size_t v = stack.back();
      stack.pop_back();
      for (std::size_t u = 0; u < n; ++u) {
        if (seen[u] == 0 && allowed[forward ? v * n + u : u * n + v] != 0) {
          seen[u] = 1;
          ++reached;
          stack.push_back(u);
        }
      }
    }
    if (reached != n) return false;
  }
  return true;
}

// Lowers the bottleneck of `best` below what the local search reached: the ring moves stall
// where taking out the slowest hop needs several moves at once. The smallest bottleneck is the
// smallest threshold tau whose hops (cost <= tau) still hold a cycle through every rank, so
// bisect tau between a lower bound and the current bottleneck, asking CycleSearch at each (a
// "no" from it may be wrong: it has a budget). The ring found is left for phase 2 to shorten.
std::vector<int> lowerBottleneck(std::size_t n, const std::vector<double>& cost, std::vector<int> best) {
  auto maxHop = [&](const std::vector<int>& t) {
    double m = 0;
    for (std::size_t k = 0; k < n; ++k) m = std::max(m, cost[idx(t[k]) * n + idx(t[(k + 1) % n])]);
    return m;
  };
  double bottleneck = maxHop(best);
  // No ring beats the cheapest way out of, and into, every rank.
  double lowerBound = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double out = kInf, in = kInf;
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      out = std::min(out, cost[i * n + j]);
      in = std::min(in, cost[j * n + i]);
    }
    lowerBound = std::max({lowerBound, out, in});
  }
  // Thresholds only need the tolerance's resolution: bisect geometrically until the known
  // infeasible (or lower-bound) threshold and the best bottleneck are within it.
  double infeasible = lowerBound;
  std::vector<char> allowed(n * n);
  while (bottleneck > infeasible * (1.0 + kRingBottleneckTolerance)) {
    const double tau = infeasible > 0 ? std::sqrt(infeasible * bottleneck) : bottleneck / 2;
    for (std::size_t k = 0; k < n * n; ++k) allowed[k] = k / n != k % n && cost[k] <= tau ? 1 : 0;
    std::vector<int> cycle;
    if (stronglyConnected(n, allowed)) {
      cycle = CycleSearch(n, allowed, cost, kProbeStepsPerRank * static_cast<int>(n)).run();
    }
    if (cycle.empty()) {
      infeasible = tau;
    } else {
      best = std::move(cycle);
      bottleneck = maxHop(best);
    }
  }
  return best;
}

// ---- Candidates ----------------------------------------------------------------------------

// The links among `members` as a view of its own (rank k of it is members[k]).
NetworkView subView(const NetworkView& v, const std::vector<int>& members) {
  NetworkView sub;
  sub.ranks = static_cast<int>(members.size());
  sub.regionOf.assign(members.size(), 0);
  sub.links.resize(members.size() * members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    for (std::size_t j = 0; j < members.size(); ++j) sub.links[i * members.size() + j] = v.link(members[i], members[j]);
  }
  return sub;
}

// Regions as groups of equal size >= 2, each ordered as its ring for B/g chunks, the region ring
// for the cross step, and each group rotated to line up good cross-region pairs; nullopt when
// the regions do not split evenly.
std::optional<Plan> hierarchicalPlan(const NetworkView& v, std::size_t bytes) {
  std::vector<std::vector<int>> groups(idx(v.regions));
  for (int r = 0; r < v.ranks; ++r) groups[idx(v.regionOf[idx(r)])].push_back(r);
  std::erase_if(groups, [](const std::vector<int>& g) { return g.empty(); });
  if (groups.size() < 2) return std::nullopt;
  const std::size_t g = groups.front().size();
  if (g < 2 || std::any_of(groups.begin(), groups.end(), [&](const auto& grp) { return grp.size() != g; })) {
    return std::nullopt;
  }
  const std::size_t regions = groups.size();
  for (auto& grp : groups) {
    std::vector<int> ring = chooseRingOrder(subView(v, grp), bytes / g);
    std::vector<int> mapped;
    for (int k : ring) mapped.push_back(grp[idx(k)]);
    grp = std::move(mapped);
  }
  // The region ring on the worst link of each region pair over the local indices: the step
  // waits for the slowest of the g rings anyway.
  NetworkView rv;
  rv.ranks = static_cast<int>(regions);
  rv.regionOf.assign(regions, 0);
  rv.links.resize(regions * regions);
  for (std::size_t a = 0; a < regions; ++a) {
    for (std::size_t b = 0; b < regions; ++b) {
      if (a == b) continue;
      LinkCost worst{0, kInf};
      for (std::size_t i = 0; i < g; ++i) {
        const LinkCost& l = v.link(groups[a][i], groups[b][i]);
        worst.latencySec = std::max(worst.latencySec, l.latencySec);
        worst.bytesPerSec = std::min(worst.bytesPerSec, l.bytesPerSec);
      }
      rv.links[a * regions + b] = worst;
    }
  }
  Plan plan;
  plan.algorithm = Algorithm::kHierarchical;
  plan.crossOrder = chooseRingOrder(rv, bytes / (g * regions));
  // Rotating a group keeps its ring but changes which of its ranks meet which across regions;
  // one greedy pass per group (the first stays fixed, only relative rotation matters).
  const double b = static_cast<double>(bytes);
  double best = hierarchicalSec(v, groups, plan.crossOrder, b);
  for (std::size_t k = 1; k < regions; ++k) {
    std::vector<int> bestGroup = groups[k];
    for (std::size_t rot = 1; rot < g; ++rot) {
      std::rotate(groups[k].begin(), groups[k].begin() + 1, groups[k].end());
      const double t = hierarchicalSec(v, groups, plan.crossOrder, b);
      if (t < best) {
        best = t;
        bestGroup = groups[k];
      }
    }
    groups[k] = std::move(bestGroup);
  }
  plan.groups = std::move(groups);
  return plan;
}

// Hubs far better connected than the rest (see kHubAdvantage). Without that, the
// parameter-server formula would flatter any hub: it charges the hub's n-1 concurrent flows
// as if its NIC were not shared, which only the hub's exceptional links make believable.
std::vector<int> eligibleHubs(const NetworkView& v) {
  std::vector<int> hubs;
  if (v.ranks < 3) return hubs;
  const std::size_t n = idx(v.ranks);
  std::vector<double> all;
  all.reserve(n * (n - 1));
  for (int i = 0; i < v.ranks; ++i) {
    for (int j = 0; j < v.ranks; ++j) {
      if (i != j) all.push_back(v.link(i, j).bytesPerSec);
    }
  }
  // The k-th smallest of a subset is never below the k-th smallest of the whole set, so this
  // bounds every hub's "median of the others" from below and rules most hubs out in O(n).
  const std::size_t k = (n - 1) * (n - 2) / 2;
  std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end());
  const double medianFloor = all[k];
  std::vector<double> others;
  for (int h = 0; h < v.ranks; ++h) {
    double hubRate = kInf;
    for (int j = 0; j < v.ranks; ++j) {
      if (j != h) hubRate = std::min({hubRate, v.link(h, j).bytesPerSec, v.link(j, h).bytesPerSec});
    }
    if (!(hubRate > 0) || hubRate < kHubAdvantage * medianFloor) continue;
    others.clear();
    for (int i = 0; i < v.ranks; ++i) {
      for (int j = 0; j < v.ranks; ++j) {
        if (i != j && i != h && j != h) others.push_back(v.link(i, j).bytesPerSec);
      }
    }
    const auto mid = others.begin() + static_cast<std::ptrdiff_t>(others.size() / 2);
    std::nth_element(others.begin(), mid, others.end());
    if (hubRate >= kHubAdvantage * *mid) hubs.push_back(h);
  }
  return hubs;
}

// The root with the cheapest tree on `order` (ties: lower rank).
std::pair<int, double> bestTreeRoot(const NetworkView& v, const std::vector<int>& order, double bytes) {
  std::pair<int, double> best{0, kInf};
  for (int r = 0; r < v.ranks; ++r) {
    const double t = treeSec(v, order, r, bytes);
    if (t < best.second) best = {r, t};
  }
  return best;
}

}  // namespace

const LinkCost& NetworkView::link(int src, int dst) const {
  return links[idx(src) * idx(ranks) + idx(dst)];
}

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kHalvingDoubling: return "halving-doubling";
    case Algorithm::kTree: return "tree";
    case Algorithm::kHierarchical: return "hierarchical";
    case Algorithm::kParameterServer: return "parameter-server";
  }
  return "unknown";
}

RelayOffer bestRelay(const NetworkView& view, int a, int b, double bytes, double legShare) {
  RelayOffer best;
  best.directSec = std::max(linkSec(view, a, b, bytes), linkSec(view, b, a, bytes));
  best.relaySec = kInf;
  auto viaSec = [&](int from, int c, int to) {
    const LinkCost& x = view.link(from, c);
    const LinkCost& y = view.link(c, to);
    const double rate = legShare * std::min(x.bytesPerSec, y.bytesPerSec);
    return rate > 0 ? x.latencySec + y.latencySec + bytes / rate : kInf;
  };
  const int ra = view.regionOf[idx(a)], rb = view.regionOf[idx(b)];
  for (int c = 0; c < view.ranks; ++c) {
    if (c == a || c == b) continue;
    // Between two regions, a rank in either of them relays over the same region pair, which
    // in practice is the same WAN link: only a third region helps.
    const int rc = view.regionOf[idx(c)];
    if (ra != rb && (rc == ra || rc == rb)) continue;
    const double sec = std::max(viaSec(a, c, b), viaSec(b, c, a));
    if (sec < best.relaySec) {
      best.relaySec = sec;
      best.via = c;
    }
  }
  if (!(best.relaySec < best.directSec)) best.via = -1;
  return best;
}

double predictSeconds(const NetworkView& view, const Plan& plan, std::size_t bytes) {
  const int n = view.ranks;
  const double b = static_cast<double>(bytes);
  switch (plan.algorithm) {
    case Algorithm::kRing:
      return ringSec(view, orderOrIdentity(plan.ringOrder, n, "ring order"), b);
    case Algorithm::kHalvingDoubling:
      return halvingDoublingSec(view, orderOrIdentity(plan.ringOrder, n, "halving-doubling numbering"), b);
    case Algorithm::kTree:
      MERIDIAN_CHECK_MSG(plan.root >= 0 && plan.root < n, "tree root {} outside 0..{}", plan.root, n - 1);
      return treeSec(view, orderOrIdentity(plan.ringOrder, n, "tree numbering"), plan.root, b);
    case Algorithm::kHierarchical: {
      const std::vector<int> cross = checkedCrossOrder(view, plan);
      return hierarchicalSec(view, plan.groups, cross, b);
    }
    case Algorithm::kParameterServer:
      MERIDIAN_CHECK_MSG(plan.root >= 0 && plan.root < n, "hub {} outside 0..{}", plan.root, n - 1);
      return parameterServerSec(view, plan.root, b);
  }
  return kInf;
}

std::vector<int> chooseRingOrder(const NetworkView& view, std::size_t chunkBytes) {
  const int n = view.ranks;
  if (n <= 2) return identityOrder(n);
  const std::size_t un = idx(n);
  std::vector<double> cost(un * un, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double t = i == j ? 0.0 : linkSec(view, i, j, static_cast<double>(chunkBytes));
      cost[idx(i) * un + idx(j)] = std::isfinite(t) ? std::min(t, kUnusableSec) : kUnusableSec;
    }
  }
  const RingSearch search(un, cost);
  std::vector<std::vector<int>> seeds{identityOrder(n)};
  for (int s = 0; s < n; ++s) seeds.push_back(search.nearestNeighbour(s));
  std::vector<Score> scores;
  for (const auto& t : seeds) scores.push_back(search.score(t));

  // Phase 1: the lowest bottleneck (then total) from the best seed.
  std::size_t bestSeed = 0;
  for (std::size_t k = 1; k < seeds.size(); ++k) {
    if (lexBetter(scores[k], scores[bestSeed])) bestSeed = k;
  }
  std::vector<int> best = seeds[bestSeed];
  search.improve(best, -1);
  // Phase 1b: below where the moves stall.
  best = lowerBottleneck(un, cost, std::move(best));
  const double cap = search.score(best).max * (1.0 + kRingBottleneckTolerance);

  // Phase 2: the lowest total within the bottleneck tolerance, from the phase-1 ring and from
  // the cheapest seed already inside the cap (often a ring with fewer slow hops).
  std::optional<std::size_t> cheapSeed;
  for (std::size_t k = 0; k < seeds.size(); ++k) {
    if (scores[k].max <= cap && (!cheapSeed || scores[k].sum < scores[*cheapSeed].sum)) cheapSeed = k;
  }
  search.improve(best, cap);
  if (cheapSeed) {
    std::vector<int> alt = seeds[*cheapSeed];
    search.improve(alt, cap);
    if (search.score(alt).sum < search.score(best).sum) best = std::move(alt);
  }
  // A canonical rotation (rank 0 first) for readable logs; a ring's cost does not depend on it.
  std::rotate(best.begin(), std::find(best.begin(), best.end(), 0), best.end());
  return best;
}

namespace {

// choosePlan given what does not depend on the size (computed once per view by planAll).
Plan planFor(const NetworkView& view, const std::vector<int>& hubs, std::size_t bytes) {
  const int n = view.ranks;
  if (n <= 1) {
    Plan p;
    p.ringOrder = identityOrder(n);
    p.reason = "one rank: nothing to exchange";
    return p;
  }
  const double b = static_cast<double>(bytes);
  const std::vector<int> ring = chooseRingOrder(view, bytes / idx(n));
  std::vector<Plan> cands;
  // Each candidate's reason holds its detail until the winner's line is written.
  auto add = [&](Plan p, std::string detail) {
    p.predictedSec = predictSeconds(view, p, bytes);
    p.reason = std::move(detail);
    cands.push_back(std::move(p));
  };

  Plan ringPlan;
  ringPlan.ringOrder = ring;
  const Hop slowest = ringBottleneck(view, ring, b / static_cast<double>(n));
  add(ringPlan, fmt::format("slowest hop {}->{}", slowest.src, slowest.dst));
  // Numberings for halving-doubling and the tree (empty = rank order): partners at distance
  // 1 (the fold, the first doubling round, the tree's leaves) should be near each other. The ring
  // order tends to do that; region-major order does it for sure when there are regions, which
  // matters for small messages, whose ring order follows latency rather than regions.
  std::vector<std::pair<std::vector<int>, const char*>> numberings{{{}, "rank order"}, {ring, "ring order"}};
  if (view.regions > 1) {
    std::vector<int> regionMajor = identityOrder(n);
    std::stable_sort(regionMajor.begin(), regionMajor.end(),
                     [&](int x, int y) { return view.regionOf[idx(x)] < view.regionOf[idx(y)]; });
    if (regionMajor != ring) numberings.emplace_back(std::move(regionMajor), "region-major order");
  }
  for (const auto& [order, label] : numberings) {
    Plan p;
    p.algorithm = Algorithm::kHalvingDoubling;
    p.ringOrder = order;
    add(p, label);
  }
  for (const auto& [order, label] : numberings) {
    Plan p;
    p.algorithm = Algorithm::kTree;
    p.ringOrder = order;
    p.root = bestTreeRoot(view, order.empty() ? identityOrder(n) : order, b).first;
    add(p, fmt::format("root {}, {}", p.root, label));
  }
  if (std::optional<Plan> h = hierarchicalPlan(view, bytes)) {
    std::string detail = fmt::format("{} regions x {}", h->groups.size(), h->groups.front().size());
    add(std::move(*h), std::move(detail));
  }
  for (int hub : hubs) {
    Plan p;
    p.algorithm = Algorithm::kParameterServer;
    p.root = hub;
    add(p, fmt::format("hub {}", hub));
  }

  std::size_t best = 0;
  for (std::size_t k = 1; k < cands.size(); ++k) {
    if (cands[k].predictedSec < cands[best].predictedSec) best = k;
  }
  // The runner-up of another algorithm, so the log line says what the choice was against.
  std::optional<std::size_t> second;
  for (std::size_t k = 0; k < cands.size(); ++k) {
    if (cands[k].algorithm == cands[best].algorithm) continue;
    if (!second || cands[k].predictedSec < cands[*second].predictedSec) second = k;
  }
  Plan plan = std::move(cands[best]);
  plan.reason = fmt::format("{} ({}) predicted {} for {} bytes", algorithmName(plan.algorithm), plan.reason,
                            fmtSec(plan.predictedSec), bytes);
  if (second) {
    plan.reason += fmt::format("; next best {} {}", algorithmName(cands[*second].algorithm),
                               fmtSec(cands[*second].predictedSec));
  }
  if (!std::isfinite(plan.predictedSec)) plan.reason += "; every candidate crosses an unusable link";
  return plan;
}

}  // namespace

Plan choosePlan(const NetworkView& view, std::size_t bytes) { return planFor(view, eligibleHubs(view), bytes); }

const Plan& PlanTable::forBytes(std::size_t bytes) const {
  MERIDIAN_CHECK_MSG(!plans.empty() && plans.size() == classBytes.size(), "plan table with {} classes, {} plans",
                     classBytes.size(), plans.size());
  const auto it = std::lower_bound(classBytes.begin(), classBytes.end(), bytes);
  if (it == classBytes.end()) return plans.back();
  return plans[static_cast<std::size_t>(it - classBytes.begin())];
}

PlanTable planAll(const NetworkView& view) {
  PlanTable table;
  const std::vector<int> hubs = eligibleHubs(view);
  for (std::size_t b = kMinClassBytes; b <= kMaxClassBytes; b <<= 1) {
    table.classBytes.push_back(b);
    table.plans.push_back(planFor(view, hubs, b));
  }
  return table;
}

Status validatePlan(const Plan& plan, int ranks) {
  if (ranks < 1) return invalidArgument("plan for {} ranks", ranks);
  auto orderOk = [&](const std::vector<int>& order, int n, const char* what) -> Status {
    if (order.empty() || isPermutation(order, n)) return Status::ok();
    return invalidArgument("plan: {} of {} entries is not a permutation of 0..{}", what, order.size(), n - 1);
  };
  switch (plan.algorithm) {
    case Algorithm::kRing:
    case Algorithm::kHalvingDoubling:
      return orderOk(plan.ringOrder, ranks, "rank order");
    case Algorithm::kTree:
    case Algorithm::kParameterServer:
      if (plan.root < 0 || plan.root >= ranks) return invalidArgument("plan: root {} outside 0..{}", plan.root, ranks - 1);
      return orderOk(plan.ringOrder, ranks, "rank order");
    case Algorithm::kHierarchical: {
      if (plan.groups.size() < 2) return invalidArgument("plan: hierarchical with {} groups (want >= 2)", plan.groups.size());
      const std::size_t g = plan.groups.front().size();
      std::vector<int> all;
      for (const auto& grp : plan.groups) {
        if (grp.empty() || grp.size() != g) return invalidArgument("plan: hierarchical groups must be non-empty and equal");
        all.insert(all.end(), grp.begin(), grp.end());
      }
      if (!isPermutation(all, ranks)) return invalidArgument("plan: hierarchical groups must hold each of {} ranks once", ranks);
      return orderOk(plan.crossOrder, static_cast<int>(plan.groups.size()), "cross order");
    }
  }
  return invalidArgument("plan: unknown algorithm {}", static_cast<int>(plan.algorithm));
}

Plan randomPlan(const NetworkView& view, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int n = view.ranks;
  auto shuffled = [&](int count) {
    std::vector<int> o = identityOrder(count);
    std::shuffle(o.begin(), o.end(), rng);
    return o;
  };
  std::vector<Algorithm> choices{Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                                 Algorithm::kParameterServer};
  std::optional<Plan> hier = hierarchicalPlan(view, std::size_t{1} << 20);  // only its groups are used
  if (hier) choices.push_back(Algorithm::kHierarchical);
  Plan plan;
  plan.algorithm = choices[std::uniform_int_distribution<std::size_t>(0, choices.size() - 1)(rng)];
  plan.reason = fmt::format("random {} (seed {})", algorithmName(plan.algorithm), seed);
  if (plan.algorithm == Algorithm::kHierarchical) {
    plan.groups = std::move(hier->groups);
    for (auto& grp : plan.groups) std::shuffle(grp.begin(), grp.end(), rng);
    plan.crossOrder = shuffled(static_cast<int>(plan.groups.size()));
  } else {
    plan.ringOrder = shuffled(n);
    plan.root = std::uniform_int_distribution<int>(0, n - 1)(rng);
  }
  return plan;
}

Status validate(const NetworkView& view) {
  if (view.ranks < 1) return invalidArgument("network view: {} ranks (want >= 1)", view.ranks);
  if (view.regions < 1) return invalidArgument("network view: {} regions (want >= 1)", view.regions);
  if (!std::isfinite(view.reduceBytesPerSec) || view.reduceBytesPerSec < 0) {
    return invalidArgument("network view: reduce rate {} bytes/s", view.reduceBytesPerSec);
  }
  const std::size_t n = idx(view.ranks);
  if (view.links.size() != n * n) {
    return invalidArgument("network view: {} links for {} ranks (want {})", view.links.size(), n, n * n);
  }
  if (view.regionOf.size() != n) {
    return invalidArgument("network view: regionOf has {} entries for {} ranks", view.regionOf.size(), n);
  }
  for (std::size_t r = 0; r < n; ++r) {
    if (view.regionOf[r] < 0 || view.regionOf[r] >= view.regions) {
      return invalidArgument("network view: rank {} in region {}, outside 0..{}", r, view.regionOf[r],
                             view.regions - 1);
    }
  }
  for (int s = 0; s < view.ranks; ++s) {
    for (int d = 0; d < view.ranks; ++d) {
      if (s == d) continue;
      const LinkCost& l = view.link(s, d);
      if (!std::isfinite(l.latencySec) || l.latencySec < 0) {
        return invalidArgument("network view: link {}->{} has latency {}", s, d, l.latencySec);
      }
      if (!std::isfinite(l.bytesPerSec) || l.bytesPerSec < 0) {
        return invalidArgument("network view: link {}->{} has rate {}", s, d, l.bytesPerSec);
      }
    }
  }
  return Status::ok();
}

}  // namespace meridian::routing
