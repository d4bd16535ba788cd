// RankHarness: threads as ranks over real TCP, failures collected for the main thread.
#include "tests/common/rank_harness.h"

#include <exception>
#include <thread>

#include <fmt/format.h>

#include "core/clock.h"
#include "core/secret.h"

namespace meridian::testing {

using collectives::CommOptions;
using collectives::Communicator;

namespace {

// Runs fn(i) for each i on its own thread; exceptions become failure strings.
std::vector<std::string> runThreads(const std::vector<int>& ids, const std::function<std::string(int)>& fn) {
  std::vector<std::string> results(ids.size());
  std::vector<std::thread> threads;
  threads.reserve(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    threads.emplace_back([&, k] {
      try {
        results[k] = fn(ids[k]);
      } catch (const std::exception& e) {
        results[k] = fmt::format("exception: {}", e.what());
      } catch (...) {
        results[k] = "unknown exception";
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

std::string statusFailure(const char* what, const Status& st) {
  return st.isOk() ? std::string() : fmt::format("{}: {}", what, st.toString());
}

Result<std::unique_ptr<RankHarness>> RankHarness::start(int worldSize, const CommOptions& options,
                                                        const std::function<void(int, CommOptions&)>& perRank) {
  if (worldSize < 1) return invalidArgument("world size {} < 1", worldSize);
  std::unique_ptr<RankHarness> h(new RankHarness());
  const std::string secret = options.secret.empty() ? loadJobSecret() : options.secret;
  MERIDIAN_ASSIGN_OR_RETURN(h->server_, bootstrap::StoreServer::start("127.0.0.1", 0, secret));
  const std::string address = fmt::format("127.0.0.1:{}", h->server_->port());
  h->stores_.resize(static_cast<std::size_t>(worldSize));
  h->comms_.resize(static_cast<std::size_t>(worldSize));
  std::vector<int> ranks;
  for (int r = 0; r < worldSize; ++r) ranks.push_back(r);
  std::vector<Status> statuses(ranks.size());
  auto results = runThreads(ranks, [&](int r) -> std::string {
    const auto idx = static_cast<std::size_t>(r);
    auto store = bootstrap::TcpStore::connect(address, secret, deadlineAfter(std::chrono::seconds(30)));
    if (!store) {
      statuses[idx] = store.status();
      return statusFailure("store connect", store.status());
    }
    h->stores_[idx] = std::move(store).value();
    CommOptions mine = options;
    if (perRank) perRank(r, mine);
    auto comm = Communicator::create(*h->stores_[idx], r, worldSize, mine);
    if (!comm) {
      statuses[idx] = comm.status();
      return statusFailure("communicator create", comm.status());
    }
    h->comms_[idx] = std::move(comm).value();
    return {};
  });
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (!results[i].empty()) {
      if (!statuses[i].isOk()) return statuses[i].withContext(fmt::format("rank {}", i));
      return internalError("rank {}: {}", i, results[i]);
    }
  }
  return h;
}

RankHarness::~RankHarness() {
  // Communicators first (concurrently: each one's teardown may wait on its peers' sockets).
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) ranks.push_back(r);
  runThreads(ranks, [&](int r) {
    comms_[static_cast<std::size_t>(r)].reset();
    return std::string();
  });
  stores_.clear();
  server_.reset();
}

void RankHarness::destroyRank(int rank) { comms_[static_cast<std::size_t>(rank)].reset(); }

std::vector<std::string> RankHarness::run(const RankFn& fn) {
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) ranks.push_back(r);
  return runOn(ranks, fn);
}

std::vector<std::string> RankHarness::runOn(const std::vector<int>& ranks, const RankFn& fn) {
  auto partial = runThreads(ranks, [&](int r) { return fn(r, comm(r)); });
  std::vector<std::string> results(static_cast<std::size_t>(size()));
  for (std::size_t k = 0; k < ranks.size(); ++k) results[static_cast<std::size_t>(ranks[k])] = std::move(partial[k]);
  return results;
}

std::string RankHarness::summarize(const std::vector<std::string>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r) {
    if (!results[r].empty()) out += fmt::format("rank {}: {}\n", r, results[r]);
  }
  return out;
}

}  // namespace meridian::testing
