// The real lab (label `lab`: needs root and /dev/net/tun, skips visibly without them):
// meridian-lab up/run/set/cut/restore/status/down on lab/topologies/two-regions.yaml,
// round-trip times measured with a UDP echo through the emulator, TCP throughput with
// iperf3, and nothing left behind.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lab/lab.h"
#include "lab/netns.h"
#include "tests/common/lab_session.h"
#include "tests/common/poll.h"

namespace meridian::lab {
namespace {

constexpr const char* kLab = "mltest";
const std::string kTopology = std::string(MERIDIAN_SOURCE_DIR) + "/lab/topologies/two-regions.yaml";

using meridian::testing::CommandResult;
using meridian::testing::linkFigure;
using meridian::testing::pollUntil;
CommandResult sh(const std::string& command) { return meridian::testing::runShell(command); }
std::string lab(const std::string& args) { return meridian::testing::labCommand(kLab, args); }

bool haveIperf3() { return sh("command -v iperf3").code == 0; }

// Skips (visibly) where the lab cannot run.
#define REQUIRE_LAB()                                                                     \
  do {                                                                                    \
    if (std::string why = meridian::testing::labUnavailableReason(); !why.empty()) {      \
      GTEST_SKIP() << why;                                                                \
    }                                                                                     \
  } while (0)

// Brings the test lab up (time scale as given) and always takes it down again.
class LabFixture : public ::testing::Test {
 protected:
  void bringUp(const std::string& extra = "") {
    sh(lab("down"));  // a previous crashed run
    auto r = sh(lab("up " + kTopology + " " + extra));
    ASSERT_EQ(r.code, 0) << r.output;
    auto s = loadLab(kLab);
    ASSERT_TRUE(s.isOk()) << s.status().message();
    state_ = s.value();
    up_ = true;
  }
  void TearDown() override {
    if (up_) {
      auto r = sh(lab("down"));
      EXPECT_EQ(r.code, 0) << r.output;
    }
  }
  int node(const std::string& name) { return state_.topology.findNode(name).value(); }
  std::string addr(const std::string& plane, const std::string& name) {
    return state_.topology.address(state_.topology.findPlane(plane).value(), node(name));
  }

