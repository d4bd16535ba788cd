// meridian-transport-bench: one-way goodput of a multipath channel between two devices
// in one process over loopback (per path and aggregate), with K messages in flight.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/knobs.h"
#include "transport/tcp/tcp_device.h"

using namespace meridian;
using namespace meridian::transport;

int main(int argc, char** argv) {
  CLI::App app{"Multipath channel goodput over loopback"};
  int paths = 1, streams = 2, inflight = 4, iters = 64;
  std::string sizeText = "4M", chunkText = "512k";
  app.add_option("--paths", paths, "Loopback paths (127.0.0.1, .2, ...)");
  app.add_option("--streams", streams, "TCP streams per path");
  app.add_option("--size", sizeText, "Message size");
  app.add_option("--chunk", chunkText, "Chunk size");
  app.add_option("--inflight", inflight, "Messages in flight");
  app.add_option("--iters", iters, "Messages to send");
  CLI11_PARSE(app, argc, argv);
  std::size_t size = static_cast<std::size_t>(parseByteSize(sizeText, "--size"));
  tcp::DeviceOptions o;
  o.localAddresses.clear();
  for (int i = 0; i < paths; ++i) o.localAddresses.push_back("127.0.0." + std::to_string(i + 1));
  o.streamsPerPath = streams;
  o.chunkBytes = static_cast<std::size_t>(parseByteSize(chunkText, "--chunk"));
  o.secret = "transport-bench";
  o.name = "tx";
  auto a = tcp::TcpDevice::create(o).value();
  o.name = "rx";
  auto b = tcp::TcpDevice::create(o).value();
  auto deadline = Clock::now() + std::chrono::seconds(30);
  Result<ChannelPtr> rx = internalError("not run");
  std::thread t([&] { rx = b->openChannel({1, 1, 0, false, a->listenAddresses()}, deadline); });
  auto tx = a->openChannel({1, 0, 1, true, b->listenAddresses()}, deadline);
  t.join();
  if (!tx || !rx) {
    std::fprintf(stderr, "connect failed\n");
    return 1;
  }
  std::vector<std::vector<std::uint8_t>> sbuf(static_cast<std::size_t>(inflight), std::vector<std::uint8_t>(size, 1));
  std::vector<std::vector<std::uint8_t>> rbuf(static_cast<std::size_t>(inflight), std::vector<std::uint8_t>(size, 0));
  std::vector<RequestPtr> sr(static_cast<std::size_t>(inflight)), rr(static_cast<std::size_t>(inflight));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters + inflight; ++i) {
    auto slot = static_cast<std::size_t>(i % inflight);
    if (sr[slot]) {
      if (!sr[slot]->wait().isOk() || !rr[slot]->wait().isOk()) return 1;
    }
    if (i >= iters) continue;
    rr[slot] = (*rx)->irecv(rbuf[slot].data(), size, 0).value();
    sr[slot] = (*tx)->isend(sbuf[slot].data(), size, 0).value();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("# meridian-transport-bench --paths %d --streams %d --size %s --chunk %s --inflight %d --iters %d\n", paths,
              streams, sizeText.c_str(), chunkText.c_str(), inflight, iters);
  std::printf("aggregate %.3f GB/s (%d x %zu B in %.3f s)\n", static_cast<double>(size) * iters / secs / 1e9, iters, size,
              secs);
  auto stats = (*tx)->pathStats();
  for (std::size_t p = 0; p < stats.size(); ++p) {
    std::printf("  path %zu %s -> %s: %.3f GB/s, %llu chunks\n", p, stats[p].localAddress.c_str(),
                stats[p].remoteAddress.c_str(), static_cast<double>(stats[p].bytesSent) / secs / 1e9,
                static_cast<unsigned long long>(stats[p].chunksSent));
  }
  return 0;
}
