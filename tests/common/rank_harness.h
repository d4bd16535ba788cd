// RankHarness: N ranks as threads in one process, each with its own TcpStore client and a
// real TCP Communicator, meeting at a real StoreServer on 127.0.0.1 (port from the kernel).
// Rank code never asserts: it returns a failure description ("" = passed), exceptions are
// caught, and the main thread checks the collected results (see summarize()).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "bootstrap/store.h"
#include "core/status.h"

namespace meridian::testing {

class RankHarness {
 public:
  // Starts the store and creates worldSize communicators concurrently. Returns the first
  // rank's failure if any set-up fails.
  // `perRank` may adjust each rank's options (e.g. its region).
  static Result<std::unique_ptr<RankHarness>> start(
      int worldSize, const collectives::CommOptions& options = {},
      const std::function<void(int rank, collectives::CommOptions&)>& perRank = nullptr);
  ~RankHarness();
  RankHarness(const RankHarness&) = delete;
  RankHarness& operator=(const RankHarness&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  collectives::Communicator& comm(int rank) { return *comms_[static_cast<std::size_t>(rank)]; }
  // Destroys one rank's communicator (failure tests); comm(rank) is invalid afterwards.
  void destroyRank(int rank);

  using RankFn = std::function<std::string(int rank, collectives::Communicator& comm)>;
  // Runs fn on every rank, one thread each, and returns one result per rank ("" = passed).
  std::vector<std::string> run(const RankFn& fn);
  // Runs fn only on the listed ranks.
  std::vector<std::string> runOn(const std::vector<int>& ranks, const RankFn& fn);

  // "" when every rank passed, else one line per failed rank.
  static std::string summarize(const std::vector<std::string>& results);

 private:
  RankHarness() = default;

  std::unique_ptr<bootstrap::StoreServer> server_;
  std::vector<std::unique_ptr<bootstrap::Store>> stores_;
  std::vector<std::unique_ptr<collectives::Communicator>> comms_;
};

// Formats a non-ok Status as a failure line ("" when ok).
std::string statusFailure(const char* what, const Status& st);

}  // namespace meridian::testing
