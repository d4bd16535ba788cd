#include "tests/common/lab_timeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

namespace meridian::testing {
namespace {

double wallNowSec() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

double Timeline::changeAtSec() const { return startSec.empty() ? 0 : *std::min_element(startSec.begin(), startSec.end()); }

double Timeline::changeDoneSec() const { return doneSec.empty() ? 0 : *std::max_element(doneSec.begin(), doneSec.end()); }

Timeline runTimeline(LabSession& session, const TimelineRun& run) {
  Timeline tl;
  const std::string out = ::testing::TempDir() + "/timeline.json";
  std::filesystem::remove(out);
  const std::size_t n = run.changes.size();
  std::vector<double> startedAt(n, 0), doneAt(n, 0);
  std::vector<std::thread> changers;
  for (std::size_t i = 0; i < n; ++i) {
    changers.emplace_back([&session, &run, &startedAt, &doneAt, i] {
      // The change is the experiment's input at a point of the run's own timeline (the rows
      // before and after it are what the tests compare), not a wait for the run to be ready.
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(run.changes[i].atSec * 1000)));
      startedAt[i] = wallNowSec();
      auto r = session.run(run.changes[i].command);
      doneAt[i] = wallNowSec();
      EXPECT_EQ(r.code, 0) << run.changes[i].command << ": " << r.output;
    });
  }
  auto r = session.run(fmt::format("exec-all -- env {} {} --ops all_reduce -b {} -e {} --duration {} --interval {} "
                                   "--min-ops {} --check {} --json {}",
                                   run.env, MERIDIAN_BENCH_BIN, run.size, run.size, run.seconds, run.interval,
                                   run.minOps, run.check ? 1 : 0, out));
  for (auto& t : changers) t.join();
  tl.code = r.code;
  tl.output = r.output;
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return tl;
  tl.rows = j["timeline"];
  // The bench's clock starts after the communicator is up; it says when on the wall clock,
  // which the lab's namespaces share with this process.
  const double start = j.value("start_unix_s", 0.0);
  if (start > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      tl.startSec.push_back(startedAt[i] - start);
      tl.doneSec.push_back(doneAt[i] - start);
    }
  }
  return tl;
}

double shareOfPath(const nlohmann::json& row, std::size_t path) {
  const auto& b = row["cross_region_bytes"];
  double all = 0;
  for (const auto& x : b) all += x.get<double>();
  return all > 0 && path < b.size() ? b[path].get<double>() / all : 0;
}

std::vector<nlohmann::json> rowsWithin(const nlohmann::json& rows, double from, double to) {
  std::vector<nlohmann::json> out;
  for (const auto& r : rows) {
    if (r["t_start"].get<double>() >= from && r["t"].get<double>() <= to) out.push_back(r);
  }
  return out;
}

double medianBusbw(const nlohmann::json& rows, double from, double to) {
  std::vector<double> v;
  for (const auto& r : rowsWithin(rows, from, to)) v.push_back(r["busbw_gbps"].get<double>());
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::uint64_t wrongElements(const nlohmann::json& rows) {
  std::uint64_t wrong = 0;
  for (const auto& r : rows) wrong += r["wrong"].get<std::uint64_t>();
  return wrong;
}

}  // namespace meridian::testing
