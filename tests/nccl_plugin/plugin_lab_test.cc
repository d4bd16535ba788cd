// The NCCL net plugin between two lab regions (label `lab`): meridian-nccl-check's listener on
// an east node and its connector on a west node, three rounds of the conformance plan, while
// wan-a between the regions first drops to 10 Mbit/s and is then cut entirely. Every transfer
// completes intact on what is left (the multipath channel inside the plugin's one device), and
// while wan-a is only slow the plugin's routing monitor sees the sender's streams resend on it
// (or its delivery rate fall far below its peak) and moves the traffic off it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "tests/common/lab_session.h"
#include "tests/common/poll.h"

namespace meridian::plugin {
namespace {

using meridian::testing::LabSession;
using meridian::testing::pollUntil;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(NcclPluginLabTest, TransfersSurviveAPathDegradedAndThenCutBetweenRegions) {
  if (auto why = meridian::testing::labUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string file = fmt::format("{}/lab/topologies/two-regions.yaml", MERIDIAN_SOURCE_DIR);
  LabSession session("mlplugin", file, "--time-scale 0.25");
  auto up = session.up();
  ASSERT_EQ(up.code, 0) << up.output;
  // What NCCL reads at init: the latency meridian-probe measured across the regions. wan-a
  // is 20 ms one way between east and west, a quarter of that here; wan-b is slower.
  const std::string links = ::testing::TempDir() + "/nccl-lab-links.json";
  std::filesystem::remove(links);
  auto probe = session.run(
      fmt::format("exec-all -- {} --duration 3 --every 3 --rate-seconds 1 --json {}", MERIDIAN_PROBE_BIN, links));
  ASSERT_EQ(probe.code, 0) << probe.output;
  auto props = session.run(fmt::format("run west-1 -- env LD_LIBRARY_PATH={} MERIDIAN_SECRET=nccl-lab MERIDIAN_NCCL_LINKS={} "
                                       "NCCL_DEBUG=INFO {} --properties",
                                       MERIDIAN_PLUGIN_DIR, links, MERIDIAN_CHECK_BIN));
  ASSERT_EQ(props.code, 0) << props.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(props.output, m, std::regex("latency ([0-9.]+) us, pciPath"))) << props.output;
  EXPECT_NEAR(std::stod(m[1]), 5000, 500) << props.output;
  EXPECT_NE(props.output.find(" us (measured), region west"), std::string::npos) << "NCCL's INFO line\n" << props.output;
  // ... and the speed it measured: both planes' 100 Mbit/s from west to east, summed (the
  // emulator and TCP take their share; a kernel figure would be 20000).
  ASSERT_TRUE(std::regex_search(props.output, m, std::regex("name meridian0, speed ([0-9]+) Mbit/s"))) << props.output;
  EXPECT_GT(std::stoi(m[1]), 100) << props.output << probe.output;
  EXPECT_LT(std::stoi(m[1]), 210) << props.output << probe.output;
  EXPECT_NE(props.output.find(" Mbit/s (measured), latency "), std::string::npos) << "NCCL's INFO line\n" << props.output;
  // Named for this process, so a run beside it (another checkout) cannot hand over its files.
  const std::string handle = fmt::format("{}/nccl-lab-handle-{}", ::testing::TempDir(), ::getpid());
  const std::string sendLog = handle + ".sender.log";
  auto removeFiles = [&] {
    for (const char* suffix : {"", ".sender-done", ".receiver-done", ".sender.log"}) std::filesystem::remove(handle + suffix);
  };
  // An earlier run's files would hand the connector an old handle: gone before the listener
  // starts, so the handle that appears is this listener's.
  removeFiles();
  const std::string env = fmt::format(
      "env LD_LIBRARY_PATH={} MERIDIAN_SECRET=nccl-lab MERIDIAN_PATH_STALL_MS=1000 NCCL_DEBUG=INFO "
      "MERIDIAN_LOG=info:plugin",
      MERIDIAN_PLUGIN_DIR);
  meridian::testing::CommandResult listener;
  std::atomic<bool> listenerDone{false}, senderDone{false};
  std::thread receiving([&] {
    listener = session.run(fmt::format("run east-1 -- {} {} --listen --handle-file {} --repeat 3", env,
                                       MERIDIAN_CHECK_BIN, handle));
    listenerDone = true;
  });
  // The listener writes its handle atomically once it listens (or fails and exits).
  EXPECT_TRUE(pollUntil([&] { return std::filesystem::exists(handle) || listenerDone.load(); }, seconds(60)))
      << "no handle at " << handle;
  // The sender's log goes to a file as it runs, so the test can see the monitor's verdict.
  meridian::testing::CommandResult sender;
  const double wanABytes = meridian::testing::linkFigure(session.name(), "wan-a", "west", "east", "bytes");
  std::thread sending([&] {
    sender = session.run(fmt::format("run west-1 -- sh -c '{} {} --connect --handle-file {} --repeat 3 >{} 2>&1'", env,
                                     MERIDIAN_CHECK_BIN, handle, sendLog));
    senderDone = true;
  });
  // Degrade wan-a once the transfers run on it: 4 MB through it from west to east.
  EXPECT_TRUE(pollUntil(
      [&] {
        return senderDone.load() ||
               meridian::testing::linkFigure(session.name(), "wan-a", "west", "east", "bytes") >= wanABytes + 4e6;
      },
      seconds(60), milliseconds(50)))
      << "no transfer on wan-a";
  auto degrade = session.run("set wan-a east west --rate 10Mbit");
  // Cut it once the sender's monitor has named it congested: that takes a few once-a-second
  // TCP_INFO readings showing the resends (the detector wants three in a row). The check of
  // the verdict itself is below.
  const std::regex congested(R"(: path 0 \(198\.18\.0\.[0-9]+:[0-9]+\) congested: (loss|delivery rate) )");
  pollUntil([&] { return senderDone.load() || std::regex_search(readFile(sendLog), congested); }, seconds(60),
            milliseconds(100));
  auto cut = session.run("cut wan-a east west");
  sending.join();
  receiving.join();
  sender.output += readFile(sendLog);
  removeFiles();
  EXPECT_EQ(degrade.code, 0) << degrade.output;
  EXPECT_EQ(cut.code, 0) << cut.output;
  EXPECT_EQ(sender.code, 0) << sender.output;
  EXPECT_EQ(listener.code, 0) << listener.output;
  EXPECT_NE(sender.output.find("sender passed"), std::string::npos) << sender.output;
  EXPECT_NE(listener.output.find("receiver passed"), std::string::npos) << listener.output;
  // wan-a is the sender's path 0 (MERIDIAN_PATHS lists the planes in order). The monitor
  // names it congested by whichever sign it reads first: the streams' resends (loss), or a
  // delivery rate far below the path's peak; CI runs have shown each.
  EXPECT_TRUE(std::regex_search(sender.output, congested)) << sender.output;
  if (auto at = sender.output.find(") congested: "); at != std::string::npos) {
    const auto begin = sender.output.rfind('\n', at) + 1;  // npos + 1 == 0: the first line
    std::printf("[ routing  ] %s\n", sender.output.substr(begin, sender.output.find('\n', at) - begin).c_str());
  }
  if (auto at = listener.output.find("meridian-nccl-check:"); at != std::string::npos) {
    std::printf("[ plugin   ] %s", listener.output.substr(at).c_str());
  }
}

}  // namespace
}  // namespace meridian::plugin
