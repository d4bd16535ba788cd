// A timeline of collectives across a lab (label `lab`): meridian-bench's --interval rows
// (busbw and cross-region bytes per path, each second or so) while the test changes the lab
// at chosen points of the run, with the changes placed on the bench's own clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/lab_session.h"

namespace meridian::testing {

// One meridian-lab command (`set wan-a east west --rate 20Mbit`, `restore ...`,
// `cross-traffic ...`) started `atSec` after the bench is launched.
struct LabChange {
  double atSec = 0;
  std::string command;
};

struct Timeline {
  nlohmann::json rows;  // meridian-bench's "timeline": t_start, t, ops, busbw_gbps, cross_region_bytes, wrong
  // Per change, in the timeline's clock: when its command was started and when it returned
  // (a cross-traffic flow runs until its command returns; a rate cut lasts until restored).
  // 0 when the bench wrote no start time.
  std::vector<double> startSec, doneSec;
  std::string output;
  int code = -1;
  double changeAtSec() const;    // the first change's start
  double changeDoneSec() const;  // the last change's return
};

struct TimelineRun {
  std::string env;            // `env` assignments for every rank ("MERIDIAN_ALGO=ring ...")
  double seconds = 16;        // --duration
  std::vector<LabChange> changes;
  bool check = false;         // --check: every result verified, wrong elements counted per row
  std::string size = "16M";   // allreduce size, meridian-bench's syntax
  double interval = 1;        // --interval
  long long minOps = 0;       // --min-ops
};

// Runs meridian-bench's allreduce timeline on every node of the lab (exec-all), applying the
// changes on the way (each from its own thread, side by side).
Timeline runTimeline(LabSession& session, const TimelineRun& run);

// The share of a row's cross-region bytes that went over path `path` (0 when none moved).
double shareOfPath(const nlohmann::json& row, std::size_t path);

// The rows wholly inside [from, to] on the timeline's clock (t_start >= from, t <= to).
std::vector<nlohmann::json> rowsWithin(const nlohmann::json& rows, double from, double to);

// Median busbw of the rows wholly inside [from, to]; -1 when no row is.
double medianBusbw(const nlohmann::json& rows, double from, double to);

// Wrong elements over every row (meaningful with TimelineRun::check).
std::uint64_t wrongElements(const nlohmann::json& rows);

}  // namespace meridian::testing
