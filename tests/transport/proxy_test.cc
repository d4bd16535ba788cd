// An attacker on the path, without the job secret: a forwarding proxy between two ranks (and
// between a rank and the store) that flips, drops, replays, reorders or injects bytes after
// the handshake. Nothing it changes may be accepted: each message arrives intact (the channel
// moves to its other path) or its call fails, and the ranks count and log an integrity
// failure. With encryption the proxy sees no plaintext of a known buffer.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "bootstrap/store.h"
#include "core/metrics.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {
namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
constexpr std::size_t kRegion = 100;  // bytes dropped, swapped or replayed

enum class Action { kFlip, kDrop, kReplay, kReorder, kInject };

const char* actionName(Action a) {
  switch (a) {
    case Action::kFlip: return "flip";
    case Action::kDrop: return "drop";
    case Action::kReplay: return "replay";
    case Action::kReorder: return "reorder";
    case Action::kInject: return "inject";
  }
  return "?";
}

// One direction of a proxied connection: forwards bytes, changing them once at `at`.
struct Tamperer {
  Action action;
  std::size_t at;
  std::size_t pos = 0;
  std::vector<std::uint8_t> history;  // what came in, for replays and swaps

  void apply(const std::uint8_t* p, std::size_t n, std::vector<std::uint8_t>& out) {
    for (std::size_t k = 0; k < n; ++k, ++pos) {
      const std::uint8_t b = p[k];
      history.push_back(b);
      const std::size_t i = pos;
      switch (action) {
        case Action::kFlip: out.push_back(i == at ? static_cast<std::uint8_t>(b ^ 0x01) : b); break;
        case Action::kDrop:
          if (i < at || i >= at + kRegion) out.push_back(b);
          break;
        case Action::kInject:
          if (i == at) out.insert(out.end(), 64, 0x5a);
          out.push_back(b);
          break;
        case Action::kReplay:
          out.push_back(b);
          if (i == at + 3 * kRegion) out.insert(out.end(), history.begin() + at, history.begin() + at + kRegion);
          break;
        case Action::kReorder:
          if (i < at || i >= at + 2 * kRegion) out.push_back(b);
          if (i == at + 2 * kRegion - 1) {
            out.insert(out.end(), history.begin() + at + kRegion, history.begin() + at + 2 * kRegion);
            out.insert(out.end(), history.begin() + at, history.begin() + at + kRegion);
          }
          break;
      }
    }
  }
};

// Listens on 127.0.0.1; each connection it accepts is forwarded to `target`. The first
// connection's bytes in direction `toServer` (client -> target) or back are tampered with.
class Proxy {
 public:
  Proxy(std::string target, bool toServer, Action action, std::size_t at)
      : target_(std::move(target)), toServer_(toServer), action_(action), at_(at) {
    listen_ = listenOn("127.0.0.1", 0, false).value();
    address_ = localAddress(listen_.get());
    thread_ = std::thread([this] { run(); });
  }
  ~Proxy() {
    stop_ = true;
    thread_.join();
  }
  const std::string& address() const { return address_; }
  // Everything that went client -> server.
  std::vector<std::uint8_t> captured() {
    std::lock_guard lock(mu_);
    return captured_;
  }

 private:
  struct Conn {
    UniqueFd client, server;
    Tamperer up, down;  // client -> server, server -> client
    bool tamperUp = false, tamperDown = false;
  };

