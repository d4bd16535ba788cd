// libnccl-net-meridian.so as NCCL sees it: loaded by file name, only the plugin tables
// exported, fields sane, and the conformance harness (tests/nccl_plugin/conformance.h) in
// one process (connect and accept alternated on one thread) and between two processes
// (meridian-nccl-check).
// ctest sets LD_LIBRARY_PATH to the library's folder, two loopback paths and a job secret.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "nccl_plugin/conformance.h"
#include "nccl_plugin/plugin_core.h"
#include "tests/common/poll.h"
#include "transport/tcp/endpoint.h"

namespace meridian::plugin {
namespace {

constexpr const char* kSoName = "libnccl-net-meridian.so";

std::string run(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), f) != nullptr) out += buf.data();
  ::pclose(f);
  return out;
}

TEST(NcclPluginTest, ExportsThePluginTablesAndNothingElse) {
  const std::string out = run(std::string("nm -D --defined-only ") + MERIDIAN_PLUGIN_FILE);
  ASSERT_FALSE(out.empty()) << "nm printed nothing for " << MERIDIAN_PLUGIN_FILE;
  std::set<std::string> names;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string a, b, c;
    fields >> a >> b >> c;
    names.insert(c.empty() ? b : c);
  }
  EXPECT_EQ(names, (std::set<std::string>{"ncclNetPlugin_v8", "ncclNetPlugin_v9", "ncclNetPlugin_v10",
                                          "ncclNetPlugin_v11"}))
      << out;
}

