#include "nccl_plugin/conformance.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <deque>
#include <random>

#include <fmt/format.h>

namespace meridian::plugin::conformance {

namespace {

constexpr auto kDeadline = std::chrono::seconds(120);
constexpr std::size_t kSlack = 64;  // receive buffers are this much larger than the message

std::vector<std::uint8_t> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> v(n);
  std::mt19937 rng(seed * 2654435761u + 1);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

// As NCCL does: warnings always, INFO lines with NCCL_DEBUG=INFO (or TRACE).
void logToStderr(int level, unsigned long, const char*, int, const char* fmt, ...) {
  static const bool info = [] {
    const char* d = std::getenv("NCCL_DEBUG");
    return d != nullptr && (std::strcmp(d, "INFO") == 0 || std::strcmp(d, "TRACE") == 0);
  }();
  if (level > (info ? kNcclLogInfo : kNcclLogWarn)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

struct Xfer {
  std::vector<std::uint8_t> buf;
  std::size_t size = 0;
  void* mh = nullptr;
  void* req = nullptr;
  bool done = false;
};

// One end of the plan: posts while the plugin takes requests (NULL: back-pressure, retry
// later), tests what is in flight.
struct Side {
  const MerNcclNet_v11* net = nullptr;
  void* comm = nullptr;
  bool sender = false;
  std::vector<Xfer> x;
  std::size_t next = 0, finished = 0, maxInflight = 0, nullRequests = 0;
  std::deque<std::size_t> inflight;
  std::string error;

  bool over() const { return comm == nullptr || finished == x.size() || !error.empty(); }

  void step() {
    while (next < x.size() && error.empty()) {
      Xfer& t = x[next];
      int rc;
      if (sender) {
        rc = net->isend(comm, t.buf.data(), t.size, 0, t.mh, nullptr, &t.req);
      } else {
        void* data = t.buf.data();
        std::size_t cap = t.buf.size();
        int tag = 0;
        void* mh = t.mh;
        t.req = next % 2 == 0 ? reinterpret_cast<void*>(0x1) : nullptr;  // optional-completion marker
        rc = net->irecv(comm, 1, &data, &cap, &tag, &mh, nullptr, &t.req);
      }
      if (rc != kNcclSuccess) error = fmt::format("{} of message {}: ncclResult {}", sender ? "isend" : "irecv", next, rc);
      if (t.req == nullptr) {
        ++nullRequests;
        break;
      }
      inflight.push_back(next++);
      maxInflight = std::max(maxInflight, inflight.size());
    }
    for (auto it = inflight.begin(); it != inflight.end() && error.empty();) {
      Xfer& t = x[*it];
      int done = 0;
      int size = -1;
      const bool withSizes = *it % 3 != 0;  // NULL sizes for every third
      int rc = net->test(t.req, &done, withSizes ? &size : nullptr);
      if (rc != kNcclSuccess) {
        error = fmt::format("test of message {} ({} bytes): ncclResult {}", *it, t.size, rc);
        break;
      }
      if (!done) {
        ++it;
        continue;
      }
      if (withSizes && static_cast<std::size_t>(size) != t.size) {
        error = fmt::format("message {}: test says {} bytes, sent {}", *it, size, t.size);
      } else if (!sender) {
        auto want = pattern(t.size, static_cast<std::uint32_t>(*it));
        if (!std::equal(want.begin(), want.end(), t.buf.begin())) error = fmt::format("message {} arrived corrupted", *it);
        if (std::any_of(t.buf.begin() + static_cast<std::ptrdiff_t>(t.size), t.buf.end(),
                        [](std::uint8_t b) { return b != 0xee; })) {
          error = fmt::format("message {} wrote past its {} bytes", *it, t.size);
        }
      }
      t.done = true;
      t.buf = {};  // free as we go
      ++finished;
      it = inflight.erase(it);
    }
  }
};

// After a failure (a timeout, most likely) receives may still be posted into `buffers` and the
// plugin's progress thread may still write into them until the caller closes the comms, as
// NCCL does before it frees anything. Freeing them first would hand it freed memory (and
// "Bad address" from recv for the large, unmapped ones), so a failed run leaves them to the
// process, which reports the failure and ends.
template <typename Buffers>
std::string keepIfFailed(std::string error, Buffers& buffers) {
  if (!error.empty()) new Buffers(std::move(buffers));  // deliberately never freed
  return error;
}

std::string runUntil(const std::function<bool()>& done, const std::function<std::string()>& step) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!done()) {
    if (std::string e = step(); !e.empty()) return e;
    if (std::chrono::steady_clock::now() > deadline) return "timed out";
  }
  return "";
}

}  // namespace

std::string load(const std::string& name, Plugin* out) {
  out->lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (out->lib == nullptr) return fmt::format("dlopen({}): {}", name, ::dlerror());
  out->net = static_cast<const MerNcclNet_v11*>(::dlsym(out->lib, "ncclNetPlugin_v11"));
  if (out->net == nullptr) return "no ncclNetPlugin_v11 in the plugin";
  MerNcclNetCommConfig config{-1};
  int rc = out->net->init(&out->ctx, 0x1234, &config, logToStderr, nullptr);
  if (rc != kNcclSuccess) return fmt::format("init: ncclResult {}", rc);
  int n = 0;
  if (out->net->devices(&n) != kNcclSuccess || n < 1) return fmt::format("devices: {}", n);
  return "";
}

std::vector<std::size_t> planSizes() {
  std::vector<std::size_t> s;
  for (int i = 0; i < 100; ++i) s.push_back(1000 + static_cast<std::size_t>(i));  // > 32 in flight
  for (std::size_t v : {0ul, 1ul, 7ul, 4096ul, 65535ul, 65536ul, 65537ul, 1ul << 20, (16ul << 20) + 3, 64ul << 20}) {
    s.push_back(v);
  }
  return s;
}

std::string listen(Plugin& p, std::vector<std::uint8_t>* handle, void** listenComm) {
  handle->assign(kNcclNetHandleMaxBytes, 0);
  int rc = p.net->listen(p.ctx, 0, handle->data(), listenComm);
  if (rc != kNcclSuccess || *listenComm == nullptr) return fmt::format("listen: ncclResult {}", rc);
  return "";
}

std::string acceptAll(Plugin& p, void* listenComm, void** recvComm) {
  *recvComm = nullptr;
  return runUntil([&] { return *recvComm != nullptr; },
                  [&]() -> std::string {
                    int rc = p.net->accept(listenComm, recvComm, nullptr);
                    return rc == kNcclSuccess ? "" : fmt::format("accept: ncclResult {}", rc);
                  });
}

std::string connectAll(Plugin& p, std::vector<std::uint8_t> handle, void** sendComm) {
  *sendComm = nullptr;
  return runUntil([&] { return *sendComm != nullptr; },
                  [&]() -> std::string {
                    int rc = p.net->connect(p.ctx, 0, handle.data(), sendComm, nullptr);
                    return rc == kNcclSuccess ? "" : fmt::format("connect: ncclResult {}", rc);
                  });
}

std::string connectAndAccept(Plugin& p, void* listenComm, std::vector<std::uint8_t> handle, void** sendComm,
                             void** recvComm) {
  *sendComm = *recvComm = nullptr;
  return runUntil([&] { return *sendComm != nullptr && *recvComm != nullptr; },
                  [&]() -> std::string {
                    if (*sendComm == nullptr) {
                      int rc = p.net->connect(p.ctx, 0, handle.data(), sendComm, nullptr);
                      if (rc != kNcclSuccess) return fmt::format("connect: ncclResult {}", rc);
                    }
                    if (*recvComm == nullptr) {
                      int rc = p.net->accept(listenComm, recvComm, nullptr);
                      if (rc != kNcclSuccess) return fmt::format("accept: ncclResult {}", rc);
                    }
                    return "";
                  });
}

namespace {

// Grouped receives: three buffers with tags 7, 8, 9; the sender sends tag 9, then 7, then 8,
// and each lands in its own buffer with its own size.
std::string grouped(const MerNcclNet_v11* net, void* sendComm, void* recvComm) {
  std::vector<std::uint8_t> a(2500, 0xee), b(100, 0xee), c(3000, 0xee);
  void* req = nullptr;
  if (recvComm != nullptr) {
    void* data[3] = {a.data(), b.data(), c.data()};
    std::size_t sizes[3] = {a.size(), b.size(), c.size()};
    int tags[3] = {7, 8, 9};
    void* mh[3] = {nullptr, nullptr, nullptr};
    if (int rc = net->irecv(recvComm, 3, data, sizes, tags, mh, nullptr, &req); rc != kNcclSuccess || req == nullptr) {
      return fmt::format("grouped irecv: ncclResult {}", rc);
    }
  }
  auto m9 = pattern(2999, 9), m7 = pattern(10, 7);
  std::vector<void*> sends;
  if (sendComm != nullptr) {
    for (auto [data, size, tag] : {std::tuple{m9.data(), m9.size(), 9}, {m7.data(), m7.size(), 7}, {nullptr, 0ul, 8}}) {
      void* s = nullptr;
      auto r = runUntil([&] { return s != nullptr; }, [&]() -> std::string {
        int rc = net->isend(sendComm, data, size, tag, nullptr, nullptr, &s);
        return rc == kNcclSuccess ? "" : fmt::format("grouped isend: ncclResult {}", rc);
      });
      if (!r.empty()) return r;
      sends.push_back(s);
    }
  }
  int got[3] = {-1, -1, -1};
  bool recvDone = recvComm == nullptr;
  std::size_t sendsDone = 0;
  std::string e = runUntil([&] { return recvDone && sendsDone == sends.size(); }, [&]() -> std::string {
    for (auto& s : sends) {
      int done = 0;
      if (s == nullptr) continue;
      if (int rc = net->test(s, &done, nullptr); rc != kNcclSuccess) return fmt::format("grouped send test: {}", rc);
      if (done) {
        s = nullptr;
        ++sendsDone;
      }
    }
    if (!recvDone) {
      int done = 0;
      if (int rc = net->test(req, &done, got); rc != kNcclSuccess) return fmt::format("grouped test: {}", rc);
      recvDone = done != 0;
    }
    return "";
  });
  if (!e.empty() || recvComm == nullptr) return e;
  if (got[0] != 10 || got[1] != 0 || got[2] != 2999) {
    return fmt::format("grouped receive sizes {} {} {} (want 10 0 2999)", got[0], got[1], got[2]);
  }
  if (!std::equal(m7.begin(), m7.end(), a.begin()) || !std::equal(m9.begin(), m9.end(), c.begin())) {
    return "grouped receive: a message landed in the wrong buffer";
  }
  return "";
}

// A send larger than its receive fails the receive with ncclInvalidArgument; the connection
// carries on (the next message arrives intact).
std::string tooLarge(const MerNcclNet_v11* net, void* sendComm, void* recvComm) {
  auto big = pattern(2000, 5), next = pattern(300, 6);
  std::vector<std::uint8_t> small(1000), after(300);
  void *r1 = nullptr, *r2 = nullptr, *s1 = nullptr, *s2 = nullptr;
  int tag = 0;
  if (recvComm != nullptr) {
    void* d1 = small.data();
    void* d2 = after.data();
    std::size_t c1 = small.size(), c2 = after.size();
    void* mh = nullptr;
    if (net->irecv(recvComm, 1, &d1, &c1, &tag, &mh, nullptr, &r1) != kNcclSuccess || r1 == nullptr ||
        net->irecv(recvComm, 1, &d2, &c2, &tag, &mh, nullptr, &r2) != kNcclSuccess || r2 == nullptr) {
      return "irecv for the too-large send was refused";
    }
  }
  if (sendComm != nullptr) {
    if (net->isend(sendComm, big.data(), big.size(), 0, nullptr, nullptr, &s1) != kNcclSuccess || s1 == nullptr ||
        net->isend(sendComm, next.data(), next.size(), 0, nullptr, nullptr, &s2) != kNcclSuccess || s2 == nullptr) {
      return "isend of the too-large message was refused";
    }
  }
  int firstRc = kNcclSuccess;
  bool r1Done = recvComm == nullptr, r2Done = recvComm == nullptr, s1Done = sendComm == nullptr, s2Done = sendComm == nullptr;
  std::string e = runUntil([&] { return r1Done && r2Done && s1Done && s2Done; }, [&]() -> std::string {
    int done = 0;
    if (!s1Done && net->test(s1, &done, nullptr) == kNcclSuccess && done) s1Done = true;
    if (!s2Done && net->test(s2, &done, nullptr) == kNcclSuccess && done) s2Done = true;
    if (!r1Done) {
      int rc = net->test(r1, &done, nullptr);
      if (rc != kNcclSuccess) {
        firstRc = rc;
        r1Done = true;
      } else if (done) {
        return "a send larger than its receive completed without an error";
      }
    }
    if (r1Done && !r2Done) {
      int size = 0;
      if (int rc = net->test(r2, &done, &size); rc != kNcclSuccess) return fmt::format("the message after: {}", rc);
      if (done) r2Done = true;
    }
    return "";
  });
  if (!e.empty() || recvComm == nullptr) return e;
  if (firstRc != kNcclInvalidArgument) return fmt::format("too-large send: ncclResult {} (want {})", firstRc, kNcclInvalidArgument);
  if (after != next) return "the message after a too-large one arrived corrupted";
  return "";
}

}  // namespace

std::string printProperties(Plugin& p) {
  int n = 0;
  if (int rc = p.net->devices(&n); rc != kNcclSuccess) return fmt::format("devices: ncclResult {}", rc);
  for (int d = 0; d < n; ++d) {
    MerNcclProps_v11 props{};
    if (int rc = p.net->getProperties(d, &props); rc != kNcclSuccess) return fmt::format("getProperties({}): ncclResult {}", d, rc);
    std::printf("device %d: name %s, speed %d Mbit/s, latency %.1f us, pciPath %s, maxRecvs %d\n", d, props.name, props.speed,
                static_cast<double>(props.latency), props.pciPath, props.maxRecvs);
  }
  return "";
}

std::string stream(Plugin& p, void* sendComm, void* recvComm, std::size_t bytes, int iters, int inflight,
                   double* seconds) {
  const MerNcclNet_v11* net = p.net;
  struct End {
    void* comm;
    bool sender;
    std::vector<std::vector<std::uint8_t>> bufs;
    std::vector<void*> reqs;
    int posted = 0, done = 0;
  };
  std::vector<End> ends;
  if (sendComm != nullptr) ends.push_back({sendComm, true, {}, {}});
  if (recvComm != nullptr) ends.push_back({recvComm, false, {}, {}});
  for (End& e : ends) {
    e.bufs.assign(static_cast<std::size_t>(inflight), std::vector<std::uint8_t>(bytes, 1));
    e.reqs.assign(static_cast<std::size_t>(inflight), nullptr);
  }
  const auto start = std::chrono::steady_clock::now();
  std::string e = runUntil([&] { return std::all_of(ends.begin(), ends.end(), [&](const End& x) { return x.done == iters; }); },
                           [&]() -> std::string {
    for (End& x : ends) {
      for (std::size_t slot = 0; slot < x.reqs.size(); ++slot) {
        if (x.reqs[slot] != nullptr) {
          int done = 0;
          if (int rc = net->test(x.reqs[slot], &done, nullptr); rc != kNcclSuccess) return fmt::format("test: {}", rc);
          if (!done) continue;
          x.reqs[slot] = nullptr;
          ++x.done;
        }
        if (x.posted == iters) continue;
        int rc;
        if (x.sender) {
          rc = net->isend(x.comm, x.bufs[slot].data(), bytes, 0, nullptr, nullptr, &x.reqs[slot]);
        } else {
          void* data = x.bufs[slot].data();
          std::size_t cap = bytes;
          int tag = 0;
          void* mh = nullptr;
          rc = net->irecv(x.comm, 1, &data, &cap, &tag, &mh, nullptr, &x.reqs[slot]);
        }
        if (rc != kNcclSuccess) return fmt::format("{}: {}", x.sender ? "isend" : "irecv", rc);
        if (x.reqs[slot] != nullptr) ++x.posted;
      }
    }
    return "";
  });
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return keepIfFailed(std::move(e), ends);
}

namespace {
// The plan of sizes, both ways of posting, testing and checking (defined below).
std::string transferPlan(Plugin& p, void* sendComm, void* recvComm);
}  // namespace

std::string runPlan(Plugin& p, void* sendComm, void* recvComm, int repeats, std::size_t* bytesMoved,
                    const std::function<std::string()>& barrier) {
  for (int r = 0; r < repeats; ++r) {
    if (std::string e = transferPlan(p, sendComm, recvComm); !e.empty()) return fmt::format("round {}: {}", r, e);
  }
  if (bytesMoved != nullptr) {
    *bytesMoved = 0;
    for (std::size_t s : planSizes()) *bytesMoved += s * static_cast<std::size_t>(repeats);
  }
  const MerNcclNet_v11* net = p.net;
  std::string e;
  if (e = grouped(net, sendComm, recvComm); !e.empty()) return e;
  if (e = tooLarge(net, sendComm, recvComm); !e.empty()) return e;
  if (barrier) {
    if (e = barrier(); !e.empty()) return "barrier before close: " + e;
  }
  // Close with requests in flight: receives nobody will answer.
  if (recvComm != nullptr) {
    std::vector<std::uint8_t> buf(4096);
    for (int i = 0; i < 3; ++i) {
      void* data = buf.data();
      std::size_t cap = buf.size();
      int tag = 42;
      void* mh = nullptr;
      void* req = nullptr;
      if (net->irecv(recvComm, 1, &data, &cap, &tag, &mh, nullptr, &req) != kNcclSuccess) return "irecv before close";
    }
    if (int rc = net->closeRecv(recvComm); rc != kNcclSuccess) return fmt::format("closeRecv with requests in flight: {}", rc);
  }
  if (sendComm != nullptr) {
    if (int rc = net->closeSend(sendComm); rc != kNcclSuccess) return fmt::format("closeSend: {}", rc);
    void* req = nullptr;
    char byte = 0;
    if (int rc = net->isend(sendComm, &byte, 1, 0, nullptr, nullptr, &req); rc != kNcclInvalidArgument) {
      return fmt::format("isend on a closed comm: ncclResult {} (want {})", rc, kNcclInvalidArgument);
    }
  }
  return "";
}

namespace {

std::string transferPlan(Plugin& p, void* sendComm, void* recvComm) {
  const MerNcclNet_v11* net = p.net;
  const auto sizes = planSizes();
  Side tx{net, sendComm, true, {}, 0, 0, 0, 0, {}, ""};
  Side rx{net, recvComm, false, {}, 0, 0, 0, 0, {}, ""};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sendComm != nullptr) {
      Xfer t;
      t.size = sizes[i];
      t.buf = pattern(sizes[i], static_cast<std::uint32_t>(i));
      if (int rc = net->regMr(sendComm, t.buf.data(), t.buf.size(), kNcclPtrHost, &t.mh); rc != kNcclSuccess) {
        return fmt::format("regMr: {}", rc);
      }
      tx.x.push_back(std::move(t));
    }
    if (recvComm != nullptr) {
      Xfer t;
      t.size = sizes[i];
      t.buf.assign(sizes[i] + kSlack, 0xee);
      if (int rc = net->regMr(recvComm, t.buf.data(), t.buf.size(), kNcclPtrHost, &t.mh); rc != kNcclSuccess) {
        return fmt::format("regMr: {}", rc);
      }
      rx.x.push_back(std::move(t));
    }
  }
  // regMr on sub-ranges of one registered buffer, as NCCL does for its staging buffers: each
  // must succeed on its own and cost nothing (1,000 of them).
  for (auto* side : {&tx, &rx}) {
    if (side->comm == nullptr || side->x.empty()) continue;
    std::vector<std::uint8_t>& whole = side->x.back().buf;
    for (std::size_t i = 0; i < 1000; ++i) {
      void* mh = nullptr;
      const std::size_t off = (i * 4099) % (whole.size() / 2);
      if (int rc = net->regMr(side->comm, whole.data() + off, whole.size() / 2, kNcclPtrHost, &mh); rc != kNcclSuccess) {
        return fmt::format("regMr of a sub-range: {}", rc);
      }
      if (int rc = net->deregMr(side->comm, mh); rc != kNcclSuccess) return fmt::format("deregMr of a sub-range: {}", rc);
    }
  }
  std::string e = runUntil([&] { return tx.over() && rx.over(); }, [&]() -> std::string {
    if (!tx.over()) tx.step();
    if (!rx.over()) rx.step();
    return !tx.error.empty() ? tx.error : rx.error;
  });
  if (!e.empty()) {
    std::pair<Side, Side> sides{std::move(tx), std::move(rx)};
    return keepIfFailed(std::move(e), sides);
  }
  if (sendComm != nullptr && tx.maxInflight > static_cast<std::size_t>(kNcclNetMaxRequests)) {
    return fmt::format("{} sends in flight on one comm (at most {})", tx.maxInflight, kNcclNetMaxRequests);
  }
  if (sendComm != nullptr && tx.nullRequests == 0) return "isend never pushed back (a NULL request) with 110 to send";
  for (auto* side : {&tx, &rx}) {
    for (auto& t : side->x) {
      if (t.mh != nullptr && net->deregMr(side->comm, t.mh) != kNcclSuccess) return "deregMr failed";
    }
  }
  return "";
}

}  // namespace
}  // namespace meridian::plugin::conformance