  void run() {
    std::vector<std::unique_ptr<Conn>> conns;
    while (!stop_) {
      std::vector<pollfd> fds{{listen_.get(), POLLIN, 0}};
      for (auto& c : conns) {
        fds.push_back({c->client.get(), POLLIN, 0});
        fds.push_back({c->server.get(), POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      const std::size_t polled = conns.size();  // a connection accepted below waits for the next poll
      if (fds[0].revents & POLLIN) {
        int fd = ::accept(listen_.get(), nullptr, nullptr);
        if (fd >= 0) {
          auto c = std::make_unique<Conn>();
          c->client.reset(fd);
          auto server = connectTo(parseHostPort(target_).value(), "", Clock::now() + kTimeout);
          if (!server) continue;
          c->server = std::move(server.value());
          c->up = Tamperer{action_, at_, 0, {}};
          c->down = Tamperer{action_, at_, 0, {}};
          const bool first = conns.empty();
          c->tamperUp = first && toServer_;
          c->tamperDown = first && !toServer_;
          conns.push_back(std::move(c));
        }
      }
      for (std::size_t k = 0; k < polled; ++k) {
        Conn& c = *conns[k];
        for (bool up : {true, false}) {
          const pollfd& p = fds[1 + 2 * k + (up ? 0 : 1)];
          if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
          std::uint8_t buf[65536];
          const ssize_t n = ::recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
          const int to = up ? c.server.get() : c.client.get();
          if (n <= 0) {
            if (n == 0 || (errno != EAGAIN && errno != EINTR)) ::shutdown(to, SHUT_WR);
            continue;
          }
          if (up) {
            std::lock_guard lock(mu_);
            captured_.insert(captured_.end(), buf, buf + n);
          }
          std::vector<std::uint8_t> out;
          if (up ? c.tamperUp : c.tamperDown) {
            (up ? c.up : c.down).apply(buf, static_cast<std::size_t>(n), out);
          } else {
            out.assign(buf, buf + n);
          }
          (void)sendAll(to, out.data(), out.size(), Clock::now() + kTimeout);
        }
      }
    }
  }

  std::string target_;
  bool toServer_;
  Action action_;
  std::size_t at_;
  UniqueFd listen_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::uint8_t> captured_;
};

// A recognisable message: what a proxy that could read the traffic would find.
constexpr char kCanary[] = "MERIDIAN-CANARY-GRADIENT-BYTES-";

std::vector<std::uint8_t> canaryBuffer(std::size_t n, int salt) {
  std::vector<std::uint8_t> v(n);
  const std::size_t c = sizeof(kCanary) - 1;
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(kCanary[i % c]);
  for (std::size_t i = c; i < n; i += 4096) v[i] = static_cast<std::uint8_t>(salt + i / 4096);  // each message its own
  return v;
}

bool contains(const std::vector<std::uint8_t>& hay, std::string_view needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::uint64_t integrityFailures(const std::string& device) {
  return MetricsRegistry::global()
      .counter("meridian_transport_integrity_failures_total", "", {{"device", device}})
      .value();
}

struct Case {
  WireSecurity mode;
  Action action;
  bool toServer;
};

class ProxyTest : public ::testing::TestWithParam<Case> {};

// a (rank 0) opens two paths to b: path 0 through the proxy, path 1 straight. Messages of
// a known pattern go a -> b (data one way, acks back); the proxy changes path 0 once.
// Returns how many messages arrived changed (ADD_FAILURE on calls that fail).
int exchangeThroughProxy(const Case& c, std::vector<std::uint8_t>* wire, std::uint64_t* failures);

TEST_P(ProxyTest, TamperedPathIsDroppedAndEveryMessageArrivesIntact) {
  const Case c = GetParam();
  std::vector<std::uint8_t> wire;
  std::uint64_t failures = 0;
  EXPECT_EQ(exchangeThroughProxy(c, &wire, &failures), 0) << "a forged byte was accepted";
  if (c.toServer) {
    // The data direction carries plenty after the change: its receiver must have caught it.
    EXPECT_GE(failures, 1u) << "the " << actionName(c.action) << " was not detected as an integrity failure";
  }
  if (c.mode == WireSecurity::kEncrypt) {
    EXPECT_FALSE(contains(wire, std::string_view(kCanary, 16))) << "plaintext of the message is readable on the wire";
  } else {
    EXPECT_TRUE(contains(wire, std::string_view(kCanary, 16))) << "authenticate sends clear text: the check can see it";
  }
}

// The harness can see what it claims to: without records' tags the same flip goes through.
TEST(ProxyHarnessTest, WithWireSecurityOffAFlippedByteIsAcceptedAndTheTextIsReadable) {
  std::vector<std::uint8_t> wire;
  std::uint64_t failures = 0;
  EXPECT_GE(exchangeThroughProxy({WireSecurity::kOff, Action::kFlip, true}, &wire, &failures), 1)
      << "off has no integrity check: the flipped byte should have arrived";
  EXPECT_EQ(failures, 0u);
  EXPECT_TRUE(contains(wire, std::string_view(kCanary, 16)));
}

int exchangeThroughProxy(const Case& c, std::vector<std::uint8_t>* wire, std::uint64_t* failures) {
  static int round = 0;
  const std::string na = fmt::format("pa{}", round), nb = fmt::format("pb{}", round);
  ++round;
  DeviceOptions o;
  o.localAddresses = {"127.0.0.1", "127.0.0.2"};
  o.tcp.streamsPerPath = 1;
  o.secret = "proxy-test-secret";
  o.wireSecurity = c.mode;
  o.chunkBytes = 64 * 1024;
  o.name = na;
  auto a = TcpDevice::create(o);
  o.name = nb;
  auto b = TcpDevice::create(o);
  if (!a.isOk() || !b.isOk()) {
    ADD_FAILURE() << "devices";
    return -1;
  }
  // Past the handshake (client 96 bytes, server 120) in either direction.
  const std::size_t at = c.toServer ? 20'000 : 400;
  auto proxy = std::make_unique<Proxy>((*b)->listenAddresses()[0], c.toServer, c.action, at);
  const auto viaProxy = encodeEndpoint({proxy->address(), (*b)->listenAddresses()[1]}).value();
  const std::uint64_t session = 0x9e55;
  const auto deadline = Clock::now() + kTimeout;
  Result<ChannelPtr> ba = internalError("not run");
  std::thread acceptor([&] { ba = (*b)->openChannel({session, 1, 0, false, (*a)->endpoint()}, deadline); });
  auto ab = (*a)->openChannel({session, 0, 1, true, viaProxy}, deadline);
  acceptor.join();
  if (!ab.isOk() || !ba.isOk()) {
    ADD_FAILURE() << ab.status().toString() << " / " << ba.status().toString();
    return -1;
  }
  const std::uint64_t failuresBefore = integrityFailures(na) + integrityFailures(nb);
  int changed = 0;
  constexpr int kMessages = 24;
  constexpr std::size_t kBytes = 256 * 1024;
  for (int m = 0; m < kMessages; ++m) {
    auto data = canaryBuffer(kBytes, m);
    std::vector<std::uint8_t> out(kBytes, 0);
    auto r = (*ba)->irecv(out.data(), out.size(), 7);
    auto s = (*ab)->isend(data.data(), data.size(), 7);
    if (!r.isOk() || !s.isOk()) {
      ADD_FAILURE() << "post";
      return -1;
    }
    Status rs = (*r)->wait(Clock::now() + kTimeout);
    Status ss = (*s)->wait(Clock::now() + kTimeout);
    if (!rs.isOk() || !ss.isOk()) {
      ADD_FAILURE() << "message " << m << ": " << rs.toString() << " / " << ss.toString();
      return -1;
    }
    if (out != data) ++changed;
  }
  *failures = integrityFailures(na) + integrityFailures(nb) - failuresBefore;
  *wire = proxy->captured();
  EXPECT_GT(wire->size(), at) << "the proxy carried the data path up to the change";
  return changed;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (WireSecurity m : {WireSecurity::kEncrypt, WireSecurity::kAuthenticate}) {
    for (Action a : {Action::kFlip, Action::kDrop, Action::kReplay, Action::kReorder, Action::kInject}) {
      for (bool up : {true, false}) v.push_back({m, a, up});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(OnPath, ProxyTest, ::testing::ValuesIn(cases()), [](const auto& p) {
  return fmt::format("{}_{}_{}", wireSecurityName(p.param.mode), actionName(p.param.action),
                     p.param.toServer ? "data" : "acks");
});

// The store through the proxy: a changed request or answer is never taken for a real one.
class StoreProxyTest : public ::testing::TestWithParam<bool> {};

TEST_P(StoreProxyTest, ChangedStoreTrafficFailsTheCallAndSetsNothing) {
  const bool toServer = GetParam();
  constexpr char kSecret[] = "store-proxy-secret";
  auto server = bootstrap::StoreServer::start("127.0.0.1", 0, kSecret);
  ASSERT_TRUE(server.isOk()) << server.status().toString();
  const std::string direct = fmt::format("127.0.0.1:{}", (*server)->port());
  // Past the handshake: inside the first request (SET) or the first answer.
  Proxy proxy(direct, toServer, Action::kFlip, toServer ? 96 + 30 : 120 + 10);
  const auto deadline = Clock::now() + kTimeout;
  auto tampered = bootstrap::TcpStore::connect(proxy.address(), kSecret, deadline);
  ASSERT_TRUE(tampered.isOk()) << tampered.status().toString();
  const std::vector<std::uint8_t> value{'v', 'a', 'l', 'u', 'e'};
  Status set = (*tampered)->set("key", value);
  auto clean = bootstrap::TcpStore::connect(direct, kSecret, deadline);
  ASSERT_TRUE(clean.isOk());
  if (toServer) {
    EXPECT_FALSE(set.isOk()) << "the server must drop a client whose request fails its tag";
    auto has = (*clean)->check({"key"});
    ASSERT_TRUE(has.isOk());
    EXPECT_FALSE(has.value()) << "a changed SET took effect";
  } else {
    EXPECT_FALSE(set.isOk()) << "a changed answer must fail the call, not pass as an answer";
    EXPECT_NE(set.message().find("integrity"), std::string::npos) << set.toString();
  }
  const auto wire = proxy.captured();
  EXPECT_FALSE(contains(wire, "value")) << "the store's values are readable on the wire";
}

INSTANTIATE_TEST_SUITE_P(OnPath, StoreProxyTest, ::testing::Bool(),
                         [](const auto& p) { return p.param ? std::string("request") : std::string("answer"); });

}  // namespace
}  // namespace meridian::transport::tcp