TEST(NcclPluginTest, LoadsByNameWithSaneTablesAndProperties) {
  void* lib = ::dlopen(kSoName, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << ::dlerror() << " (is LD_LIBRARY_PATH set as ctest sets it?)";
  for (const char* sym : {"ncclNetPlugin_v11", "ncclNetPlugin_v10", "ncclNetPlugin_v9", "ncclNetPlugin_v8"}) {
    const auto* table = static_cast<const char* const*>(::dlsym(lib, sym));
    ASSERT_NE(table, nullptr) << sym;
    EXPECT_STREQ(table[0], "Meridian") << sym;  // the first field of every version is the name
  }
  const auto* v11 = static_cast<const MerNcclNet_v11*>(::dlsym(lib, "ncclNetPlugin_v11"));
  // Every function of the v11 table is there (the name is the first of 22 pointers).
  const auto* slots = reinterpret_cast<void* const*>(v11);
  for (std::size_t i = 1; i < sizeof(MerNcclNet_v11) / sizeof(void*); ++i) EXPECT_NE(slots[i], nullptr) << "slot " << i;
  const auto* v8 = static_cast<const MerNcclNet_v8*>(::dlsym(lib, "ncclNetPlugin_v8"));

  void* ctx = nullptr;
  MerNcclNetCommConfig config{-1};
  ASSERT_EQ(v11->init(&ctx, 1, &config, nullptr, nullptr), kNcclSuccess);
  EXPECT_NE(ctx, nullptr);
  int n = 0;
  ASSERT_EQ(v11->devices(&n), kNcclSuccess);
  EXPECT_EQ(n, 1) << "one virtual device spans every path by default";
  MerNcclProps_v11 p{};
  ASSERT_EQ(v11->getProperties(0, &p), kNcclSuccess);
  EXPECT_STREQ(p.name, "meridian0");
  ASSERT_NE(p.pciPath, nullptr);
  EXPECT_EQ(std::string(p.pciPath).rfind("/sys/", 0), 0u) << p.pciPath;
  EXPECT_EQ(p.ptrSupport, kNcclPtrHost);
  EXPECT_GT(p.speed, 0);
  EXPECT_GE(p.latency, 0.0f);
  EXPECT_EQ(p.maxRecvs, kMaxRecvs);
  EXPECT_EQ(p.netDeviceType, kNcclNetDeviceHost);
  EXPECT_EQ(p.vProps.ndevs, 1);
  EXPECT_GT(p.maxP2pBytes, std::size_t{64} << 20);
  // The v8 view of the same device: its shorter layout, same figures.
  MerNcclProps_v8 p8{};
  ASSERT_EQ(v8->getProperties(0, &p8), kNcclSuccess);
  EXPECT_STREQ(p8.name, p.name);
  EXPECT_EQ(p8.speed, p.speed);
  EXPECT_EQ(p8.maxRecvs, p.maxRecvs);
  EXPECT_EQ(v11->finalize(ctx), kNcclSuccess);
}

TEST(NcclPluginTest, ConformanceInOneProcessAlternatingOnOneThread) {
  conformance::Plugin p;
  ASSERT_EQ(conformance::load(kSoName, &p), "");
  std::vector<std::uint8_t> handle;
  void* listenComm = nullptr;
  ASSERT_EQ(conformance::listen(p, &handle, &listenComm), "");
  void *sendComm = nullptr, *recvComm = nullptr;
  ASSERT_EQ(conformance::connectAndAccept(p, listenComm, handle, &sendComm, &recvComm), "");
  EXPECT_EQ(conformance::runPlan(p, sendComm, recvComm), "");
  EXPECT_EQ(p.net->closeListen(listenComm), kNcclSuccess);
}

// Two fresh processes (meridian-nccl-check, as a user runs it between two hosts): each loads
// its own copy of the plugin, the listener hands its handle over through a file. `env`
// goes before both commands (knobs); both outputs come back.
void runConformanceBetweenTwoProcesses(const std::string& env, std::string* listenOut, std::string* connectOut) {
  // Named for this process: a run of the same test beside it (another checkout on the same
  // machine) must not hand its handle or its done-files to this one.
  const std::string handle = fmt::format("{}/nccl-check-handle-{}", ::testing::TempDir(), ::getpid());
  auto removeFiles = [&] {
    for (const char* suffix : {"", ".sender-done", ".receiver-done"}) std::filesystem::remove(handle + suffix);
  };
  // An earlier run's files would hand the connector an old handle: gone before the listener
  // starts, so the handle that appears is this listener's.
  removeFiles();
  std::atomic<bool> listenerDone{false};
  std::thread listener([&] {
    *listenOut = run(fmt::format("{} {} --listen --handle-file {} 2>&1; echo exit=$?", env, MERIDIAN_CHECK_BIN, handle));
    listenerDone = true;
  });
  // The listener writes its handle atomically once it listens (or fails and exits).
  const bool handed = meridian::testing::pollUntil(
      [&] { return std::filesystem::exists(handle) || listenerDone.load(); }, std::chrono::seconds(60));
  if (handed && std::filesystem::exists(handle)) {
    *connectOut = run(fmt::format("{} {} --connect --handle-file {} 2>&1; echo exit=$?", env, MERIDIAN_CHECK_BIN, handle));
  }
  listener.join();
  removeFiles();
  ASSERT_TRUE(handed) << "no handle at " << handle << " after 60 s";
  EXPECT_NE(listenOut->find("receiver passed"), std::string::npos) << *listenOut;
  EXPECT_NE(listenOut->find("exit=0"), std::string::npos) << *listenOut;
  EXPECT_NE(connectOut->find("sender passed"), std::string::npos) << *connectOut;
  EXPECT_NE(connectOut->find("exit=0"), std::string::npos) << *connectOut;
}

TEST(NcclPluginTest, ConformanceBetweenTwoProcesses) {
  std::string listenOut, connectOut;
  runConformanceBetweenTwoProcesses("", &listenOut, &connectOut);
}

// The same with a fabric path beside the TCP path of every connection (libfabric's real
// providers): both sides say their rail opened and the fabric path came up.
void runConformanceWithFabric(const char* provider) {
  std::string listenOut, connectOut;
  runConformanceBetweenTwoProcesses(
      fmt::format("env NCCL_DEBUG=INFO MERIDIAN_LOG=info:transport MERIDIAN_FABRIC=on 'MERIDIAN_FABRIC_PROVIDER={}'", provider),
      &listenOut, &connectOut);
  for (const std::string* out : {&listenOut, &connectOut}) {
    EXPECT_NE(out->find(fmt::format("fabric rail {}", provider)), std::string::npos) << *out;
    EXPECT_NE(out->find("rail 0 (" + std::string(provider) + ")) to rank"), std::string::npos)
        << "no fabric path came up:\n" << *out;
  }
}
TEST(NcclPluginTest, ConformanceBetweenTwoProcessesWithFabricPathsOnTcpOfiRxm) { runConformanceWithFabric("tcp;ofi_rxm"); }
TEST(NcclPluginTest, ConformanceBetweenTwoProcessesWithFabricPathsOnShm) { runConformanceWithFabric("shm"); }

TEST(NcclPluginTest, BadUseReturnsTheDocumentedErrors) {
  conformance::Plugin p;
  ASSERT_EQ(conformance::load(kSoName, &p), "");
  const MerNcclNet_v11* net = p.net;
  std::vector<std::uint8_t> zeros(kNcclNetHandleMaxBytes, 0);
  void* comm = nullptr;
  EXPECT_EQ(net->connect(p.ctx, 0, zeros.data(), &comm, nullptr), kNcclInvalidArgument) << "a handle that is not ours";
  EXPECT_EQ(comm, nullptr);
  std::vector<std::uint8_t> handle;
  void* listenComm = nullptr;
  ASSERT_EQ(conformance::listen(p, &handle, &listenComm), "");
  EXPECT_EQ(net->connect(p.ctx, 7, handle.data(), &comm, nullptr), kNcclInvalidArgument) << "no device 7";
  int bogus = 0;
  EXPECT_EQ(net->accept(&bogus, &comm, nullptr), kNcclInvalidArgument);
  EXPECT_EQ(net->isend(&bogus, &bogus, 4, 0, nullptr, nullptr, &comm), kNcclInvalidArgument);
  int done = 0;
  EXPECT_EQ(net->test(&bogus, &done, nullptr), kNcclInvalidArgument);
  MerNcclProps_v11 props{};
  EXPECT_EQ(net->getProperties(3, &props), kNcclInvalidArgument);
  EXPECT_EQ(net->devices(nullptr), kNcclInvalidArgument);
  void *sendComm = nullptr, *recvComm = nullptr;
  ASSERT_EQ(conformance::connectAndAccept(p, listenComm, handle, &sendComm, &recvComm), "");
  void* mh = nullptr;
  EXPECT_EQ(net->regMr(sendComm, &bogus, 4, kNcclPtrCuda, &mh), kNcclInvalidArgument) << "host memory only";
  EXPECT_EQ(net->regMrDmaBuf(sendComm, &bogus, 4, kNcclPtrDmabuf, 0, -1, &mh), kNcclInvalidArgument);
  std::array<void*, 9> data{};
  std::array<std::size_t, 9> sizes{};
  std::array<int, 9> tags{};
  void* req = nullptr;
  EXPECT_EQ(net->irecv(recvComm, 9, data.data(), sizes.data(), tags.data(), nullptr, nullptr, &req),
            kNcclInvalidArgument)
      << "more buffers than maxRecvs";
  EXPECT_EQ(net->closeSend(sendComm), kNcclSuccess);
  EXPECT_EQ(net->closeSend(sendComm), kNcclInvalidArgument) << "closed twice";
  EXPECT_EQ(net->closeRecv(recvComm), kNcclSuccess);
  EXPECT_EQ(net->closeListen(listenComm), kNcclSuccess);
  EXPECT_EQ(net->closeListen(listenComm), kNcclInvalidArgument);
}

// A meridian-probe --json report: london, virginia, singapore; two planes.
constexpr const char* kReport = R"({
  "regions": ["london", "virginia", "singapore"], "regions_inferred": false,
  "planes": [
    {"index": 0, "min_rtt_ms": [0.3, 76.0, 170.0,  76.5, 0.2, 214.0,  170.5, 214.5, 0.3]},
    {"index": 1, "min_rtt_ms": [0.3, 80.0, 160.0,  80.5, 0.2, null,   160.5, null,  0.3]}
  ]})";

