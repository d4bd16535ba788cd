// meridian-transport-bench: one-way goodput of a multipath channel over loopback (per path and
// aggregate), with K messages in flight.
//
// Two shapes:
//   one process (default)   both devices in this process; the caller waits on each request.
//   two processes           --listen --handle-file F receives, --connect --handle-file F sends,
//                           each its own process, as two ranks (and as meridian-nccl-check
//                           --bench runs the NCCL plugin, so the two compare like for like);
//                           --poll makes the caller spin on test() as NCCL's proxy thread does.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/file_util.h"
#include "core/knobs.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/tcp_device.h"

using namespace meridian;
using namespace meridian::transport;

namespace {

constexpr std::uint64_t kSession = 1;
constexpr int kSenderRank = 1;

// The listener's addresses, one per line, written atomically.
bool writeAddresses(const std::string& path, const std::vector<std::string>& addresses) {
  std::string text;
  for (const auto& a : addresses) text += a + "\n";
  return writeFileAtomically(path, text).isOk();
}

std::vector<std::string> readAddresses(const std::string& path, TimePoint deadline) {
  while (!std::filesystem::exists(path) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// The value, or an exception that says what failed and why.
template <typename T>
T must(Result<T> r, const char* what) {
  if (!r) throw std::runtime_error(std::string(what) + ": " + r.status().toString());
  return std::move(r).value();
}

struct Flow {
  Channel* tx = nullptr;  // either or both
  Channel* rx = nullptr;
  std::size_t size = 0;
  int inflight = 0, iters = 0;
  bool poll = false;
};

// One buffer per message in flight and direction, allocated and touched before the clock
// starts (as meridian-nccl-check's bench does): at 64 MiB x 4 in flight, faulting in 256 MiB
// per side inside the timed loop cost this bench a third of its figure.
struct Buffers {
  std::vector<std::vector<std::uint8_t>> send, recv;
};

Buffers makeBuffers(const Flow& f) {
  const auto n = static_cast<std::size_t>(f.inflight);
  Buffers b;
  if (f.tx != nullptr) b.send.assign(n, std::vector<std::uint8_t>(f.size, 1));
  if (f.rx != nullptr) b.recv.assign(n, std::vector<std::uint8_t>(f.size, 0));
  return b;
}

// Keeps `inflight` messages posted per direction until `iters` have completed; false on an error.
bool run(const Flow& f, Buffers& bufs) {
  auto& sbuf = bufs.send;
  auto& rbuf = bufs.recv;
  std::vector<RequestPtr> sr(static_cast<std::size_t>(f.inflight)), rr(static_cast<std::size_t>(f.inflight));
  auto post = [&](std::size_t slot) {
    if (f.rx != nullptr) {
      auto r = f.rx->irecv(rbuf[slot].data(), f.size, 0);
      if (!r) return false;
      rr[slot] = std::move(r).value();
    }
    if (f.tx != nullptr) {
      auto s = f.tx->isend(sbuf[slot].data(), f.size, 0);
      if (!s) return false;
      sr[slot] = std::move(s).value();
    }
    return true;
  };
  if (f.poll) {
    // As NCCL's proxy thread (and meridian-nccl-check) does: test every slot in turn and
    // post the next message into whichever is done.
    int posted = 0, done = 0;
    for (std::size_t slot = 0; slot < sr.size() && posted < f.iters; ++slot, ++posted) {
      if (!post(slot)) return false;
    }
    while (done < f.iters) {
      for (std::size_t slot = 0; slot < sr.size(); ++slot) {
        if (!sr[slot] && !rr[slot]) continue;
        if ((sr[slot] && !sr[slot]->test()) || (rr[slot] && !rr[slot]->test())) continue;
        if ((sr[slot] && !sr[slot]->status().isOk()) || (rr[slot] && !rr[slot]->status().isOk())) return false;
        sr[slot].reset();
        rr[slot].reset();
        ++done;
        if (posted < f.iters) {
          if (!post(slot)) return false;
          ++posted;
        }
      }
    }
    return true;
  }
  auto finish = [&](RequestPtr& r) {
    if (!r) return true;
    bool ok = r->wait().isOk();
    r.reset();
    return ok;
  };
  for (int i = 0; i < f.iters + f.inflight; ++i) {
    auto slot = static_cast<std::size_t>(i % f.inflight);
    if (!finish(sr[slot]) || !finish(rr[slot])) return false;
    if (i >= f.iters) continue;
    if (!post(slot)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Multipath channel goodput over loopback"};
  int paths = 1, streams = 2, inflight = 4, iters = 64;
  std::string sizeText = "4M", chunkText = "512k", handleFile;
  bool listen = false, connect = false, poll = false;
  app.add_option("--paths", paths, "Loopback paths (127.0.0.1, .2, ...)")->check(CLI::Range(1, 16));
  app.add_option("--streams", streams, "TCP streams per path")->check(CLI::Range(1, 64));
  app.add_option("--size", sizeText, "Message size");
  app.add_option("--chunk", chunkText, "Chunk size");
  app.add_option("--inflight", inflight, "Messages in flight")->check(CLI::Range(1, 1024));
  app.add_option("--iters", iters, "Messages to send")->check(CLI::Range(1, 100000000));
  auto* l = app.add_flag("--listen", listen, "Two processes: receive here (writes --handle-file)");
  app.add_flag("--connect", connect, "Two processes: send from here (reads --handle-file)")->excludes(l);
  app.add_option("--handle-file", handleFile, "Where the listener writes its addresses for the connector");
  app.add_flag("--poll", poll, "Spin on test() instead of waiting (as NCCL's proxy thread does)");
  CLI11_PARSE(app, argc, argv);
  if ((listen || connect) && handleFile.empty()) {
    std::fprintf(stderr, "meridian-transport-bench: --listen and --connect need --handle-file\n");
    return 2;
  }
  Flow flow;
  flow.inflight = inflight;
  flow.iters = iters;
  flow.poll = poll;
  try {
    flow.size = static_cast<std::size_t>(parseByteSize(sizeText, "--size"));
    DeviceOptions o;
    o.localAddresses.clear();
    for (int i = 0; i < paths; ++i) o.localAddresses.push_back("127.0.0." + std::to_string(i + 1));
    o.tcp.streamsPerPath = streams;
    o.chunkBytes = static_cast<std::size_t>(parseByteSize(chunkText, "--chunk"));
    o.secret = "transport-bench";
    auto deadline = Clock::now() + std::chrono::seconds(30);
    std::unique_ptr<tcp::TcpDevice> a, b;
    ChannelPtr tx, rx;
    if (listen) {
      o.name = "rx";
      b = must(tcp::TcpDevice::create(o), "device");
      std::filesystem::remove(handleFile);
      if (!writeAddresses(handleFile, b->listenAddresses())) {
        std::fprintf(stderr, "meridian-transport-bench: cannot write %s\n", handleFile.c_str());
        return 1;
      }
      for (;;) {
        auto got = b->acceptChannel(kSession);
        if (got) {
          rx = std::move(got->second);
          break;
        }
        if (got.status().code() != StatusCode::kAgain || Clock::now() > deadline) {
          std::fprintf(stderr, "meridian-transport-bench: accept: %s\n", got.status().toString().c_str());
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else if (connect) {
      o.name = "tx";
      a = must(tcp::TcpDevice::create(o), "device");
      auto peer = readAddresses(handleFile, deadline);
      if (peer.empty()) {
        std::fprintf(stderr, "meridian-transport-bench: no addresses in %s\n", handleFile.c_str());
        return 1;
      }
      tx = must(a->openChannel({kSession, kSenderRank, 0, true, must(tcp::encodeEndpoint(peer), "endpoint")}, deadline),
                "connect");
    } else {
      o.name = "tx";
      a = must(tcp::TcpDevice::create(o), "device");
      o.name = "rx";
      b = must(tcp::TcpDevice::create(o), "device");
      Result<ChannelPtr> r = internalError("not run");
      std::thread t([&] { r = b->openChannel({kSession, 1, 0, false, a->endpoint()}, deadline); });
      auto s = a->openChannel({kSession, 0, 1, true, b->endpoint()}, deadline);
      t.join();
      tx = must(std::move(s), "connect");
      rx = must(std::move(r), "accept");
    }
    flow.tx = tx.get();
    flow.rx = rx.get();
    Buffers bufs = makeBuffers(flow);
    auto t0 = std::chrono::steady_clock::now();
    if (!run(flow, bufs)) {
      std::fprintf(stderr, "meridian-transport-bench: a transfer failed\n");
      return 1;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("# meridian-transport-bench --paths %d --streams %d --size %s --chunk %s --inflight %d --iters %d%s%s\n",
                paths, streams, sizeText.c_str(), chunkText.c_str(), inflight, iters,
                listen ? " --listen" : connect ? " --connect" : "", poll ? " --poll" : "");
    std::printf("aggregate %.3f GB/s (%d x %zu B in %.3f s)\n", static_cast<double>(flow.size) * iters / secs / 1e9, iters,
                flow.size, secs);
    if (tx) {
      auto stats = tx->pathStats();
      for (std::size_t p = 0; p < stats.size(); ++p) {
        std::printf("  path %zu %s -> %s: %.3f GB/s, %llu chunks\n", p, stats[p].localAddress.c_str(),
                    stats[p].remoteAddress.c_str(), static_cast<double>(stats[p].bytesSent) / secs / 1e9,
                    static_cast<unsigned long long>(stats[p].chunksSent));
      }
    }
    if (connect) (void)a->closeChannel(kSession, 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meridian-transport-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
