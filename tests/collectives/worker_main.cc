// collectives_worker: one rank of the multi-process test (process_test.cc). Reads rank,
// world size and store from MERIDIAN_* like any Meridian program, runs the collective
// checks and exits 0 when all passed, 1 on a failed check, 2 when set-up failed, and
// kExitStorePortTaken when rank 0 could not bind the store port (the test retries).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/communicator.h"
#include "tests/common/collective_checks.h"

extern char** environ;

namespace {
constexpr int kExitStorePortTaken = 75;

using meridian::collectives::Communicator;

// The allreduce checks of MERIDIAN_TEST_SHRINK and its joiner: each rank's values depend on
// its job rank and the iteration, so the sum says which ranks took part.
void fillShare(std::vector<float>& buf, const Communicator& c, int iter) {
  const int me = c.jobRanks()[static_cast<std::size_t>(c.rank())];
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((me + 1) * 1000 + iter + i % 7);
}

std::string expectShareSum(const std::vector<float>& buf, const Communicator& c, int iter) {
  for (std::size_t i = 0; i < buf.size(); i += 4099) {
    double want = 0;
    for (int m : c.jobRanks()) want += (m + 1) * 1000 + iter + static_cast<double>(i % 7);
    if (buf[i] != static_cast<float>(want)) {
      return fmt::format("allreduce {} on {} ranks: [{}] = {} not {}", iter, c.size(), i, buf[i], want);
    }
  }
  return {};
}

// The other collectives, checked, on a communicator that changed membership.
std::vector<std::string> checkOtherCollectives(Communicator& c) {
  using namespace meridian::testing;
  using meridian::kernels::DataType;
  std::vector<std::string> failures;
  for (std::string f : {checkBroadcast(c, 100000, DataType::kF32, c.size() - 1, false),
                        checkAllgather(c, 4097, DataType::kI32, false),
                        checkReduceScatter(c, 5000, DataType::kF32, meridian::kernels::ReduceOp::kSum, false),
                        checkBarrier(c, 2)}) {
    if (!f.empty()) failures.push_back(std::move(f));
  }
  return failures;
}
}

// MERIDIAN_TEST_JOINER=j: a process started after the others (by the lowest survivor of
// MERIDIAN_TEST_SHRINK with MERIDIAN_TEST_REJOIN=1) that joins the job as job rank j, learns
// the iteration the members are at, and runs the rest of their allreduces with them.
int joinerMain(int jobRank);
// Starts this program again as a joiner (joinerMain) asking for job rank `jobRank`; -1 when
// it could not.
pid_t spawnJoiner(int jobRank) {
  const std::string env = fmt::format("MERIDIAN_TEST_JOINER={}", jobRank);
  std::vector<char*> envp;
  envp.push_back(const_cast<char*>(env.c_str()));
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(nullptr);
  char* argv[] = {const_cast<char*>("/proc/self/exe"), nullptr};
  pid_t pid = -1;
  return posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0 ? pid : -1;
}