TEST(NcclPluginLinksTest, LatencyIsHalfTheRoundTripToTheFarthestRegionOnTheBestPlane) {
  auto both = latencyFromProbeReport(kReport, "london", {0, 1});
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  EXPECT_DOUBLE_EQ(both->oneWayUs, 80'000) << "singapore over plane 1 (160 ms), the better of 170 and 160";
  EXPECT_EQ(both->toRegion, "singapore");
  auto plane0 = latencyFromProbeReport(kReport, "london", {0});
  ASSERT_TRUE(plane0.isOk());
  EXPECT_DOUBLE_EQ(plane0->oneWayUs, 85'000);
  auto virginia = latencyFromProbeReport(kReport, "virginia", {1});
  ASSERT_TRUE(virginia.isOk()) << "a null cell (no round trip to singapore on plane 1) is skipped";
  EXPECT_DOUBLE_EQ(virginia->oneWayUs, 40'250);
  EXPECT_EQ(virginia->toRegion, "london");
  auto alone = latencyFromProbeReport(R"({"regions": ["lab"], "planes": [{"index": 0, "min_rtt_ms": [0.4]}]})", "lab", {0});
  ASSERT_TRUE(alone.isOk()) << "one region: the round trips inside it";
  EXPECT_DOUBLE_EQ(alone->oneWayUs, 200);
}

// The same report after meridian-probe --rate-seconds: bulk rates in Mbit/s per plane.
constexpr const char* kRatedReport = R"({
  "regions": ["london", "virginia", "singapore"], "regions_inferred": false,
  "planes": [
    {"index": 0, "min_rtt_ms": [0.3, 76.0, 170.0,  76.5, 0.2, 214.0,  170.5, 214.5, 0.3],
                 "rate_mbps": [900, 40, 20,  40, 900, 10,  20, 10, 900]},
    {"index": 1, "min_rtt_ms": [0.3, 80.0, 160.0,  80.5, 0.2, null,   160.5, null,  0.3],
                 "rate_mbps": [900, 30, null,  30, 900, null,  null, null, 900]}
  ]})";

TEST(NcclPluginLinksTest, SpeedIsTheSlowestRateToAnotherRegionSummedOverThePlanes) {
  auto both = speedFromProbeReport(kRatedReport, "london", {0, 1});
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  ASSERT_TRUE(both->has_value());
  EXPECT_DOUBLE_EQ((*both)->mbps, 50) << "20 to singapore on plane 0, 30 to virginia on plane 1 (no rate to singapore)";
  EXPECT_EQ((*both)->toRegion, "singapore");
  auto plane1 = speedFromProbeReport(kRatedReport, "virginia", {1});
  ASSERT_TRUE(plane1.isOk() && plane1->has_value());
  EXPECT_DOUBLE_EQ((*plane1)->mbps, 30);
  auto alone = speedFromProbeReport(R"({"regions": ["lab"], "planes": [{"index": 0, "min_rtt_ms": [0.4], "rate_mbps": [800]}]})",
                                    "lab", {0});
  ASSERT_TRUE(alone.isOk() && alone->has_value()) << "one region: the rate inside it";
  EXPECT_DOUBLE_EQ((*alone)->mbps, 800);
  auto unrated = speedFromProbeReport(kReport, "london", {0, 1});
  ASSERT_TRUE(unrated.isOk()) << unrated.status().toString();
  EXPECT_FALSE(unrated->has_value()) << "a report without rates leaves the kernel's figure";
  auto bad = speedFromProbeReport(
      R"({"regions": ["a", "b"], "planes": [{"index": 0, "rate_mbps": [null, null, null, 1]}, {"index": 1, "rate_mbps": [1, 5, 5, 1]}]})",
      "a", {0, 1});
  ASSERT_FALSE(bad.isOk()) << "plane 0 has no rate from a: the sum would be a guess";
  EXPECT_NE(bad.status().message().find("no rate from region 'a' on plane(s) 0"), std::string::npos) << bad.status().toString();
  auto negative = speedFromProbeReport(R"({"regions": ["a", "b"], "planes": [{"index": 0, "rate_mbps": [1, -5, 5, 1]}]})", "a", {0});
  ASSERT_FALSE(negative.isOk());
  EXPECT_NE(negative.status().message().find("rate_mbps value that is not a non-negative number"), std::string::npos)
      << negative.status().toString();
  auto shortMatrix = speedFromProbeReport(R"({"regions": ["a", "b"], "planes": [{"index": 0, "rate_mbps": [1, 5]}]})", "a", {0});
  ASSERT_FALSE(shortMatrix.isOk());
  EXPECT_NE(shortMatrix.status().message().find("rate_mbps holds 2 values, not 2 x 2"), std::string::npos);
}

TEST(NcclPluginLinksTest, RefusesReportsItCannotUseWithAClearReason) {
  auto expectRefused = [](std::string_view json, const std::string& region, std::vector<int> planes, const char* says) {
    auto got = latencyFromProbeReport(json, region, planes);
    ASSERT_FALSE(got.isOk()) << json;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status().toString();
  };
  expectRefused("{not json", "london", {0}, "not a JSON object");
  expectRefused("[1, 2]", "london", {0}, "not a JSON object");
  expectRefused(R"({"regions": "london"})", "london", {0}, "arrays");
  expectRefused(kReport, "tokyo", {0}, "region 'tokyo' is not in the report (it has: london, virginia, singapore)");
  expectRefused(R"({"regions": ["a", "b"], "planes": [{"index": 0, "min_rtt_ms": [1, 2, 3]}]})", "a", {0}, "3 values, not 2 x 2");
  expectRefused(R"({"regions": ["a", "b"], "planes": [{"index": 0, "min_rtt_ms": [null, -4, 1, null]}]})", "a", {0},
                "non-negative");
  expectRefused(R"({"regions": ["a", "b"], "planes": [{"index": 0, "min_rtt_ms": [null, null, 1, null]}]})", "a", {0},
                "no round trip from region 'a'");
  expectRefused(kReport, "london", {5}, "no round trip");
  expectRefused(R"({"regions": ["a"], "planes": [{"min_rtt_ms": [1]}]})", "a", {0}, "integer \"index\"");
}

// What NCCL reads at init (meridian-nccl-check --properties, a fresh process per setting).
TEST(NcclPluginTest, DevicesReportTheLatencyOfTheLinksFile) {
  const std::string file = ::testing::TempDir() + "/nccl-links.json";
  {
    std::ofstream(file) << kReport;
  }
  const std::string check = fmt::format("{} --properties 2>&1; echo exit=$?", MERIDIAN_CHECK_BIN);
  std::string out = run("MERIDIAN_NCCL_LINKS=" + file + " MERIDIAN_REGION=london " + check);
  EXPECT_NE(out.find("latency 80000.0 us"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
  out = run("MERIDIAN_NCCL_LINKS=" + file + " MERIDIAN_NCCL_DEVICES=paths MERIDIAN_REGION=london " + check);
  EXPECT_NE(out.find("device 0: name meridian0, speed"), std::string::npos) << out;
  EXPECT_NE(out.find("latency 85000.0 us"), std::string::npos) << "device 0 is plane 0 alone\n" << out;
  EXPECT_NE(out.find("latency 80000.0 us"), std::string::npos) << "device 1 is plane 1 alone\n" << out;
  EXPECT_EQ(out.find("speed 20 Mbit/s"), std::string::npos) << "a report without rates leaves the kernel's speed\n" << out;
  const std::string rated = ::testing::TempDir() + "/nccl-links-rated.json";
  {
    std::ofstream(rated) << kRatedReport;
  }
  out = run("MERIDIAN_NCCL_LINKS=" + rated + " MERIDIAN_REGION=london " + check);
  EXPECT_NE(out.find("name meridian0, speed 50 Mbit/s, latency 80000.0 us"), std::string::npos) << out;
  out = run("MERIDIAN_NCCL_LINKS=" + rated + " MERIDIAN_NCCL_DEVICES=paths MERIDIAN_REGION=london " + check);
  EXPECT_NE(out.find("name meridian0, speed 20 Mbit/s"), std::string::npos) << "device 0 is plane 0 alone\n" << out;
  EXPECT_NE(out.find("name meridian1, speed 30 Mbit/s"), std::string::npos) << "device 1 is plane 1 alone\n" << out;
  out = run(check);
  EXPECT_NE(out.find("latency 0.0 us"), std::string::npos) << "without a report the latency is unknown\n" << out;
  out = run("MERIDIAN_NCCL_LINKS=" + file + " MERIDIAN_REGION= " + check);
  EXPECT_NE(out.find("MERIDIAN_REGION is not"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
  out = run("MERIDIAN_NCCL_LINKS=" + file + ".missing MERIDIAN_REGION=london " + check);
  EXPECT_NE(out.find("nccl-links.json.missing"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
}

// A bad enumeration knob is refused at init with the message the communicator gives
// (core/knobs.h), never taken for some default.
TEST(NcclPluginTest, RefusesABadChoiceKnobWithTheCommunicatorsMessage) {
  const std::string check = fmt::format("{} --properties 2>&1; echo exit=$?", MERIDIAN_CHECK_BIN);
  std::string out = run("MERIDIAN_ROUTING=adaptve " + check);
  EXPECT_NE(out.find("MERIDIAN_ROUTING='adaptve': not one of adaptive, static"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
  out = run("MERIDIAN_NCCL_DEVICES=some " + check);
  EXPECT_NE(out.find("MERIDIAN_NCCL_DEVICES='some': not one of virtual, paths"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
  out = run("MERIDIAN_ROUTING=static " + check);
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
}

TEST(NcclPluginHandleTest, RoundTripsAndRefusesGarbage) {
  ConnectHandle h;
  h.listenId = 0x0123456789abcdefULL;
  h.endpoint = transport::tcp::encodeEndpoint({"198.18.0.1:4000", "198.18.1.1:4001"}).value();
  std::array<std::uint8_t, ConnectHandle::kBytes> buf{};
  ASSERT_TRUE(encodeHandle(h, buf).isOk());
  auto back = decodeHandle(buf);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->listenId, h.listenId);
  EXPECT_EQ(back->endpoint, h.endpoint);
  EXPECT_EQ(transport::tcp::decodeEndpoint(back->endpoint).value(),
            (std::vector<std::string>{"198.18.0.1:4000", "198.18.1.1:4001"}));
  EXPECT_EQ(back->pending, 0u);
  setHandlePending(buf, 77);
  EXPECT_EQ(decodeHandle(buf)->pending, 77u);
  auto bad = buf;
  bad[0] ^= 1;
  EXPECT_EQ(decodeHandle(bad).status().code(), StatusCode::kInvalidArgument) << "magic";
  bad = buf;
  bad[5] = ConnectHandle::kMaxEndpointBytes + 1;
  EXPECT_EQ(decodeHandle(bad).status().code(), StatusCode::kInvalidArgument) << "endpoint length";
  bad[5] = 0;
  EXPECT_EQ(decodeHandle(bad).status().code(), StatusCode::kInvalidArgument) << "empty endpoint";
  ConnectHandle tooBig;
  tooBig.endpoint.assign(ConnectHandle::kMaxEndpointBytes + 1, 1);
  EXPECT_EQ(encodeHandle(tooBig, buf).code(), StatusCode::kInvalidArgument) << "an endpoint that does not fit";
}

TEST(TcpEndpointTest, RoundTripsAndRefusesGarbage) {
  const std::vector<std::string> addrs{"127.0.0.1:1", "198.18.0.1:65535"};
  auto name = transport::tcp::encodeEndpoint(addrs);
  ASSERT_TRUE(name.isOk()) << name.status().toString();
  EXPECT_EQ(name->size(), 2u + 6 * addrs.size());
  EXPECT_EQ(transport::tcp::decodeEndpoint(name.value()).value(), addrs);
  auto bad = name.value();
  bad[0] = 9;
  EXPECT_EQ(transport::tcp::decodeEndpoint(bad).status().code(), StatusCode::kInvalidArgument) << "version";
  bad = name.value();
  bad[1] = 3;
  EXPECT_EQ(transport::tcp::decodeEndpoint(bad).status().code(), StatusCode::kInvalidArgument) << "count vs length";
  bad = name.value();
  bad.pop_back();
  EXPECT_EQ(transport::tcp::decodeEndpoint(bad).status().code(), StatusCode::kInvalidArgument) << "truncated";
  bad = name.value();
  bad[2 + 4] = bad[2 + 5] = 0;
  EXPECT_EQ(transport::tcp::decodeEndpoint(bad).status().code(), StatusCode::kInvalidArgument) << "port 0";
  EXPECT_FALSE(transport::tcp::decodeEndpoint({}).isOk());
  EXPECT_FALSE(transport::tcp::encodeEndpoint({}).isOk());
  EXPECT_FALSE(transport::tcp::encodeEndpoint({"localhost:0"}).isOk());
  EXPECT_FALSE(transport::tcp::encodeEndpoint({"not-an-ip:80"}).isOk());
}

}  // namespace
}  // namespace meridian::plugin
