// meridian-nccl-check: drives an NCCL net plugin's function table as NCCL does (the
// conformance harness, nccl_plugin/conformance.h), between two processes or two hosts,
// without NCCL or a GPU. The listener writes its connection handle to a file the connector
// reads (any shared file system, or copy it over); start the listener first:
//
//   meridian-nccl-check --listen  --handle-file /tmp/h      # receives
//   meridian-nccl-check --connect --handle-file /tmp/h      # sends
//   meridian-nccl-check --both                              # both ends in this process
//
// --plugin picks the library (default libnccl-net-meridian.so, found as NCCL finds it:
// LD_LIBRARY_PATH). Exit code 0 when every transfer arrived intact and every check passed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/file_util.h"
#include "core/knobs.h"
#include "nccl_plugin/conformance.h"

namespace {

using meridian::plugin::conformance::Plugin;
namespace conformance = meridian::plugin::conformance;

std::string writeHandle(const std::string& path, const std::vector<std::uint8_t>& handle) {
  meridian::Status st = meridian::writeFileAtomically(path, std::string_view(reinterpret_cast<const char*>(handle.data()), handle.size()));
  return st.isOk() ? "" : st.message();
}

std::string readHandle(const std::string& path, double timeoutSec, std::vector<std::uint8_t>* handle) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return "no handle appeared at " + path;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream f(path, std::ios::binary);
  handle->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (handle->size() != kNcclNetHandleMaxBytes) {
    return fmt::format("{} holds {} bytes, not a {}-byte handle", path, handle->size(), kNcclNetHandleMaxBytes);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Drive an NCCL net plugin as NCCL does, without NCCL (conformance and throughput)"};
  bool listen = false, connect = false, both = false, properties = false;
  std::string handleFile, plugin = "libnccl-net-meridian.so";
  int repeats = 1;
  double timeout = 60;
  std::string benchSize;
  int benchIters = 64, benchInflight = 4;
  auto* l = app.add_flag("--listen", listen, "Listen, accept and receive");
  auto* c = app.add_flag("--connect", connect, "Connect and send");
  auto* b = app.add_flag("--both", both, "Both ends in this process, alternating on one thread");
  auto* pr = app.add_flag("--properties", properties, "Print every device's properties as NCCL reads them, and exit");
  l->excludes(c)->excludes(b)->excludes(pr);
  c->excludes(b)->excludes(pr);
  b->excludes(pr);
  app.add_option("--handle-file", handleFile, "Where the listener writes its handle and the connector reads it");
  app.add_option("--plugin", plugin, "The plugin library (a file name searched like NCCL does, or a path)");
  app.add_option("--repeat", repeats, "Run the transfer plan this many times")->check(CLI::Range(1, 100000));
  app.add_option("--bench", benchSize, "Instead of the checks: stream messages of this size one way (e.g. 4M) and print MiB/s");
  app.add_option("--iters", benchIters, "--bench: messages to stream")->check(CLI::Range(1, 1000000));
  app.add_option("--inflight", benchInflight, "--bench: messages in flight")->check(CLI::Range(1, 32));
  app.add_option("--timeout", timeout, "Seconds the connector waits for the handle file")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!listen && !connect && !both && !properties) {
    std::fprintf(stderr, "meridian-nccl-check: say --listen, --connect, --both or --properties\n");
    return 2;
  }
  if ((listen || connect) && handleFile.empty()) {
    std::fprintf(stderr, "meridian-nccl-check: --listen and --connect need --handle-file\n");
    return 2;
  }
  Plugin p;
  std::string error = conformance::load(plugin, &p);
  if (properties) {
    if (error.empty()) error = conformance::printProperties(p);
    if (!error.empty()) std::fprintf(stderr, "meridian-nccl-check: FAILED: %s\n", error.c_str());
    return error.empty() ? 0 : 1;
  }
  void *sendComm = nullptr, *recvComm = nullptr, *listenComm = nullptr;
  std::vector<std::uint8_t> handle;
  if (error.empty() && (listen || both)) error = conformance::listen(p, &handle, &listenComm);
  if (error.empty() && listen) {
    // Stale files of an earlier run would hand the connector an old handle or end the
    // barrier early: the listener, which starts first, clears them.
    for (const char* suffix : {"", ".sender-done", ".receiver-done"}) std::filesystem::remove(handleFile + suffix);
    error = writeHandle(handleFile, handle);
    if (error.empty()) error = conformance::acceptAll(p, listenComm, &recvComm);
  } else if (error.empty() && connect) {
    error = readHandle(handleFile, timeout, &handle);
    if (error.empty()) error = conformance::connectAll(p, handle, &sendComm);
  } else if (error.empty() && both) {
    error = conformance::connectAndAccept(p, listenComm, handle, &sendComm, &recvComm);
  }
  if (!benchSize.empty()) {
    std::size_t size = 0;
    try {
      size = static_cast<std::size_t>(meridian::parseByteSize(benchSize, "--bench"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meridian-nccl-check: %s\n", e.what());
      return 2;
    }
    double secs = 0;
    if (error.empty()) error = conformance::stream(p, sendComm, recvComm, size, benchIters, benchInflight, &secs);
    if (!error.empty()) {
      std::fprintf(stderr, "meridian-nccl-check: FAILED: %s\n", error.c_str());
      return 1;
    }
    const double mib = static_cast<double>(size) * benchIters / (1 << 20);
    std::printf("meridian-nccl-check: %s streamed %d x %zu bytes (%d in flight) in %.3f s: %.1f MiB/s\n",
                listen ? "receiver" : connect ? "sender" : "both ends", benchIters, size, benchInflight, secs, mib / secs);
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  std::size_t bytes = 0;
  // Two processes close only when both are done (as NCCL does after a bootstrap barrier):
  // each leaves a file next to the handle and waits for the other's.
  auto barrier = [&]() -> std::string {
    if (both) return "";
    const std::string mine = handleFile + (listen ? ".receiver-done" : ".sender-done");
    const std::string theirs = handleFile + (listen ? ".sender-done" : ".receiver-done");
    std::ofstream(mine).put('1');
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    while (!std::filesystem::exists(theirs)) {
      if (std::chrono::steady_clock::now() > deadline) return "the other side never finished (" + theirs + ")";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  };
  if (error.empty()) error = conformance::runPlan(p, sendComm, recvComm, repeats, &bytes, barrier);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (listenComm != nullptr) (void)p.net->closeListen(listenComm);
  if (!error.empty()) {
    std::fprintf(stderr, "meridian-nccl-check: FAILED: %s\n", error.c_str());
    return 1;
  }
  std::printf("meridian-nccl-check: %s passed: %d round(s) of %zu messages, %.1f MiB in %.2f s (%.1f MiB/s), "
              "grouped receives, a too-large send, close with requests in flight\n",
              listen ? "receiver" : connect ? "sender" : "both ends", repeats, conformance::planSizes().size(),
              static_cast<double>(bytes) / (1 << 20), secs, static_cast<double>(bytes) / (1 << 20) / secs);
  return 0;
}