int main() {
  using namespace meridian;
  using namespace meridian::testing;
  if (const char* j = std::getenv("MERIDIAN_TEST_JOINER"); j != nullptr) return joinerMain(std::atoi(j));
  auto comm = collectives::Communicator::createFromEnvironment();
  if (!comm.isOk()) {
    std::fprintf(stderr, "collectives_worker: set-up failed: %s\n", comm.status().toString().c_str());
    return comm.status().message().find("Address already in use") != std::string::npos ? kExitStorePortTaken : 2;
  }
  collectives::Communicator& c = *comm.value();
  const int n = c.size();
  // MERIDIAN_TEST_KILL_RANK=v: allreduces until rank v kills itself (SIGKILL) at the start of
  // its fourth; the others must see their allreduce fail within 10 s (a peer error, not
  // their 60 s timeout) and then exit 0.
  if (const char* victim = std::getenv("MERIDIAN_TEST_KILL_RANK"); victim != nullptr) {
    std::vector<float> buf(256 * 1024, 1.0f);
    for (int i = 0; i < 1000; ++i) {
      if (c.rank() == std::atoi(victim) && i == 3) std::raise(SIGKILL);
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = c.allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kMax);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.isOk()) {
        std::fprintf(stderr, "rank %d: allreduce %d failed after %.3f s: %s\n", c.rank(), i, sec, st.toString().c_str());
        return sec < 10.0 ? 0 : 1;
      }
    }
    std::fprintf(stderr, "rank %d: 1000 allreduces and rank %s never died\n", c.rank(), victim);
    return 1;
  }
  // MERIDIAN_TEST_GROW_ASIDE=1 (with MERIDIAN_ELASTIC=on): rank 0 starts a joiner (job rank
  // n). The members plan its admission, build the grown communicator on a thread of their
  // own and go on with checked allreduces on the old one meanwhile; they switch once every
  // member has it (membershipRequests says so), and all n + 1 run 10 more and the other
  // collectives.
  if (std::getenv("MERIDIAN_TEST_GROW_ASIDE") != nullptr) {
    using BuildState = collectives::Communicator::BuildState;
    std::unique_ptr<collectives::Communicator> owner = std::move(comm).value();
    const pid_t joiner = owner->rank() == 0 ? spawnJoiner(n) : 0;
    if (joiner < 0) return 1;
    std::vector<float> buf(256 * 1024);  // as joinerMain's
    std::unique_ptr<collectives::Communicator::MembershipChange> change;
    std::thread builder;
    std::atomic<bool> built{false};
    Result<std::unique_ptr<collectives::Communicator>> grown = std::unique_ptr<collectives::Communicator>();
    int aside = 0;  // allreduces on the old communicator while the grown one was built
    int end = INT32_MAX;
    const auto giveUp = Clock::now() + std::chrono::seconds(60);
    for (int iter = 0; iter < end; ++iter) {
      const BuildState state = !change         ? BuildState::kNone
                               : !built.load() ? BuildState::kBuilding
                               : grown.isOk()  ? BuildState::kBuilt
                                               : BuildState::kFailed;
      // Asked until the switch (the joiner's protocol has allreduces only).
      auto asked = end == INT32_MAX ? owner->membershipRequests(false, state)
                                    : Result<collectives::Communicator::MembershipRequests>(
                                          collectives::Communicator::MembershipRequests{});
      if (!asked.isOk()) {
        std::fprintf(stderr, "rank %d: membershipRequests: %s\n", owner->rank(), asked.status().toString().c_str());
        if (builder.joinable()) builder.join();
        return 1;
      }
      if (change && asked->buildFailed) {
        builder.join();
        std::fprintf(stderr, "rank %d: a build failed: %s\n", owner->rank(), grown.status().toString().c_str());
        return 1;
      }
      if (change && asked->builtEverywhere) {
        builder.join();
        owner->handOver(*change, *grown.value());
        owner->retire();
        owner = std::move(grown).value();
        change.reset();
        std::int64_t at = iter;  // the joiner's protocol: where the members are
        if (!owner->broadcast(&at, &at, 1, DataType::kI64, 0).isOk()) return 1;
        end = iter + 10;
      } else if (!change && end == INT32_MAX && asked->joiners > 0) {
        auto planned = owner->planMembershipChange(*asked);
        if (!planned.isOk()) {
          std::fprintf(stderr, "rank %d: planning: %s\n", owner->rank(), planned.status().toString().c_str());
          return 1;
        }
        change = std::move(planned).value();
        builder = std::thread([&] {
          grown = change->build(Clock::now() + std::chrono::seconds(30));
          built.store(true);
        });
      } else if (end == INT32_MAX && Clock::now() > giveUp) {
        std::fprintf(stderr, "rank %d: no joiner admitted within 60 s\n", owner->rank());
        if (builder.joinable()) builder.join();
        return 1;
      }
      fillShare(buf, *owner, iter);
      if (Status st = owner->allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum); !st.isOk()) {
        std::fprintf(stderr, "rank %d: allreduce %d: %s\n", owner->rank(), iter, st.toString().c_str());
        if (builder.joinable()) builder.join();
        return 1;
      }
      if (const std::string e = expectShareSum(buf, *owner, iter); !e.empty()) {
        std::fprintf(stderr, "rank %d (of %d): %s\n", owner->rank(), owner->size(), e.c_str());
        if (builder.joinable()) builder.join();
        return 1;
      }
      if (change) ++aside;
    }
    std::vector<int> all(static_cast<std::size_t>(n) + 1);
    for (int r = 0; r <= n; ++r) all[static_cast<std::size_t>(r)] = r;
    std::vector<std::string> failures = checkOtherCollectives(*owner);
    if (owner->jobRanks() != all || owner->membership().epoch != 1u || aside < 1) {
      failures.push_back(fmt::format("job ranks {} at epoch {}, {} allreduces while building",
                                     fmt::join(owner->jobRanks(), ","), owner->membership().epoch, aside));
    }
    if (joiner > 0) {
      int status = 0;
      if (::waitpid(joiner, &status, 0) != joiner || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        failures.push_back(fmt::format("the joiner ended with status {}", status));
      }
    }
    std::fprintf(stderr, "rank %d: %d checked allreduces on the old communicator while the grown one was built\n",
                 owner->rank(), aside);
    for (const auto& f : failures) std::fprintf(stderr, "rank %d: %s\n", owner->rank(), f.c_str());
    return failures.empty() ? 0 : 1;
  }
  // MERIDIAN_TEST_DRAIN=v (with MERIDIAN_ELASTIC=on): checked allreduces; every iteration the
  // members ask membershipRequests(), rank v asking to leave from the fifth on. It leaves
  // (exit 0) once the others built the communicator without it; they run 10 more checked
  // allreduces and the other collectives, and no op of anybody's fails.
  if (const char* drainEnv = std::getenv("MERIDIAN_TEST_DRAIN"); drainEnv != nullptr) {
    const int leaver = std::atoi(drainEnv);
    std::unique_ptr<collectives::Communicator> owner = std::move(comm).value();
    std::vector<float> buf(64 * 1024);
    int end = 10;
    for (int iter = 0; iter < end; ++iter) {
      const int me = owner->jobRanks()[static_cast<std::size_t>(owner->rank())];
      auto asked = owner->membershipRequests(me == leaver && iter >= 5);
      if (!asked.isOk()) {
        std::fprintf(stderr, "rank %d: membershipRequests: %s\n", me, asked.status().toString().c_str());
        return 1;
      }
      if (!asked->leaving.empty()) {
        auto next = owner->changeMembership(*asked, Clock::now() + std::chrono::seconds(30));
        if (!next.isOk()) {
          std::fprintf(stderr, "rank %d: changeMembership: %s\n", me, next.status().toString().c_str());
          return 1;
        }
        if (me == leaver) {
          if (next.value() != nullptr) return 1;  // a leaver gets no communicator
          owner->retire();
          std::fprintf(stderr, "rank %d: left at iteration %d\n", me, iter);
          return 0;
        }
        owner->retire();
        owner = std::move(next).value();
        end = iter + 10;
      }
      fillShare(buf, *owner, iter);
      if (Status st = owner->allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum); !st.isOk()) {
        std::fprintf(stderr, "rank %d: allreduce %d: %s\n", me, iter, st.toString().c_str());
        return 1;
      }
      if (const std::string e = expectShareSum(buf, *owner, iter); !e.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", me, e.c_str());
        return 1;
      }
    }
    std::vector<int> stayed;
    for (int r = 0; r < n; ++r) {
      if (r != leaver) stayed.push_back(r);
    }
    if (owner->jobRanks() != stayed || owner->membership().epoch != 1u) {
      std::fprintf(stderr, "rank %d: job ranks %s at epoch %llu at the end\n", owner->rank(),
                   fmt::format("{}", fmt::join(owner->jobRanks(), ",")).c_str(),
                   static_cast<unsigned long long>(owner->membership().epoch));
      return 1;
    }
    std::vector<std::string> failures = checkOtherCollectives(*owner);
    for (const auto& f : failures) std::fprintf(stderr, "rank %d: %s\n", owner->rank(), f.c_str());
    return failures.empty() ? 0 : 1;
  }
  // MERIDIAN_TEST_SPLIT=v (with MERIDIAN_ELASTIC=on): children split by job rank parity run
  // checked allreduces; rank v kills itself in the fourth. Every survivor's child op fails,
  // the survivors take the parent's successor, split it again, and the children's
  // allreduces are right on the survivors.
  // MERIDIAN_TEST_SPLIT_FREEZE=1: rank v freezes (SIGSTOP) instead: its peers' eager sends
  // stay unacknowledged, and no survivor's teardown of a child may wait on them. Each must
  // hold the parent's successor within MERIDIAN_PEER_TIMEOUT_MS + 4 s of its last good child
  // allreduce (a child's close once waited 5 s more for the frozen rank); the lowest survivor
  // then ends the frozen rank with SIGKILL.
  if (const char* splitEnv = std::getenv("MERIDIAN_TEST_SPLIT"); splitEnv != nullptr) {
    const int victim = std::atoi(splitEnv);
    std::unique_ptr<collectives::Communicator> owner = std::move(comm).value();
    const bool freeze = std::getenv("MERIDIAN_TEST_SPLIT_FREEZE") != nullptr;
    const char* timeoutEnv = std::getenv("MERIDIAN_PEER_TIMEOUT_MS");
    const double recoveryLimit = std::atof(timeoutEnv != nullptr ? timeoutEnv : "5000") / 1e3 + 4.0;
    std::int64_t myPid = ::getpid();
    std::vector<std::int64_t> pids(static_cast<std::size_t>(n));
    if (Status st = owner->allgather(&myPid, pids.data(), 1, DataType::kI64); !st.isOk()) {
      std::fprintf(stderr, "rank %d: allgather of pids: %s\n", owner->rank(), st.toString().c_str());
      return 1;
    }
    auto lastGood = std::chrono::steady_clock::now();
    std::vector<float> buf(64 * 1024);
    int failures = 0;
    for (int round = 0; round < 2; ++round) {
      const int me = owner->jobRanks()[static_cast<std::size_t>(owner->rank())];
      auto child = owner->split(me % 2, "sp");
      if (!child.isOk()) {
        std::fprintf(stderr, "rank %d: split: %s\n", me, child.status().toString().c_str());
        return 1;
      }
      std::unique_ptr<collectives::Communicator> sub = std::move(child).value();
      std::vector<int> want;
      for (int m : owner->jobRanks()) {
        if (m % 2 == me % 2) want.push_back(m);
      }
      if (sub->jobRanks() != want) {
        std::fprintf(stderr, "rank %d: the child has job ranks %s\n", me, fmt::format("{}", fmt::join(sub->jobRanks(), ",")).c_str());
        return 1;
      }
      // Round 0 runs until the loss stops the child (the other parity's too, by its parent),
      // round 1 eight allreduces on the survivors.
      bool cut = false;
      const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (int iter = 0; round == 0 ? std::chrono::steady_clock::now() < giveUp : iter < 8; ++iter) {
        if (me == victim && iter == 3) std::raise(freeze ? SIGSTOP : SIGKILL);
        fillShare(buf, *sub, iter);
        if (Status st = sub->allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum); !st.isOk()) {
          std::fprintf(stderr, "rank %d: child allreduce %d: %s\n", me, iter, st.toString().c_str());
          cut = true;
          break;
        }
        if (const std::string e = expectShareSum(buf, *sub, iter); !e.empty()) {
          std::fprintf(stderr, "rank %d: %s\n", me, e.c_str());
          return 1;
        }
        lastGood = std::chrono::steady_clock::now();
      }
      if (!cut) continue;
      ++failures;
      sub.reset();  // children go before their parent
      auto next = owner->successor(Clock::now() + std::chrono::seconds(30));
      if (!next.isOk()) {
        std::fprintf(stderr, "rank %d: no successor: %s\n", me, next.status().toString().c_str());
        return 1;
      }
      owner = std::move(next).value();
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - lastGood).count();
      std::fprintf(stderr, "rank %d: successor %.3f s after the last good child allreduce\n", me, took);
      if (freeze && took > recoveryLimit) {
        std::fprintf(stderr, "rank %d: the successor came after %.3f s, over %.1f s\n", me, took, recoveryLimit);
        return 1;
      }
      if (freeze && owner->rank() == 0) ::kill(static_cast<pid_t>(pids[static_cast<std::size_t>(victim)]), SIGKILL);
    }
    // Every survivor's child saw the loss once (the other parity's too: the parent stopped it).
    if (failures != 1 || owner->size() != n - 1) {
      std::fprintf(stderr, "rank %d: %d failures, %d ranks at the end\n", owner->rank(), failures, owner->size());
      return 1;
    }
    return 0;
  }
  // MERIDIAN_TEST_SHRINK=v (with MERIDIAN_ELASTIC=on): allreduces of rank-dependent values,
  // checked, until rank v kills itself (SIGKILL) at the start of its fifth, while the others
  // are in it with it. Every survivor must see that op aborted, take the successor (the
  // survivors in job-rank order), and go on: the aborted allreduce again, then 20 more and a
  // broadcast and an allgather, all checked against the survivors' values.
  if (const char* victimEnv = std::getenv("MERIDIAN_TEST_SHRINK"); victimEnv != nullptr) {
    const int victim = std::atoi(victimEnv);
    std::unique_ptr<collectives::Communicator> owner = std::move(comm).value();
    std::vector<float> buf(256 * 1024);
    std::optional<std::chrono::steady_clock::time_point> failedAt;
    double recovered = -1;
    int aborted = 0;
    // MERIDIAN_TEST_REJOIN=1: 5 allreduces after the shrink, the lowest survivor starts a
    // process that joins as job rank v; the members admit it (they ask every iteration) and
    // all 4 run 10 more allreduces.
    const bool rejoin = std::getenv("MERIDIAN_TEST_REJOIN") != nullptr;
    pid_t joiner = -1;
    bool grown = false;
    int end = 30;
    int shrunkAt = -1;
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int iter = 0; iter < end; ++iter) {
      if (rejoin && shrunkAt >= 0 && !grown && iter >= shrunkAt + 5) {
        if (owner->rank() == 0 && joiner < 0) {
          joiner = spawnJoiner(victim);
          if (joiner < 0) return 1;
        }
        auto pending = owner->membershipRequests(false);
        if (!pending.isOk()) return 1;
        if (pending->joiners > 0) {
          auto g = owner->changeMembership(*pending, Clock::now() + std::chrono::seconds(30));
          if (!g.isOk()) {
            std::fprintf(stderr, "rank %d: admitting: %s\n", owner->rank(), g.status().toString().c_str());
            return 1;
          }
          owner = std::move(g).value();
          if (!owner) return 1;  // a member that stays gets the new communicator
          grown = true;
          std::int64_t at = iter;
          if (!owner->broadcast(&at, &at, 1, DataType::kI64, 0).isOk()) return 1;
          end = iter + 10;
        } else if (iter == end - 1 && std::chrono::steady_clock::now() < giveUp) {
          ++end;  // the joiner is still starting
        }
      }
      if (owner->jobRanks()[static_cast<std::size_t>(owner->rank())] == victim && iter == 4) std::raise(SIGKILL);
      fillShare(buf, *owner, iter);
      const auto started = std::chrono::steady_clock::now();
      const Status st = owner->allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum);
      if (!st.isOk()) {
        if (aborted++ > 0) {
          std::fprintf(stderr, "rank %d: a second failure: %s\n", owner->rank(), st.toString().c_str());
          return 1;
        }
        failedAt = started;  // the victim died as this allreduce began
        std::fprintf(stderr, "rank %d: allreduce %d: %s\n", owner->rank(), iter, st.toString().c_str());
        auto next = owner->successor(Clock::now() + std::chrono::seconds(30));
        if (!next.isOk()) {
          std::fprintf(stderr, "rank %d: no successor: %s\n", owner->rank(), next.status().toString().c_str());
          return 1;
        }
        owner = std::move(next).value();
        shrunkAt = iter;
        --iter;  // the aborted one again, on the survivors
        continue;
      }
      if (const std::string e = expectShareSum(buf, *owner, iter); !e.empty()) {
        std::fprintf(stderr, "rank %d (of %d): %s\n", owner->rank(), owner->size(), e.c_str());
        return 1;
      }
      if (failedAt && recovered < 0) {
        recovered = std::chrono::duration<double>(std::chrono::steady_clock::now() - *failedAt).count();
      }
    }
    std::vector<int> survivors;
    for (int r = 0; r < n; ++r) {
      if (r != victim) survivors.push_back(r);
    }
    if (rejoin) survivors.push_back(victim);  // back, with the last rank
    if (aborted != 1 || owner->jobRanks() != survivors || owner->membership().epoch != (rejoin ? 2u : 1u)) {
      std::fprintf(stderr, "rank %d: %d aborted ops, %d ranks at the end, epoch %llu\n", owner->rank(), aborted,
                   owner->size(), static_cast<unsigned long long>(owner->membership().epoch));
      return 1;
    }
    std::vector<std::string> failures = checkOtherCollectives(*owner);
    std::fprintf(stderr, "rank %d: from the start of the aborted allreduce to the first one done on %d ranks: %.3f s\n", owner->rank(),
                 owner->size() - (rejoin ? 1 : 0), recovered);
    if (joiner > 0) {
      int status = 0;
      if (::waitpid(joiner, &status, 0) != joiner || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        failures.push_back(fmt::format("the joiner ended with status {}", status));
      }
    }
    for (const auto& f : failures) std::fprintf(stderr, "rank %d: %s\n", owner->rank(), f.c_str());
    return failures.empty() ? 0 : 1;
  }
  // MERIDIAN_TEST_LOSE_RANK=v[,w...]:kill or :stop: those ranks kill themselves (SIGKILL) or
  // freeze (SIGSTOP: sockets open, nothing answers) after a barrier, and no collective runs.
  // Every other rank must declare each of them lost (a kill within 2 s: its channel fails; a
  // freeze within MERIDIAN_PEER_TIMEOUT_MS + 3 s but not before half of it: silence, not an
  // error), and then all survivors must agree on the membership without them, at epoch 1,
  // within 10 s more. The lowest survivor then ends frozen ranks with SIGKILL.
  if (const char* lose = std::getenv("MERIDIAN_TEST_LOSE_RANK"); lose != nullptr) {
    const std::string spec(lose);
    std::vector<int> victims;
    for (std::size_t at = 0; at < spec.size() && spec[at] != ':';) {
      victims.push_back(std::atoi(spec.c_str() + at));
      at = spec.find_first_of(",:", at);
      if (at == std::string::npos || spec[at] == ':') break;
      ++at;
    }
    const bool freeze = spec.find(":stop") != std::string::npos;
    const bool isVictim = std::find(victims.begin(), victims.end(), c.rank()) != victims.end();
    const char* timeoutEnv = std::getenv("MERIDIAN_PEER_TIMEOUT_MS");
    const double timeoutSec = std::atof(timeoutEnv != nullptr ? timeoutEnv : "5000") / 1e3;
    std::int64_t mine = ::getpid();
    std::vector<std::int64_t> pids(static_cast<std::size_t>(n));
    if (Status st = c.allgather(&mine, pids.data(), 1, DataType::kI64); !st.isOk()) {
      std::fprintf(stderr, "rank %d: allgather of pids: %s\n", c.rank(), st.toString().c_str());
      return 1;
    }
    if (Status st = c.barrier(); !st.isOk()) return 1;
    if (isVictim) std::raise(freeze ? SIGSTOP : SIGKILL);
    std::vector<int> survivors;
    for (int r = 0; r < n; ++r) {
      if (std::find(victims.begin(), victims.end(), r) == victims.end()) survivors.push_back(r);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    const double limit = freeze ? timeoutSec + 3.0 : 2.0;
    auto allLost = [&] {
      const std::vector<int> lost = c.lostPeers();
      return std::all_of(victims.begin(), victims.end(),
                         [&](int v) { return std::find(lost.begin(), lost.end(), v) != lost.end(); });
    };
    while (!allLost() && since() <= limit) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // bounded poll
    const double detected = since();
    const std::size_t lostNow = c.lostPeers().size();
    while (c.membership().members != survivors && since() <= limit + 10.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a poll bounded by the limit
    }
    const double agreed = since();
    const auto view = c.membership();
    std::fprintf(stderr, "rank %d: %zu rank(s) (%s) declared lost after %.3f s; membership %s after %.3f s\n", c.rank(),
                 victims.size(), freeze ? "frozen" : "killed", detected, view.toString().c_str(), agreed);
    // Every survivor stays until all have agreed (a file each in MERIDIAN_TEST_SYNC_DIR): one
    // that ended early would be a loss for the slower ones.
    const std::string dir = std::getenv("MERIDIAN_TEST_SYNC_DIR") ? std::getenv("MERIDIAN_TEST_SYNC_DIR") : ".";
    std::fclose(std::fopen(fmt::format("{}/detected.{}", dir, c.rank()).c_str(), "w"));
    const auto syncDeadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (std::size_t i = 0; i < survivors.size() && std::chrono::steady_clock::now() < syncDeadline;) {
      if (::access(fmt::format("{}/detected.{}", dir, survivors[i]).c_str(), F_OK) == 0) {
        ++i;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a poll bounded by syncDeadline
      }
    }
    if (freeze && c.rank() == survivors.front()) {
      for (int v : victims) ::kill(static_cast<pid_t>(pids[static_cast<std::size_t>(v)]), SIGKILL);
    }
    const bool ok = detected <= limit && (!freeze || detected >= timeoutSec / 2) && lostNow == victims.size() &&
                    view.epoch == 1 && view.members == survivors;
    std::fflush(stderr);
    return ok ? 0 : 1;
  }
  std::vector<std::string> failures;
  auto check = [&](std::string result) {
    if (!result.empty()) failures.push_back(std::move(result));
  };
  for (DataType t : {DataType::kF32, DataType::kBF16, DataType::kI64}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, largeCount(t)}) {
      check(checkAllreduce(c, count, t, ReduceOp::kSum, false));
      check(checkAllreduce(c, count, t, ReduceOp::kMax, true));
      check(checkReduceScatter(c, count / static_cast<std::size_t>(n) + 1, t, ReduceOp::kSum, count % 2 == 1));
      check(checkAllgather(c, count / static_cast<std::size_t>(n) + 1, t, count % 2 == 0));
      check(checkBroadcast(c, count, t, n - 1, false));
      check(checkReduce(c, count, t, ReduceOp::kAvg, 0, true));
    }
  }
  // Averages over more than one direct-exchange window: ranks on one host that read each
  // other take the direct exchange (auto); the test may insist that they do.
  if (const char* expect = std::getenv("MERIDIAN_TEST_EXPECT_ONE_HOST"); expect != nullptr && n > 1) {
    const bool want = std::string(expect) == "1";
    if (c.allRanksOnOneHost() != want) {
      failures.push_back(std::string("all ranks on one host: ") + (want ? "expected, not seen" : "seen, not expected"));
    }
  }
  // Shared memory (MERIDIAN_SHM=auto, every rank on this host): the test may insist either way.
  if (const char* expect = std::getenv("MERIDIAN_TEST_EXPECT_SHM"); expect != nullptr && n > 1) {
    const bool want = std::string(expect) == "1";
    if (c.sharedMemory() != want) {
      failures.push_back(std::string("shared memory: ") + (want ? "expected, not in use" : "in use, not expected"));
    }
  }
  const std::size_t twoWindows = collectives::kDirectWindowBytes / sizeof(float) + 513;
  // Over more than one shared-memory window, ending in a window small enough for every rank
  // to reduce it whole.
  check(checkAllreduce(c, 2 * collectives::HostArena::kWindowBytes / sizeof(float) + 1001, DataType::kF32,
                       ReduceOp::kSum, false));
  check(checkAllreduce(c, twoWindows, DataType::kF32, ReduceOp::kAvg, false));
  check(checkAllreduce(c, twoWindows, DataType::kI32, ReduceOp::kAvg, true));
  check(checkAllreduce(c, 1023, DataType::kF16, ReduceOp::kProd, false));
  check(checkAllreduce(c, 4097, DataType::kF64, ReduceOp::kMin, true));
  check(checkBarrier(c, 3));
  check(checkSendRecv(c, 70000, DataType::kF32));
  check(checkAsyncBatch(c, 5000, DataType::kI32));
  // With fabric paths asked for (MERIDIAN_FABRIC=on), every peer's channel must have carried
  // chunks on one: the last path of each channel is its fabric path. (Whether it is still up
  // says nothing: a peer that finished first has closed it.)
  if (const char* expect = std::getenv("MERIDIAN_TEST_EXPECT_FABRIC"); expect != nullptr && std::string(expect) == "1") {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == c.rank()) continue;
      const auto stats = c.peerPathStats(peer);
      if (stats.empty() || stats.back().chunksSent == 0) {
        failures.push_back(fmt::format("the fabric path to rank {} {}", peer, stats.empty() ? "is missing" : "carried nothing"));
      }
    }
  }
  // Ranks of one host: every channel's last path is its shared-memory path, and those paths
  // carried most of the collectives that do not go through the arena (TCP only until a
  // channel's pairing completed, a few ms after it opened). Peers that finished first may
  // have closed theirs already: what a path carried is what counts, not whether it is up.
  if (const char* expect = std::getenv("MERIDIAN_TEST_EXPECT_SHM"); expect != nullptr && std::string(expect) == "1" &&
                                                                     n > 1) {
    std::uint64_t onShm = 0, onTcp = 0;
    int channels = 0;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == c.rank()) continue;
      const auto stats = c.peerPathStats(peer);
      if (stats.empty()) continue;
      ++channels;
      if (stats.back().kind != transport::PathKind::kSharedMemory) {
        failures.push_back(fmt::format("the channel to rank {} has no shared-memory path", peer));
        continue;
      }
      onShm += stats.back().chunksSent;
      for (std::size_t p = 0; p + 1 < stats.size(); ++p) onTcp += stats[p].chunksSent;
    }
    if (channels == 0 || onShm <= onTcp) {
      failures.push_back(fmt::format("over {} channels, shared-memory paths carried {} chunks and TCP {}", channels,
                                     onShm, onTcp));
    }
  }
  for (const auto& f : failures) std::fprintf(stderr, "rank %d: %s\n", c.rank(), f.c_str());
  return failures.empty() ? 0 : 1;
}