  LabState state_;
  bool up_ = false;
};

// A UDP echo between two nodes: `rtts` round trips, in ms; -1 for one lost (500 ms).
class Echo {
 public:
  Echo(const LabState& s, int from, int to, const std::string& fromAddr, const std::string& toAddr) {
    server_ = socketIn(s.namespaceOf(to), AF_INET, SOCK_DGRAM).value();
    auto sa = ipv4Address(toAddr, 0);
    socklen_t len = sizeof(sa);
    EXPECT_EQ(::bind(server_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    ::getsockname(server_.get(), reinterpret_cast<sockaddr*>(&sa), &len);
    timeval tv{0, 50'000};
    ::setsockopt(server_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    client_ = socketIn(s.namespaceOf(from), AF_INET, SOCK_DGRAM).value();
    auto ca = ipv4Address(fromAddr, 0);
    EXPECT_EQ(::bind(client_.get(), reinterpret_cast<sockaddr*>(&ca), sizeof(ca)), 0);
    EXPECT_EQ(::connect(client_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    thread_ = std::thread([this] {
      char buf[2048];
      while (!stop_) {
        sockaddr_in peer{};
        socklen_t plen = sizeof(peer);
        ssize_t n = ::recvfrom(server_.get(), buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&peer), &plen);
        if (n > 0) ::sendto(server_.get(), buf, static_cast<std::size_t>(n), 0, reinterpret_cast<sockaddr*>(&peer), plen);
      }
    });
  }
  ~Echo() {
    stop_ = true;
    thread_.join();
  }
  // Round trips in ms (lost ones are left out); sequence numbers reject late echoes.
  std::vector<double> measure(int count, std::chrono::milliseconds timeout = std::chrono::milliseconds(500)) {
    std::vector<double> out;
    for (int i = 0; i < count; ++i) {
      const std::uint64_t seq = next_++;
      auto t0 = std::chrono::steady_clock::now();
      if (::send(client_.get(), &seq, sizeof(seq), 0) != sizeof(seq)) continue;
      for (;;) {
        auto left = timeout - (std::chrono::steady_clock::now() - t0);
        if (left <= std::chrono::milliseconds(0)) break;
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
        timeval tv{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
        ::setsockopt(client_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        std::uint64_t got = 0;
        if (::recv(client_.get(), &got, sizeof(got), 0) != sizeof(got)) break;
        if (got == seq) {
          out.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          break;
        }
      }
      // Spaces the probes out so the round trips sample the path over time; it orders nothing
      // (each echo was matched to its own probe above).
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return out;
  }

 private:
  UniqueFd server_, client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::uint64_t next_ = 1;
};

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The lab's accuracy promise: within 5% + 0.2 ms of the configured round trip.
double rttAllowanceMs(double configuredMs) { return configuredMs * 0.05 + 0.2; }
// `lateMs`: the emulator's own mean lateness per packet over the measurement (two per echo).
void expectRtt(double measuredMs, double configuredMs, const std::string& what, double lateMs = 0) {
  EXPECT_NEAR(measuredMs, configuredMs, rttAllowanceMs(configuredMs) + 2 * lateMs)
      << what << " (the emulator " << lateMs * 1000 << " us late per packet)";
}

// The promise for a link that is not changing: the median of `count` echoes within 5% +
// 0.2 ms, plus twice (a round trip is two emulated packets) the mean lateness the emulator
// itself reports for the packets of that round: on a slow virtual machine its timers fire
// 100 us late on average where other hosts manage 25 us, and that is the lab telling its
// error bar, not a wrong delay. A round that misses is measured again (up to three), since a
// shared CI host that stops this process or the echo thread for tens of milliseconds moves a
// whole round's median (1 ms sleeps seen returning after 12-62 ms).
// `extraMs` widens the allowance (planes with jitter).
void expectSteadyRtt(Echo& echo, int count, double configuredMs, const std::string& what, double extraMs = 0) {
  std::string rounds;
  for (int round = 0; round < 3; ++round) {
    const auto before = meridian::testing::emulatorLateness(kLab);
    auto rtts = echo.measure(count);
    const double lateMs = meridian::testing::meanLateMs(before, meridian::testing::emulatorLateness(kLab));
    ASSERT_GE(rtts.size(), static_cast<std::size_t>(count - 1)) << what << ": echoes lost on a lossless link";
    const double allowed = rttAllowanceMs(configuredMs) + extraMs + 2 * lateMs;
    const double m = median(rtts);
    if (std::abs(m - configuredMs) <= allowed) return;
    rounds += fmt::format(" {:.2f} (+-{:.2f} with the emulator {:.0f} us late per packet)", m, allowed, lateMs * 1000);
  }
  ADD_FAILURE() << what << ": configured " << configuredMs << " ms; three rounds' medians:" << rounds;
}

TEST_F(LabFixture, RoundTripsMatchTheTopologyOnEveryPlane) {
  REQUIRE_LAB();
  bringUp();
  struct Case {
    const char* plane;
    const char* from;
    const char* to;
  };
  for (const Case& c : {Case{"wan-a", "east-1", "east-2"}, Case{"wan-a", "east-1", "west-1"},
                        Case{"wan-b", "east-2", "west-2"}, Case{"wan-b", "west-1", "west-2"}}) {
    const Topology& t = state_.topology;
    const int p = t.findPlane(c.plane).value();
    const auto& fwd = t.link(p, t.nodes[node(c.from)].region, t.nodes[node(c.to)].region);
    const auto& back = t.link(p, t.nodes[node(c.to)].region, t.nodes[node(c.from)].region);
    const double configured = (fwd.delayUs + back.delayUs) * t.timeScale / 1000;
    Echo echo(state_, node(c.from), node(c.to), addr(c.plane, c.from), addr(c.plane, c.to));
    expectSteadyRtt(echo, 15, configured, fmt::format("{} {} -> {}", c.plane, c.from, c.to));
  }
}

TEST_F(LabFixture, SetChangesTheRoundTripWithinASecondAndCutDropsEverything) {
  REQUIRE_LAB();
  bringUp("--time-scale 0.5");
  Echo echo(state_, node("east-1"), node("west-1"), addr("wan-a", "east-1"), addr("wan-a", "west-1"));
  expectSteadyRtt(echo, 10, 20.0, "before set (2 x 20 ms x 0.5)");

  auto r = sh(lab("set wan-a east west --delay 60ms"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("60ms"), std::string::npos) << r.output;
  // The first echo sent after `set` returns already sees the new delay (well within 1 s). It
  // is one packet each way, so it is held to "the new delay, not the old and not both": no
  // shorter than the new round trip allows (the old one is 20 ms), and well short of old plus
  // new (80 ms); a shared host that stops this process for a few ms (64.3 ms seen in CI) moves
  // one echo but not the median, which is held to the lab's promise below.
  auto t0 = std::chrono::steady_clock::now();
  const auto before = meridian::testing::emulatorLateness(kLab);
  auto after = echo.measure(10);
  const double lateMs = meridian::testing::meanLateMs(before, meridian::testing::emulatorLateness(kLab));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  ASSERT_FALSE(after.empty());
  EXPECT_GE(after.front(), 60.0 - rttAllowanceMs(60.0)) << "first echo after set (2 x 60 ms x 0.5)";
  EXPECT_LT(after.front(), 70.0) << "first echo after set (2 x 60 ms x 0.5)";
  expectRtt(median(after), 60.0, "after set", lateMs);

  r = sh(lab("set wan-a east west --one-way --delay 10ms"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSteadyRtt(echo, 10, 35.0, "one way changed: (10 + 60) x 0.5");

  r = sh(lab("cut wan-a east west"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(echo.measure(5, std::chrono::milliseconds(300)).empty()) << "a cut link must drop everything";
  // The other plane is a different network: still up.
  Echo other(state_, node("east-1"), node("west-1"), addr("wan-b", "east-1"), addr("wan-b", "west-1"));
  EXPECT_EQ(other.measure(5).size(), 5u);

  r = sh(lab("restore wan-a east west"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSteadyRtt(echo, 10, 20.0, "after restore");

  auto status = sh(lab("status"));
  ASSERT_EQ(status.code, 0) << status.output;
  EXPECT_NE(status.output.find("east -> west"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("loss drops"), std::string::npos) << status.output;
}

// iperf3 between two nodes: its JSON's received rate in bit/s.
double iperfRate(const std::string& server, const std::string& client, const std::string& serverAddr, int port,
                 int seconds, std::string* log) {
  auto r = sh(lab(fmt::format("run {} -- iperf3 -c {} -p {} -t {} -J", client, serverAddr, port, seconds)));
  *log += r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  if (r.code != 0 || j.is_discarded()) return -1;
  (void)server;
  return j["end"]["sum_received"].value("bits_per_second", -1.0);
}

// Starts `iperf3 -s -1` in a node (it serves one test, then exits) and returns once it listens
// (or has exited).
pid_t startIperfServer(const std::string& node, const std::string& address, int port) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string cmd = lab(fmt::format("run {} -- iperf3 -s -1 -B {} -p {}", node, address, port)) + " >/dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    ::_exit(127);
  }
  const bool listening = pollUntil(
      [&] {
        if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;  // failed: the client's error tells why
        auto listeners = sh(lab(fmt::format("run {} -- ss -Hltn 'sport = :{}'", node, port)));
        return listeners.code == 0 && !listeners.output.empty();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(20));
  EXPECT_TRUE(listening) << "iperf3 -s never listened on port " << port << " in " << node;
  return pid;
}

TEST_F(LabFixture, TcpReachesTheConfiguredRateAndTwoFlowsShareIt) {
  REQUIRE_LAB();
  if (!haveIperf3()) GTEST_SKIP() << "iperf3 is not installed (apt-get install iperf3)";
  bringUp();
  const Topology& t = state_.topology;
  const double rate = t.link(0, 0, 1).rateBitsPerSec;
  ASSERT_GT(rate, 0);
  std::string log;

  pid_t server = startIperfServer("west-1", addr("wan-a", "west-1"), 5201);
  double one = iperfRate("west-1", "east-1", addr("wan-a", "west-1"), 5201, 4, &log);
  ::waitpid(server, nullptr, 0);
  EXPECT_GE(one, 0.85 * rate) << log;
  EXPECT_LE(one, 1.02 * rate) << log;

  // Two flows between different nodes of the same region pair share its one link.
  pid_t s1 = startIperfServer("west-1", addr("wan-a", "west-1"), 5202);
  pid_t s2 = startIperfServer("west-2", addr("wan-a", "west-2"), 5203);
  double a = -1, b = -1;
  std::string logB;
  std::thread tb([&] { b = iperfRate("west-2", "east-2", addr("wan-a", "west-2"), 5203, 4, &logB); });
  a = iperfRate("west-1", "east-1", addr("wan-a", "west-1"), 5202, 4, &log);
  tb.join();
  ::waitpid(s1, nullptr, 0);
  ::waitpid(s2, nullptr, 0);
  log += logB;
  EXPECT_GE(a + b, 0.85 * rate) << log;
  EXPECT_LE(a + b, 1.02 * rate) << log;
  EXPECT_GE(a, 0.25 * rate) << "one flow starved: " << a << " vs " << b;
  EXPECT_GE(b, 0.25 * rate) << "one flow starved: " << a << " vs " << b;

  // `set` changes the rate live: the first second of a flow started right after it already
  // runs at the new rate.
  const double slower = rate * 0.4;
  auto r = sh(lab(fmt::format("set wan-a east west --rate {}bit", slower)));
  ASSERT_EQ(r.code, 0) << r.output;
  pid_t s3 = startIperfServer("west-1", addr("wan-a", "west-1"), 5204);
  // -R: west-1 sends and the client receives, so the per-second figures are what arrived.
  auto flow = sh(lab(fmt::format("run east-1 -- iperf3 -c {} -p 5204 -t 3 -R -J", addr("wan-a", "west-1"))));
  ::waitpid(s3, nullptr, 0);
  auto j = nlohmann::json::parse(flow.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << flow.output;
  const double total = j["end"]["sum_received"].value("bits_per_second", -1.0);
  const double firstSecond = j["intervals"][0]["sum"].value("bits_per_second", -1.0);
  EXPECT_GE(total, 0.85 * slower) << flow.output;
  EXPECT_LE(total, 1.02 * slower) << flow.output;
  EXPECT_LE(firstSecond, 1.05 * slower) << "the first second after set still ran faster than the new rate";
  std::printf("[ lab      ] configured %.0f Mbit/s: one flow %.1f Mbit/s; two flows %.1f + %.1f Mbit/s; "
              "after set to %.0f Mbit/s: %.1f Mbit/s (first second %.1f)\n",
              rate / 1e6, one / 1e6, a / 1e6, b / 1e6, slower / 1e6, total / 1e6, firstSecond / 1e6);
}

TEST_F(LabFixture, CrossTrafficQueuesAndDropsLikeRealCongestion) {
  REQUIRE_LAB();
  bringUp();
  const Topology& t = state_.topology;
  const double rate = t.link(0, 0, 1).rateBitsPerSec;
  Echo echo(state_, node("east-2"), node("west-2"), addr("wan-a", "east-2"), addr("wan-a", "west-2"));
  expectSteadyRtt(echo, 5, 40.0, "idle");
  const double idle = median(echo.measure(5));

  // 1.5x the link's rate from another pair of nodes of the same regions, for 3 s.
  CommandResult flow;
  std::thread sender([&] {
    flow = sh(lab(fmt::format("cross-traffic wan-a east-1 west-1 --rate {}bit --duration 3s", 1.5 * rate)));
  });
  // Measure once the flow has filled the queue in front of the link: it drops (the flow runs
  // 3 s; filling takes a fraction of that).
  EXPECT_TRUE(pollUntil([&] { return linkFigure(kLab, "wan-a", "east", "west", "queue_drops") > 0; },
                        std::chrono::seconds(3), std::chrono::milliseconds(20)))
      << "the cross traffic never filled the queue";
  const double loaded = median(echo.measure(5, std::chrono::milliseconds(1000)));
  sender.join();
  ASSERT_EQ(flow.code, 0) << flow.output;
  // The queue in front of the link fills: echoes wait behind it (default queue: 50 ms at
  // the rate), and what the flow gets through is the link's rate.
  EXPECT_GT(loaded, idle + 20) << "no queueing delay under 1.5x load";
  float sent = 0, received = 0;
  ASSERT_EQ(std::sscanf(flow.output.c_str() + flow.output.find("sent"), "sent %f Mbit/s, received %f", &sent, &received),
            2)
      << flow.output;
  EXPECT_NEAR(sent, 1.5 * rate / 1e6, 0.1 * rate / 1e6) << flow.output;
  EXPECT_NEAR(received, rate / 1e6, 0.15 * rate / 1e6) << flow.output;
  auto status = sh(lab("status --json"));
  auto j = nlohmann::json::parse(status.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << status.output;
  std::uint64_t queueDrops = 0;
  for (const auto& l : j["links"]) {
    if (l["plane"] == "wan-a" && l["src"] == "east" && l["dst"] == "west") queueDrops = l["queue_drops"];
  }
  EXPECT_GT(queueDrops, 0u) << "an overloaded drop-tail queue drops";
  // Once the flow is over, the queue drains and the round trip is back.
  EXPECT_TRUE(pollUntil([&] { return linkFigure(kLab, "wan-a", "east", "west", "backlog_bytes") == 0; },
                        std::chrono::seconds(10), std::chrono::milliseconds(20)))
      << "the queue never drained";
  expectSteadyRtt(echo, 5, 40.0, "after the flow");
}

TEST_F(LabFixture, ScenarioAppliesTimedEvents) {
  REQUIRE_LAB();
  bringUp();
  const std::string file = ::testing::TempDir() + "/scenario.yaml";
  std::ofstream(file) << R"(events:
  - at: 2s
    restore: {plane: wan-a, between: [east, west]}
  - at: 0s
    degrade: {plane: wan-a, between: [east, west], delay: 50ms}
  - at: 1s
    cut: {plane: wan-a, from: east, to: west}
)";
  Echo echo(state_, node("east-1"), node("west-1"), addr("wan-a", "east-1"), addr("wan-a", "west-1"));
  CommandResult run;
  const auto lateBefore = meridian::testing::emulatorLateness(kLab);
  const auto start = std::chrono::steady_clock::now();
  std::thread scenario([&] { run = sh(lab("scenario " + file)); });
  // Measures at points of the scenario's own timeline: the times are the input under test
  // (events due at 0, 1 and 2 s), each measurement in the middle of its event's second.
  auto at = [&](double s) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(static_cast<int>(s * 1000)));
  };
  at(0.4);
  const double degraded = median(echo.measure(3, std::chrono::milliseconds(300)));
  at(1.3);
  const auto cut = echo.measure(3, std::chrono::milliseconds(150));
  at(2.4);
  const double restored = median(echo.measure(3, std::chrono::milliseconds(300)));
  scenario.join();
  const double lateMs = meridian::testing::meanLateMs(lateBefore, meridian::testing::emulatorLateness(kLab));
  ASSERT_EQ(run.code, 0) << run.output;
  expectRtt(degraded, 100.0, "degraded to 50 ms one way", lateMs);
  EXPECT_TRUE(cut.empty()) << "east -> west was cut";
  expectRtt(restored, 40.0, "restored", lateMs);
  // Events run in time order, whatever the file's order, and are printed as they happen.
  const auto d = run.output.find("degrade wan-a"), c = run.output.find("cut wan-a"), r = run.output.find("restore wan-a");
  ASSERT_NE(d, std::string::npos) << run.output;
  EXPECT_LT(d, c) << run.output;
  EXPECT_LT(c, r) << run.output;
  EXPECT_NE(run.output.find("scenario done"), std::string::npos) << run.output;

  std::ofstream(file) << "events:\n  - at: 1s\n    degrade: {plane: wan-a, between: [east, mars], delay: 5ms}\n";
  auto bad = sh(lab("scenario " + file));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find(file + ":3:"), std::string::npos) << "names file and line: " << bad.output;
  EXPECT_NE(bad.output.find("mars"), std::string::npos) << bad.output;
}

TEST_F(LabFixture, TheShippedThreeRegionWorldComesUpWithItsRoundTrips) {
  REQUIRE_LAB();
  const std::string file = std::string(MERIDIAN_SOURCE_DIR) + "/lab/topologies/three-regions.yaml";
  sh(lab("down"));
  // A tenth of the real delays keeps the test short; the emulator scales them.
  auto r = sh(lab("up " + file + " --time-scale 0.1"));
  ASSERT_EQ(r.code, 0) << r.output;
  up_ = true;  // TearDown takes it down
  auto s = loadLab(kLab);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  const Topology& t = s->topology;
  EXPECT_EQ(t.nodes.size(), 6u);
  EXPECT_EQ(t.planes.size(), 2u);
  const int london = t.findNode("london-1").value(), singapore = t.findNode("singapore-2").value();
  for (int p = 0; p < 2; ++p) {
    const double configured =
        (t.link(p, t.nodes[london].region, t.nodes[singapore].region).delayUs +
         t.link(p, t.nodes[singapore].region, t.nodes[london].region).delayUs) * 0.1 / 1000;
    Echo echo(s.value(), london, singapore, t.address(p, london), t.address(p, singapore));
    // The shipped planes have jitter: compare the median with a little more room.
    expectSteadyRtt(echo, 10, configured, t.planes[p].name, 0.3);
  }
}

TEST_F(LabFixture, RunSetsTheNodeEnvironmentAndExecAllRunsEveryNode) {
  REQUIRE_LAB();
  bringUp();
  auto r = sh(lab("run west-2 -- sh -c 'echo $MERIDIAN_REGION $MERIDIAN_LAB_NODE $MERIDIAN_LAB_RANK "
                  "$MERIDIAN_LAB_ADDR_WAN_A $MERIDIAN_PATHS'"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("west west-2 3 198.18.0.4 198.18.0.4,198.18.1.4"), std::string::npos) << r.output;
  // The node's own interfaces, and nothing of the host's.
  r = sh(lab("run east-1 -- ip -o -4 addr show"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("198.18.0.1/24"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("198.18.1.1/24"), std::string::npos) << r.output;

  r = sh(lab("exec-all -- sh -c 'echo rank=$MERIDIAN_RANK of $MERIDIAN_WORLD_SIZE; exit $MERIDIAN_RANK'"));
  EXPECT_EQ(r.code, 3) << "the worst exit code: " << r.output;
  for (const char* line : {"[east-1] rank=0 of 4", "[west-2] rank=3 of 4"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

// kill, drain and restart under exec-all: the killed rank's exit is no failure, restart
// starts it again as a joiner (MERIDIAN_JOIN=on, its own rank), a drained rank gets SIGTERM
// and is not started again, and `status` marks the nodes down. Rank 0 ends the job once
// the joiner has come; isolate/reconnect cut and restore every plane of a region.
TEST_F(LabFixture, KillDrainAndRestartNodesUnderExecAll) {
  REQUIRE_LAB();
  bringUp();
  const std::string dir = ::testing::TempDir() + "/lab-nodes-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/rank.sh";
  std::ofstream(script) << "if [ \"${MERIDIAN_JOIN:-off}\" = on ]; then echo $MERIDIAN_RANK > " << dir
                        << "/rejoined; exit 0; fi\n"
                           "case $MERIDIAN_RANK in\n"
                           "  0) i=0; while [ ! -e " << dir << "/rejoined ] && [ $i -lt 6000 ]; do sleep 0.01; "
                           "i=$((i+1)); done; [ -e " << dir << "/rejoined ] ;;\n"
                           "  2) trap 'echo drained; exit 0' TERM; touch " << dir << "/ready2; sleep 600 & wait ;;\n"
                           "  3) touch " << dir << "/ready3; exec sleep 600 ;;\n"
                           "esac\n";
  std::thread job([&] { sh(fmt::format("{} > {}/out 2>&1; echo $? > {}/rc", lab("exec-all -- sh " + script), dir, dir)); });
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  const bool ready = pollUntil([&] { return std::filesystem::exists(dir + "/ready2") && std::filesystem::exists(dir + "/ready3"); },
                               deadline, std::chrono::milliseconds(10));
  auto notDown = sh(lab("restart east-1"));
  auto kill = sh(lab("kill west-2"));
  auto drain = sh(lab("drain west-1"));
  auto status = sh(lab("status"));
  auto restart = sh(lab("restart west-2"));
  const bool done = pollUntil([&] { return std::filesystem::exists(dir + "/rc"); }, deadline, std::chrono::milliseconds(20));
  if (!done) sh(lab("kill east-1"));  // ends the job: rank 0 is the one still waiting
  job.join();
  std::ifstream outFile(dir + "/out"), rcFile(dir + "/rc"), joinedFile(dir + "/rejoined");
  const std::string out((std::istreambuf_iterator<char>(outFile)), std::istreambuf_iterator<char>());
  int rc = -1;
  rcFile >> rc;
  std::string joined;
  joinedFile >> joined;
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(ready) << out;
  ASSERT_TRUE(done) << "the restarted rank never came back:\n" << out;
  EXPECT_EQ(rc, 0) << "a rank taken down on purpose counted as a failure:\n" << out;
  EXPECT_EQ(joined, "3");
  EXPECT_NE(out.find("[west-1] drained"), std::string::npos) << out;
  EXPECT_EQ(notDown.code, 1);
  EXPECT_NE(notDown.output.find("node east-1 is not down"), std::string::npos) << notDown.output;
  EXPECT_EQ(kill.code, 0) << kill.output;
  EXPECT_NE(kill.output.find("west-2: SIGKILL sent to 1 process"), std::string::npos) << kill.output;
  EXPECT_NE(drain.output.find("west-1: SIGTERM sent to"), std::string::npos) << drain.output;
  EXPECT_NE(status.output.find("west-2 (down)"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find("west-1 (down)"), std::string::npos) << status.output;
  EXPECT_EQ(status.output.find("east-1 (down)"), std::string::npos) << status.output;
  EXPECT_EQ(restart.code, 0) << restart.output;

  auto unknown = sh(lab("kill paris-1"));
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.output.find("unknown node 'paris-1'"), std::string::npos) << unknown.output;
  auto isolate = sh(lab("isolate west"));
  EXPECT_EQ(isolate.code, 0) << isolate.output;
  status = sh(lab("status"));
  EXPECT_NE(status.output.find("CUT"), std::string::npos) << status.output;
  auto reconnect = sh(lab("reconnect west"));
  EXPECT_EQ(reconnect.code, 0) << reconnect.output;
  status = sh(lab("status"));
  EXPECT_EQ(status.output.find("CUT"), std::string::npos) << status.output;
  auto mars = sh(lab("isolate mars"));
  EXPECT_EQ(mars.code, 1);
  EXPECT_NE(mars.output.find("mars"), std::string::npos) << mars.output;
}

TEST(LabChecksTest, MissingTunAndMissingRootAreOneLineErrors) {
  Status tun = requireTun("/nonexistent/net/tun");
  ASSERT_FALSE(tun.isOk());
  EXPECT_EQ(tun.message().find('\n'), std::string::npos);
  EXPECT_NE(tun.message().find("/nonexistent/net/tun is missing"), std::string::npos) << tun.message();
  if (::geteuid() != 0) {
    EXPECT_NE(requireRoot().message().find("needs root"), std::string::npos);
    return;
  }
  // As root, drop to nobody for one command.
  if (sh("command -v setpriv").code != 0) GTEST_SKIP() << "setpriv (util-linux) is missing: cannot run as a non-root user";
  auto r = sh(fmt::format("setpriv --reuid=65534 --regid=65534 --clear-groups {} up {}", MERIDIAN_LAB_BIN, kTopology));
  if (r.output.find("ermission denied") != std::string::npos) GTEST_SKIP() << "nobody cannot run the binary here";
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("meridian-lab needs root"), std::string::npos) << r.output;
}

TEST_F(LabFixture, ClearErrorsAndNothingHalfBuilt) {
  REQUIRE_LAB();
  auto r = sh(lab("up /nonexistent.yaml"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("/nonexistent.yaml"), std::string::npos) << r.output;
  EXPECT_FALSE(namespaceExists(std::string(kLab) + "-east-1"));

  const std::string bad = ::testing::TempDir() + "/bad-topology.yaml";
  std::ofstream(bad) << "name: bad\nregions:\n  - {name: east, nodes: 1}\nplanes:\n  - name: wan-a\n    links: []\n";
  r = sh(lab("up " + bad));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find(bad + ":"), std::string::npos) << "names file and line: " << r.output;
  EXPECT_FALSE(std::filesystem::exists(std::string(kStateRoot) + "/" + kLab));

  bringUp();
  r = sh(lab("run paris-1 -- true"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("unknown node 'paris-1'"), std::string::npos) << r.output;
  r = sh(lab("set wan-a east mars --delay 1ms"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("mars"), std::string::npos) << r.output;
  r = sh(lab("set wan-a east west --delay fast"));
  EXPECT_EQ(r.code, 1);
  r = sh(lab("up " + kTopology));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("already up"), std::string::npos) << r.output;
}

TEST_F(LabFixture, DownLeavesNothingBehindEvenAfterACrash) {
  REQUIRE_LAB();
  bringUp();
  const int emulator = state_.emulatorPid;
  ASSERT_GT(emulator, 0);
  // A process left running inside a node is stopped by down, too.
  auto r = sh(lab("run east-1 -- sh -c 'sleep 300 >/dev/null 2>&1 & echo $!'"));
  ASSERT_EQ(r.code, 0) << r.output;
  const int sleeper = std::atoi(r.output.c_str());
  ASSERT_GT(sleeper, 0) << r.output;

  // The emulator dies hard; `up` again cleans up after it and builds a fresh lab.
  ASSERT_EQ(::kill(emulator, SIGKILL), 0);
  ASSERT_TRUE(pollUntil([&] { return meridian::testing::processEnded(emulator); }, std::chrono::seconds(10)))
      << "the emulator outlived SIGKILL";
  r = sh(lab("up " + kTopology));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("left behind"), std::string::npos) << r.output;
  auto again = loadLab(kLab);
  ASSERT_TRUE(again.isOk());
  const int emulator2 = again->emulatorPid;

  r = sh(lab("down"));
  ASSERT_EQ(r.code, 0) << r.output;
  up_ = false;
  for (const auto& n : state_.topology.nodes) {
    EXPECT_FALSE(namespaceExists(std::string(kLab) + "-" + n.name)) << n.name;
  }
  EXPECT_FALSE(std::filesystem::exists(std::string(kStateRoot) + "/" + kLab));
  EXPECT_NE(::kill(emulator2, 0), 0) << "emulator still running";
  EXPECT_NE(::kill(sleeper, 0), 0) << "a process started in the lab survived down (pid " << sleeper << ")";
  // The TUN interfaces went with the namespaces: none is left in this one.
  auto links = sh("ip -o link show type tun");
  EXPECT_EQ(links.output.find("wan-"), std::string::npos) << links.output;
}

}  // namespace
}  // namespace meridian::lab
