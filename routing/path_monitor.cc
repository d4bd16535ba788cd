#include "routing/path_monitor.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/metrics.h"

namespace meridian::routing {

namespace {
constexpr std::size_t kMaxEvents = 1000;
}  // namespace

std::vector<double> weightsFor(const std::vector<CongestionState>& states, const std::vector<bool>& down,
                               bool unjudgedUp) {
  std::vector<double> w(states.size(), 1.0);
  auto isDown = [&](std::size_t i) { return i < down.size() && down[i]; };
  bool anyUp = unjudgedUp, anyClear = false;
  for (std::size_t i = 0; i < states.size(); ++i) {
    anyUp = anyUp || !isDown(i);
    anyClear = anyClear || (!isDown(i) && states[i] == CongestionState::kClear);
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    if (isDown(i) && anyUp) {
      w[i] = kDownPathWeight;
    } else if (!anyClear && unjudgedUp) {
      // Nothing judged is clear, and paths probes do not reach are up beside it: a congested
      // verdict (often the queue this channel's own data builds) says nothing about them, so
      // the channel's measured rates choose.
      w[i] = 1.0;
    } else if (states[i] == CongestionState::kCongested || !anyClear) {
      // With every path congested, all keep the congested weight: equal weights move nothing,
      // and a path that is still congested must not look raised (a raised weight lifts the
      // path's rate estimate towards the best path's, which is for paths that recovered).
      w[i] = kCongestedPathWeight;
    }
  }
  return w;
}

struct PathMonitor::Impl {
  struct Tracked {
    CongestionDetector detector;
    std::uint64_t bytesSent = 0;  // the channel's count for the path at the last round
    std::int64_t readAtUs = 0;    // when that count was read (0: never)
    double judgedBytesPerSec = 0;  // the last busy round's rate (PathView)
    bool down = false;             // kDownAfterLostProbes unanswered in a row, until kUpAfterEchoes echoes
    Gauge* congested = nullptr;
    Gauge* weight = nullptr;
  };
  std::unique_ptr<Prober> prober;
  std::shared_ptr<const TimeSource> clock;  // null: the steady clock
  std::string proberName;  // labels this monitor's series apart from other communicators'
  bool adaptive = true;
  ApplyWeights apply;
  ReadPaths readPaths;
  CongestionConfig config;
  std::chrono::milliseconds interval{100};
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::map<std::pair<int, int>, Tracked> tracked;
  std::map<int, std::vector<double>> applied;  // peer -> weights last handed out
  std::deque<PathEvent> events;
  Counter* transitions = nullptr;
  std::thread thread;

  void tick() {
    const std::int64_t now = clock ? clock->nowUs() : nowUs();
    std::map<int, std::vector<CongestionState>> states;
    std::map<int, std::vector<bool>> down;
    std::vector<std::pair<int, std::vector<double>>> changed;
    const std::vector<ProbeRow> rows = prober->snapshot();
    std::map<int, std::vector<transport::PathStats>> channelPaths;  // read outside the lock: the channel takes its own
    if (readPaths) {
      for (const auto& row : rows) {
        if (!channelPaths.contains(row.peer)) channelPaths[row.peer] = readPaths(row.peer);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& row : rows) {
        auto [it, fresh] = tracked.try_emplace({row.peer, row.path}, Tracked{CongestionDetector(config)});
        Tracked& t = it->second;
        if (fresh) {
          MetricLabels labels{{"peer", std::to_string(row.peer)}, {"path", std::to_string(row.path)},
                              {"prober", proberName}};
          t.congested = &MetricsRegistry::global().gauge("meridian_routing_path_congested",
                                                         "1 while a path is judged congested", labels);
          t.weight = &MetricsRegistry::global().gauge("meridian_routing_path_weight",
                                                      "Multipath weight routing gives a path (1 = neutral)", labels);
          t.weight->set(1);
        }
        double rate = 0;
        const auto& cp = channelPaths[row.peer];
        if (row.path >= 0 && static_cast<std::size_t>(row.path) < cp.size()) {
          const transport::PathStats& ps = cp[static_cast<std::size_t>(row.path)];
          if (t.readAtUs > 0) rate = busyDeliveryRate(ps, t.bytesSent, now - t.readAtUs);
          if (rate > 0) t.judgedBytesPerSec = rate;
          t.bytesSent = ps.bytesSent;
          t.readAtUs = now;
        }
        if (row.figures.sent > 0 && t.detector.update(CongestionSample{now, row.figures, rate})) {
          const bool congested = t.detector.state() == CongestionState::kCongested;
          t.congested->set(congested ? 1 : 0);
          transitions->add();
          MLOG_INFO(kRouting, "path {} to rank {} is {}: {}", row.path, row.peer, congested ? "congested" : "clear again",
                    t.detector.reason());
          events.push_back({now, row.peer, row.path, t.detector.state(), t.detector.reason()});
          if (events.size() > kMaxEvents) events.pop_front();
        }
        if (!t.down && row.figures.lostInARow >= kDownAfterLostProbes) {
          t.down = true;
          MLOG_INFO(kRouting, "path {} to rank {} is down: the last {} probes went unanswered", row.path, row.peer,
                    row.figures.lostInARow);
        } else if (t.down && row.figures.echoedInARow >= kUpAfterEchoes) {
          t.down = false;
          MLOG_INFO(kRouting, "path {} to rank {} is up again", row.path, row.peer);
        }
        const auto index = static_cast<std::size_t>(row.path);
        auto& s = states[row.peer];
        auto& d = down[row.peer];
        if (s.size() <= index) s.resize(index + 1);
        if (d.size() <= index) d.resize(index + 1);
        s[index] = t.detector.state();
        d[index] = t.down;
      }
      if (!adaptive) return;
      for (const auto& [peer, s] : states) {
        // Fabric and shared-memory paths are paths probes do not reach (docs/routing.md).
        bool unjudgedUp = false;
        if (auto cp = channelPaths.find(peer); cp != channelPaths.end()) {
          for (const transport::PathStats& ps : cp->second) {
            unjudgedUp = unjudgedUp || (ps.alive && !transport::probesReach(ps.kind));
          }
        }
        std::vector<double> w = weightsFor(s, down[peer], unjudgedUp);
        auto& last = applied[peer];
        if (last == w) continue;
        last = w;
        for (std::size_t p = 0; p < w.size(); ++p) tracked[{peer, static_cast<int>(p)}].weight->set(w[p]);
        changed.emplace_back(peer, std::move(w));
      }
    }
    for (const auto& [peer, w] : changed) apply(peer, w);  // outside the lock: the callee may take its own
  }