int joinerMain(int jobRank) {
  using namespace meridian;
  using namespace meridian::testing;
  const char* store = std::getenv("MERIDIAN_STORE");
  if (store == nullptr) return 2;
  const auto t0 = std::chrono::steady_clock::now();
  auto joined = collectives::Communicator::join(store, jobRank, {}, Clock::now() + std::chrono::seconds(60));
  if (!joined.isOk()) {
    std::fprintf(stderr, "joiner: %s\n", joined.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<collectives::Communicator> c = std::move(joined).value();
  const double admitted = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::int64_t at = 0;
  if (!c->broadcast(&at, &at, 1, DataType::kI64, 0).isOk()) return 1;
  std::vector<float> buf(256 * 1024);
  const int me = c->jobRanks()[static_cast<std::size_t>(c->rank())];
  for (int iter = static_cast<int>(at); iter < at + 10; ++iter) {
    fillShare(buf, *c, iter);
    if (Status st = c->allreduce(buf.data(), buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum); !st.isOk()) {
      std::fprintf(stderr, "joiner: allreduce %d: %s\n", iter, st.toString().c_str());
      return 1;
    }
    if (const std::string e = expectShareSum(buf, *c, iter); !e.empty()) {
      std::fprintf(stderr, "joiner: %s\n", e.c_str());
      return 1;
    }
  }
  std::vector<std::string> failures = checkOtherCollectives(*c);
  for (const auto& f : failures) std::fprintf(stderr, "joiner: %s\n", f.c_str());
  std::fprintf(stderr, "joiner: admitted as rank %d of %d (job rank %d) %.3f s after it started\n", c->rank(), c->size(),
               me, admitted);
  return failures.empty() ? 0 : 1;
}
