// meridian-transport-bench: one-way goodput of a multipath channel over loopback (per path and
// aggregate), with K messages in flight.
//
// Two shapes:
//   one process (default)   both devices in this process; the caller waits on each request.
//   two processes           --listen --handle-file F receives, --connect --handle-file F sends,
//                           each its own process, as two ranks (and as meridian-nccl-check
//                           --bench runs the NCCL plugin, so the two compare like for like);
//                           --poll makes the caller spin on test() as NCCL's proxy thread does.
//   --recovery              how fast a path routing avoided carries its share again once its
//                           weight is back to neutral (issue 24): see recovery() below.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// Two devices in this process, connected by a channel each way (tx: a to b).
struct LocalPair {
  std::unique_ptr<tcp::TcpDevice> a, b;
  ChannelPtr tx, rx;
};

LocalPair openLocalPair(DeviceOptions o, TimePoint deadline) {
  LocalPair p;
  o.name = "tx";
  p.a = must(tcp::TcpDevice::create(o), "device");
  o.name = "rx";
  p.b = must(tcp::TcpDevice::create(o), "device");
  Result<ChannelPtr> r = internalError("not run");
  std::thread t([&] { r = p.b->openChannel({kSession, 1, 0, false, p.a->endpoint()}, deadline); });
  auto s = p.a->openChannel({kSession, 0, 1, true, p.b->endpoint()}, deadline);
  t.join();
  p.tx = must(std::move(s), "connect");
  p.rx = must(std::move(r), "accept");
  return p;
}

// Waits until every path of `ch` but a relay slot is up: fabric paths come up once the peer's
// rail names arrive (docs/transport.md), and the figures are for the channel a job uses. Says
// so and goes on when one stays down (a peer without a rail).
void waitForPaths(const ChannelPtr& ch, TimePoint deadline) {
  auto allUp = [&] {
    auto stats = ch->pathStats();
    return std::all_of(stats.begin(), stats.end(), [](const PathStats& s) { return s.alive || s.relay; });
  };
  while (!allUp() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!allUp()) std::fprintf(stderr, "meridian-transport-bench: a path of the channel stayed down\n");
}

// Path 1's share of the bytes the paths of `ch` sent since `before`.
double lastPathShare(const ChannelPtr& ch, const std::vector<PathStats>& before) {
  auto after = ch->pathStats();
  double total = 0;
  for (std::size_t i = 0; i < after.size(); ++i) total += static_cast<double>(after[i].bytesSent - before[i].bytesSent);
  return total > 0 ? static_cast<double>(after.back().bytesSent - before.back().bytesSent) / total : 0;
}

// --recovery: per round, on fresh devices with two loopback paths, one message at neutral
// weights, two with path 1 at `avoidedWeight` (routing gives a congested path 0.1), then
// neutral weights again and `messages` more. Prints path 1's share of each message after the
// restore and the first message from which it carried at least `fairShare` twice in a row,
// with the time and bytes from the restore to that message's end; then the medians.
int recovery(const DeviceOptions& o, const Flow& f, int rounds, int messages, double fairShare,
             double avoidedWeight) {
  std::vector<double> msgsToFair, secsToFair, meanShares;
  int never = 0;
  for (int round = 1; round <= rounds; ++round) {
    LocalPair pair = openLocalPair(o, Clock::now() + std::chrono::seconds(30));
    Flow one = f;
    one.tx = pair.tx.get();
    one.rx = pair.rx.get();
    one.inflight = one.iters = 1;
    Buffers bufs = makeBuffers(one);
    auto send = [&] {
      auto before = pair.tx->pathStats();
      if (!run(one, bufs)) throw std::runtime_error("a transfer failed");
      return lastPathShare(pair.tx, before);
    };
    const double neutral[] = {1.0, 1.0}, avoided[] = {1.0, avoidedWeight};
    const double warm = send();
    pair.tx->setPathWeights(avoided);
    const double low = (send() + send()) / 2;
    pair.tx->setPathWeights(neutral);
    const auto restored = std::chrono::steady_clock::now();
    std::vector<double> shares, secs;
    for (int m = 0; m < messages; ++m) {
      shares.push_back(send());
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - restored).count());
    }
    int fair = -1;  // index of the first of two messages in a row at a fair share
    for (std::size_t m = 0; m + 1 < shares.size() && fair < 0; ++m) {
      if (shares[m] >= fairShare && shares[m + 1] >= fairShare) fair = static_cast<int>(m);
    }
    std::printf("round %d: path 1 share %.3f warm, %.3f avoided; after the restore:", round, warm, low);
    for (double x : shares) std::printf(" %.3f", x);
    double mean = 0;
    for (double x : shares) mean += x / messages;
    meanShares.push_back(mean);
    if (fair >= 0) {
      const auto k = static_cast<std::size_t>(fair);
      msgsToFair.push_back(fair + 1);
      secsToFair.push_back(secs[k]);
      std::printf("; fair from message %d (%.3f s, %.0f MiB after the restore)\n", fair + 1, secs[k],
                  static_cast<double>(f.size) * (fair + 1) / (1 << 20));
    } else {
      ++never;
      std::printf("; not fair within %d messages (%.3f s)\n", messages, secs.back());
    }
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::printf("summary: fair (>= %.2f twice in a row) in %d of %d rounds; median %.1f messages, %.3f s; "
              "median of path 1's mean share after the restore %.3f\n",
              fairShare, rounds - never, rounds, median(msgsToFair), median(secsToFair), median(meanShares));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Multipath channel goodput over loopback"};
  int paths = 1, streams = 2, inflight = 4, iters = 64;
  std::string sizeText = "4M", chunkText = "512k", handleFile;
  bool listen = false, connect = false, poll = false, recover = false;
  int rounds = 5, messages = 10;
  double fairShare = 0.4, avoidedWeight = 0.1;
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
  app.add_flag("--recovery", recover, "Time a de-weighted path's return to its share (two paths)")->excludes(l);
  app.add_option("--rounds", rounds, "--recovery: rounds, each on fresh devices")->check(CLI::Range(1, 1000));
  app.add_option("--messages", messages, "--recovery: messages sent after the restore")->check(CLI::Range(2, 100000));
  app.add_option("--fair-share", fairShare, "--recovery: path 1's share of a message that counts as fair")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--avoided-weight", avoidedWeight, "--recovery: path 1's weight while avoided")
      ->check(CLI::Range(0.001, 1.0));
  CLI11_PARSE(app, argc, argv);
  if (recover && (connect || paths != 2)) {
    std::fprintf(stderr, "meridian-transport-bench: --recovery runs in one process over --paths 2\n");
    return 2;
  }
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
    if (recover) {
      std::printf("# meridian-transport-bench --recovery --paths 2 --streams %d --size %s --chunk %s --rounds %d "
                  "--messages %d --fair-share %.2f --avoided-weight %g\n",
                  streams, sizeText.c_str(), chunkText.c_str(), rounds, messages, fairShare, avoidedWeight);
      return recovery(o, flow, rounds, messages, fairShare, avoidedWeight);
    }
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
      LocalPair pair = openLocalPair(o, deadline);
      a = std::move(pair.a);
      b = std::move(pair.b);
      tx = std::move(pair.tx);
      rx = std::move(pair.rx);
    }
    if (tx) waitForPaths(tx, Clock::now() + std::chrono::seconds(5));
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
    for (const char* knob : {"MERIDIAN_FABRIC", "MERIDIAN_FABRIC_PROVIDER", "MERIDIAN_FABRIC_TCP"}) {
      if (const char* v = std::getenv(knob)) std::printf("#   %s=%s\n", knob, v);
    }
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