  void run() {
    // Nothing leaves this thread: a broken invariant stops re-weighting (the paths keep
    // their last weights), not the process.
    try {
      loop();
    } catch (const std::exception& e) {
      MLOG_ERROR(kRouting, "{}: path monitor stopped: {}", proberName, e.what());
    }
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, interval);
      if (stop) break;
      lock.unlock();
      tick();
      lock.lock();
    }
  }
};

PathMonitor::PathMonitor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<PathMonitor>> PathMonitor::create(ProberOptions probe, bool adaptive, ApplyWeights apply,
                                                         ReadPaths readPaths, CongestionConfig congestion) {
  auto impl = std::make_unique<Impl>();
  impl->interval = probe.interval;
  impl->proberName = probe.name;
  impl->clock = probe.clock;
  const bool startThread = probe.startThread;
  MERIDIAN_ASSIGN_OR_RETURN(impl->prober, Prober::create(std::move(probe)));
  impl->adaptive = adaptive;
  impl->apply = apply ? std::move(apply) : [](int, const std::vector<double>&) {};
  impl->readPaths = std::move(readPaths);
  impl->config = congestion;
  impl->transitions = &MetricsRegistry::global().counter("meridian_routing_congestion_changes_total",
                                                         "Times a path became congested or clear again");
  Impl* raw = impl.get();
  if (startThread) impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<PathMonitor>(new PathMonitor(std::move(impl)));
}

PathMonitor::~PathMonitor() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::vector<std::string> PathMonitor::endpoints() const { return impl_->prober->endpoints(); }

Status PathMonitor::setPeer(int rank, const std::vector<std::string>& endpoints) {
  return impl_->prober->setPeer(rank, endpoints);
}

bool PathMonitor::adaptive() const { return impl_->adaptive; }

void PathMonitor::tick() {
  MERIDIAN_CHECK(!impl_->thread.joinable());
  impl_->tick();
}

Prober& PathMonitor::prober() { return *impl_->prober; }

std::vector<PathView> PathMonitor::paths() const {
  auto rows = impl_->prober->snapshot();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<PathView> out;
  for (const auto& row : rows) {
    PathView v{row.peer, row.path, row.figures, CongestionState::kClear, {}, 1.0, false, 0};
    auto it = impl_->tracked.find({row.peer, row.path});
    if (it != impl_->tracked.end()) {
      v.state = it->second.detector.state();
      v.reason = it->second.detector.reason();
      v.judgedBytesPerSec = it->second.judgedBytesPerSec;
      v.down = it->second.down;
    }
    auto w = impl_->applied.find(row.peer);
    if (w != impl_->applied.end() && static_cast<std::size_t>(row.path) < w->second.size()) {
      v.weight = w->second[static_cast<std::size_t>(row.path)];
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<PathEvent> PathMonitor::events() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return {impl_->events.begin(), impl_->events.end()};
}

}  // namespace meridian::routing
