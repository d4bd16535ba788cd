// The TCP device's insides, shared by the files that each do one of its jobs:
//   event_loop.cc  the epoll loop, the progress lock and commands run on the progress thread
//   acceptor.cc    listeners, the server side of the handshake, claiming accepted streams
//   stream.cc      per-stream framing: reading and writing frames, acks, kernel figures
//   relay.cc       splicing relay paths between two other ranks
//   fabric.cc      fabric rails (libfabric) and the fabric paths of channels
//   tcp_device.cc  the Device API
// Private to transport/tcp; nothing outside includes it.
#pragma once

#include <pthread.h>
#include <sys/epoll.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // struct tcp_info with the delivery rate (glibc's copy predates it)
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "core/check.h"
#include "core/fd.h"
#include "core/knobs.h"
#include "core/log.h"
#include "core/log_limit.h"
#include "core/process_exit.h"
#include "core/wire.h"
#include "transport/engine.h"
#include "transport/fabric/link.h"
#include "transport/fabric/path.h"
#include "transport/shm/pairing.h"
#include "transport/shm/path.h"
#include "transport/tcp/direct_read.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/pending.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/splice.h"
#include "transport/tcp/tcp_device.h"

namespace meridian::transport::tcp {

// Headers, acks and small payloads are read through a small stream buffer; the rest of a
// larger payload goes straight from the socket into its destination (no extra copy).
inline constexpr std::size_t kReadBufferBytes = 8 * 1024;
inline constexpr std::size_t kDirectReadMinBytes = 8 * 1024;
// With MERIDIAN_WIRE_SECURITY=encrypt payloads cannot be read in place: they come through a
// larger read buffer (decrypted from it into place) and leave from a staging buffer of the
// same size (encrypted into it).
inline constexpr std::size_t kSealedBufferBytes = 128 * 1024;
inline constexpr std::size_t kReadBudgetBytes = 8u << 20;
// Acks of chunks this large go out at once (their sender waits for them); smaller ones
// wait up to kAckDelayUs for company, or until kAckBatchBytes of them are queued.
inline constexpr std::uint32_t kUrgentAckChunkBytes = 64 * 1024;
inline constexpr std::int64_t kAckDelayUs = 200;
inline constexpr std::size_t kAckBatchBytes = 32 * kFrameHeaderBytes;
inline constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// Connections still in the handshake, per listener and per source address (pending.h: past
// either cap the oldest such connection is closed to make room).
inline constexpr std::size_t kMaxPendingPerListener = 256;
inline constexpr std::size_t kMaxPendingPerSource = 32;
// Relays this device carries for others: each holds two buffers of kSpliceBufferBytes.
inline constexpr std::size_t kMaxSplices = 64;
inline constexpr std::size_t kSpliceBufferBytes = 256 * 1024;

// What the client of a data stream tells the server: which stream of which path it is.
inline ConnectInfo dataStreamInfo(std::uint64_t sessionId, int rank, std::size_t path, int stream, int streams,
                                  std::size_t paths) {
  ConnectInfo info;
  info.pathCount = static_cast<std::uint8_t>(paths);
  info.kind = ConnectionKind::kDataStream;
  info.sessionId = sessionId;
  info.rank = rank;
  info.pathIndex = static_cast<std::uint16_t>(path);
  info.streamIndex = static_cast<std::uint16_t>(stream);
  info.streamCount = static_cast<std::uint16_t>(streams);
  return info;
}


// An accepted connection still in the server side of the handshake; counted by its
// listener's PendingConnections until it is destroyed.
struct PendingHandshake {
  PendingHandshake(std::string secret, WireSecurity mode, ServerHandshake::Admit admit)
      : machine(std::move(secret), mode, std::move(admit)) {}
  ~PendingHandshake() {
    if (tracker != nullptr) tracker->remove(trackedFd);
  }
  PendingHandshake(const PendingHandshake&) = delete;
  PendingHandshake& operator=(const PendingHandshake&) = delete;
  PendingConnections* tracker = nullptr;
  int trackedFd = -1;  // the number tracker knows it by (fd may have moved on by now)
  UniqueFd fd;
  std::string peer;
  TimePoint deadline;
  ServerHandshake machine;
  std::vector<std::uint8_t> in;   // bytes of the machine's next input so far
  std::vector<std::uint8_t> out;  // its last answer, and how much of it went out
  std::size_t outDone = 0;
};

// An authenticated stream that no channel has claimed yet.
struct UnclaimedStream {
  UniqueFd fd;
  ConnectInfo info;
  SessionKeys keys;
  TimePoint deadline;
};

struct Stream {
  UniqueFd fd;
  std::size_t path = 0;
  struct ChannelEntry* entry = nullptr;
  bool dead = false;
  bool gotClose = false;
  bool wantOut = false;
  // Every frame travels in sealed records (core/aead.h): the header as one, its payload (a
  // chunk, a remote reference, rail names) as the next. tx seals what this end writes, rx
  // opens what it reads; with MERIDIAN_WIRE_SECURITY=off they add nothing.
  std::unique_ptr<RecordCipher> tx, rx;
  // What the channel's fabric paths derive their keys from (fabric/link.h): this stream's
  // sending and receiving keys, expanded.
  fabric::FabricSeed fabricSeedOut{}, fabricSeedIn{};
  // Reading.
  bool inPayload = false;
  bool payloadRecord = false;  // the payload is a streamed record whose tag follows it
  std::uint8_t header[kFrameHeaderBytes + kAeadTagBytes] = {};
  std::uint8_t tagIn[kAeadTagBytes] = {};
  std::size_t tagGot = 0;
  std::size_t rcap = 0;  // rbuf's size
  std::size_t headerGot = 0;
  RecvTarget target;
  std::uint64_t payloadGot = 0;
  std::unique_ptr<std::uint8_t[]> rbuf;
  std::size_t rpos = 0, rlen = 0;
  // Moves buffered bytes into dst until *got reaches need; true once it has.
  bool takeBuffered(std::uint8_t* dst, std::size_t* got, std::size_t need) {
    std::size_t take = std::min(need - *got, rlen - rpos);
    std::memcpy(dst + *got, rbuf.get() + rpos, take);
    *got += take;
    rpos += take;
    return *got == need;
  }
  std::uint8_t drain[16 * 1024];
  // A kDataRef frame whose address is still arriving.
  bool refPending = false;
  FrameHeader refHeader;
  std::uint8_t refIn[kRemoteRefBytes + kAeadTagBytes] = {};
  std::size_t refGot = 0;
  // Writing: control frames (acks, close, rail names) go out between data frames. They
  // queue in ctrl as plain frames and are sealed into `wire` (in the order they go out)
  // when no data frame is under way.
  std::vector<std::uint8_t> ctrl;
  std::vector<std::size_t> ctrlRecords;  // the sizes of ctrl's records, in order
  std::vector<std::uint8_t> wire;
  std::size_t wireDone = 0;
  bool ctrlUrgent = false;      // an ack of a large chunk (its sender waits for it)
  std::int64_t ctrlSinceUs = 0; // when the oldest unsent control frame was queued
  bool writing = false;
  OutChunk chunk;
  std::array<std::uint8_t, kFrameHeaderBytes + kAeadTagBytes> chunkHeader{};  // sealed
  std::uint64_t written = 0;  // of the frame's bytes on the wire: header record, payload, tag
  std::uint64_t frameBytes = 0;
  std::uint32_t payloadBytes = 0;              // the chunk's payload (kData)
  bool writingRef = false;                     // the frame is a kDataRef: refOut is its payload
  std::array<std::uint8_t, kRemoteRefBytes + kAeadTagBytes> refOut{};  // sealed
  std::uint64_t payloadSealed = 0;  // payload bytes fed to tx so far
  bool tagSealed = false;
  std::uint8_t tagOut[kAeadTagBytes] = {};
  // encrypt: the payload's ciphertext goes out of `stage`, sealed a piece at a time.
  std::unique_ptr<std::uint8_t[]> stage;
  std::size_t stagePos = 0, stageLen = 0;
  int notsentLowat = 0;  // TCP_NOTSENT_LOWAT in force (0: none)
  // A PATH-NAMES frame whose payload is still arriving.
  bool namesPending = false;
  bool namesShm = false;  // ... a kShmPairing frame (shm.cc), not rail names
  std::vector<std::uint8_t> namesIn;
  std::size_t namesGot = 0;
};

struct ChannelEntry {
  std::uint64_t sessionId = 0;
  int peerRank = 0;
  ChannelPtr channel;                      // the user side, handed to the caller
  std::shared_ptr<ChannelEngine> engine;   // the same channel as this device drives it
  // The kernel's figures per path as gauges (registered at the first reading).
  struct TcpGauges {
    Gauge* rttSeconds = nullptr;
    Gauge* deliveryBytesPerSec = nullptr;
    Gauge* retransmits = nullptr;
  };
  std::vector<TcpGauges> tcpGauges;
  // The channel's paths: [0, directPaths) TCP, then the relay slot (MERIDIAN_RELAY), then
  // one fabric path per rail from fabricBase on (down until the peer's rail names came).
  std::vector<std::vector<std::unique_ptr<Stream>>> streams;  // [path][stream], TCP paths and the relay slot
  std::vector<int> expectedStreams;                           // per path; 0 = not known yet
  std::size_t directPaths = 0;                                // paths beyond these: the relay slot
  std::vector<std::unique_ptr<fabric::FabricPath>> fabric;    // [rail]; null until paired
  bool railNamesSent = false, railNamesTaken = false;
  fabric::FabricSeed fabricSeedOut{};  // of the stream our rail names went out on
  int initiatorRank = 0;  // the rank that opened the channel (fabric path tags)
  std::vector<std::string> peerAddresses;                     // the peer's listen addresses
  std::int64_t readPid = 0;                                   // direct reads from this pid (0: none)
  // The shared-memory path (MERIDIAN_SHM=auto; shm.cc), after the fabric paths: its slot
  // (SIZE_MAX: none), the path once paired, and on the responder the segment it offered
  // until the initiator attached, with the initiator's pid and doorbell from its hello.
  std::size_t shmSlot = SIZE_MAX;
  std::unique_ptr<shm::ShmPath> shm;
  std::unique_ptr<shm::ShmSegment> shmOffered;
  std::int32_t shmPeerPid = 0;
  int shmPeerDoorbell = -1;
  bool shmPairingDone = false;  // paired, or refused either way: later messages are refused
  int shmHostPeers = 1;         // ranks of the group on this host besides us (ring sizes)
  ProcessExitFd shmPeerExit;    // the peer's process, in epoll: readable once it exited
  bool ready = false;
  bool usable() const { return ready && !engine->failed(); }
  // The channel's path index of fabric path 0 (the fabric paths follow the stream paths).
  std::size_t fabricBase() const { return streams.size(); }
  bool liveStreams(std::size_t path) const { return liveStreamCount(path) > 0; }
  std::size_t liveStreamCount(std::size_t path) const {
    return static_cast<std::size_t>(
        std::count_if(streams[path].begin(), streams[path].end(), [](const auto& s) { return !s->dead; }));
  }
};

// A relay this device carries between two other ranks.
struct RelayEntry {
  std::unique_ptr<Splice> splice;
  std::uint32_t eventsA = 0, eventsB = 0;  // registered with epoll
  std::uint64_t counted = 0;               // bytes already added to the metric
  std::string what;                        // "rank 1 -> rank 2 (session ...)"
};

// The progress thread's doorbell (an eventfd). Channels hold it by shared_ptr, so a
// thread posting to a channel while its device is being destroyed rings a live eventfd.
struct Waker {
  UniqueFd fd;
  std::atomic<bool> pending{false};
  void ring() {
    if (!pending.exchange(true, std::memory_order_acq_rel)) {
      std::uint64_t one = 1;
      // EAGAIN: the counter is full, so the thread is woken anyway.
      if (::write(fd.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
        MLOG_ERROR(kTransport, "waking the progress thread: {}", errnoText(errno));
      }
    }
  }
};

// Closes the sending side of a stream; a peer that is gone already (ENOTCONN) is fine.
inline void shutdownStream(int fd, int how) {
  if (::shutdown(fd, how) != 0 && errno != ENOTCONN) {
    MLOG_DEBUG(kTransport, "shutdown(fd {}): {}", fd, errnoText(errno));
  }
}

// Progress from waiting threads: whoever holds `mu` runs the engine (the progress thread
// or a thread in Request::wait). `impl` is cleared when the device goes away; requests
// that outlive it then simply wait.
struct Poller : Progressor {
  std::mutex mu;
  struct TcpDevice::Impl* impl = nullptr;
  bool pollOnce(bool* ran = nullptr) override;
  void beginPolling() override { pollers.fetch_add(1, std::memory_order_acq_rel); }
  void endPolling(bool handOver) override {
    if (pollers.fetch_sub(1, std::memory_order_acq_rel) == 1 && handOver) {
      lastPollUs.store(0, std::memory_order_relaxed);
      std::lock_guard lock(idleMu);
      idleCv.notify_all();
    }
  }
  // Whether a thread outside the engine drives it now: one in Request::wait, or one that
  // called pollOnce (Request::test, NCCL's proxy through the plugin) within kTesterUs.
  bool othersPolling() const {
    return pollers.load(std::memory_order_acquire) > 0 ||
           nowUs() - lastPollUs.load(std::memory_order_relaxed) < kTesterUs;
  }
  static constexpr std::int64_t kTesterUs = 1000;
  std::atomic<int> pollers{0};
  static constexpr unsigned kShmPollsPerEpoll = 8;
  unsigned polls = 0;  // under mu
  std::atomic<std::int64_t> lastPollUs{0};
  std::mutex idleMu;
  std::condition_variable idleCv;
};

struct TcpDevice::Impl {
  DeviceOptions options;
  std::shared_ptr<Poller> poller = std::make_shared<Poller>();
  std::uint64_t maxUnexpectedBytes = 0;
  std::chrono::milliseconds unclaimedTimeout{0};
  std::vector<UniqueFd> listeners;
  std::vector<std::string> listenAddrs;
  // Per listener: its connections still in the handshake (caps, deadlines; pending.h).
  std::vector<std::unique_ptr<PendingConnections>> pending;
  // Lines an outsider can provoke, a few a second per reason (core/log_limit.h).
  LogRateLimiter refusedLog, timedOutLog, evictedLog;
  EndpointName endpointName;  // listenAddrs, encoded (endpoint.h)
  std::vector<std::string> localIps;
  // Same-host direct reads per (session, peer), from joinGroup or planDirectRead.
  std::mutex planMu;
  std::map<std::pair<std::uint64_t, int>, DirectReadPlan> directPlans;
  UniqueFd epfd;
  std::shared_ptr<Waker> waker = std::make_shared<Waker>();
  std::atomic<bool> running{true};
  std::thread thread;

  std::mutex cmdMu;
  std::condition_variable cmdCv;
  std::vector<std::function<void()>> commands;

  // Progress-thread state.
  std::map<int, std::unique_ptr<PendingHandshake>> handshakes;  // by fd
  std::vector<UnclaimedStream> unclaimed;
  // Fabric rails (MERIDIAN_FABRIC; fabric.cc): declared before the channels, whose fabric
  // paths point into them and go first. Touched only by whoever holds poller->mu.
  std::vector<std::unique_ptr<fabric::Rail>> rails;
  // registerMemory's registrations on the rails: [key] = one handle per rail, in rail order.
  std::map<std::uint64_t, std::vector<std::uint64_t>> regions;
  std::uint64_t lastRegionKey = 0;
  std::vector<std::string> railLabels;  // each rail's address, for the channels' path names
  bool pollRails = false;  // some rail has no fd to sleep on: the loop polls it
  std::vector<std::unique_ptr<ChannelEntry>> channels;
  std::map<int, Stream*> streamsByFd;
  std::vector<std::unique_ptr<RelayEntry>> relays;
  std::map<int, RelayEntry*> relaysByFd;
  Counter* relayedBytes = nullptr;
  Counter* directReadBytes = nullptr;  // chunk bytes read straight from same-host peers' memory
  Counter* integrityFailures = nullptr;  // records from peers that failed their tag
  std::int64_t lastStallCheckUs = 0;
  std::int64_t lastTcpInfoUs = 0;
  static constexpr std::int64_t kTcpInfoPeriodUs = 1'000'000;  // TCP_INFO of every stream, once a second
  // A stream's unsent bytes in the kernel are held to what it delivers in this long, and to
  // no less than MERIDIAN_TCP_NOTSENT_LOWAT_BYTES: on a slow path, a deep send buffer of
  // unsent chunks would hold the acknowledgements queued behind them for seconds (and look
  // like a stall to the peer), and keep chunks on it that a faster path could take; on a fast
  // one, a small limit would only cost wake-ups.
  static constexpr double kNotsentHorizonSec = 0.02;
  // Sets a stream's TCP_NOTSENT_LOWAT for its measured delivery rate (0: not known yet).
  void limitUnsent(Stream& s, double deliveryBytesPerSec);

  void wake() { waker->ring(); }

  // Runs `fn` on the progress thread and waits for it.
  void runOnProgress(std::function<void()> fn) {
    bool done = false;
    {
      std::lock_guard lock(cmdMu);
      commands.push_back([&, fn = std::move(fn)] {
        fn();
        std::lock_guard l(cmdMu);
        done = true;
        cmdCv.notify_all();
      });
    }
    wake();
    std::unique_lock lock(cmdMu);
    cmdCv.wait(lock, [&] { return done; });
  }

  // Registers `fd` with epoll (add) or changes its events. Fails only when the kernel is out
  // of memory or the fd is not what the caller thinks: the caller drops that connection.
  Status epollSet(int fd, std::uint32_t events, bool add) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    if (::epoll_ctl(epfd.get(), add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) != 0) {
      return internalError("epoll_ctl({}, fd {}): {}", add ? "add" : "mod", fd, errnoText(errno));
    }
    return Status::ok();
  }
  // Takes `fd` out of epoll before it closes. ENOENT/EBADF (already out) are fine; anything
  // else is logged, since the fd is about to close and epoll forgets it then anyway.
  void epollDel(int fd) {
    if (::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, fd, nullptr) != 0 && errno != ENOENT && errno != EBADF) {
      MLOG_WARN(kTransport, "epoll_ctl(del, fd {}): {}", fd, errnoText(errno));
    }
  }

  void loop();
  // The loop's rounds until the device stops (loop() catches what escapes them).
  void runRounds(epoll_event* events);
  // One round of the engine over `n` ready events; the caller holds poller->mu.
  // One round; true when it moved anything: an event other than a rail's wait fd, or a rail
  // completion (a rail's fd stays readable while its provider has bytes to chew on, which is
  // no reason for a waiting thread to keep spinning).
  bool processEvents(const epoll_event* events, int n);
  void acceptAll(std::size_t listenerIndex);
  void stepHandshake(PendingHandshake& hs, std::uint32_t events);
  // Closes the handshakes whose deadline passed.
  void expireHandshakes(TimePoint now);
  // Whether an authenticated client may have what it asks for (ServerHandshake::Admit).
  Status admit(const ConnectInfo& info);
  void claimStreams();
  ChannelEntry* findChannel(std::uint64_t sessionId, int peerRank);
  // A new channel entry (not yet in `channels`) over `endpoints` (+ the relay slot, the
  // fabric paths, and with `sharedMemory` a shared-memory path, TCP on standby beside it).
  std::unique_ptr<ChannelEntry> makeEntry(std::uint64_t sessionId, int peerRank, std::vector<PathEndpoints> endpoints,
                                          std::vector<std::string> peerAddresses, bool peerReadsDirect = false,
                                          bool sharedMemory = false);
  // acceptChannel's search (progress thread).
  Result<std::pair<int, ChannelPtr>> acceptAny(std::uint64_t sessionId);
  // Why a relay request may not be served (ok: it may).
  Status checkRelayRequest(const ConnectInfo& info);
  void startRelay(PendingHandshake& hs);
  void stepRelay(RelayEntry& r);
  // Forgets a relay and closes both its ends.
  void endRelay(RelayEntry& r);
  // Queues a CLOSE frame on a stream between frames and sends it (bounded wait).
  void sayGoodbye(Stream& s);
  void attachStream(ChannelEntry& e, UniqueFd fd, std::size_t path, const SessionKeys& keys);
  void readStream(Stream& s);
  // Queues a control frame (a header, and a payload for those that have one) on a stream;
  // each becomes its own record when sealed.
  void queueControl(Stream& s, std::span<const std::uint8_t> header, std::span<const std::uint8_t> payload,
                    bool urgent);
  // Seals the queued control frames into the stream's output (only between data frames).
  void sealControl(Stream& s);
  // Starts writing `s.chunk` as a frame: seals its header (and reference) records.
  void startFrame(Stream& s);
  // A record from the peer failed its tag: the path fails, saying "integrity".
  void failIntegrity(Stream& s, std::string_view what);
  // A chunk's header (kData, or a kDataRef's once its address arrived) is in: finds its
  // target and starts the payload. False when it failed the channel and the path.
  bool beginChunk(Stream& s, const FrameHeader& h);
  // The address of a kDataRef chunk has arrived: reads the chunk from the peer's memory into
  // its target. False when it failed the channel and the path.
  bool readDirectChunk(Stream& s);
  // The peer broke the protocol on this path: the channel fails, and the path with it.
  void failChannel(ChannelEntry& e, std::size_t path, const Status& why);
  void flushStream(Stream& s);
  void failPath(ChannelEntry& e, std::size_t path, const Status& why, bool graceful);
  // Closes one stream now (no goodbye) and forgets its fd and any frame in progress.
  void closeStream(Stream& s);
  void progressChannels();
  // Passes the kernel's figures of each path's streams to the channel (PathStats).
  void readTcpInfo(ChannelEntry& e);
  void shutdownAll();
  MultipathConfig channelConfig() const;

  // ---- fabric paths (fabric.cc)
  // Opens the rails MERIDIAN_FABRIC asks for (create; before the progress thread starts).
  Status openRails();
  // Sends this side's rail names on the channel's first stream (once, when it is ready).
  void sendRailNames(ChannelEntry& e);
  // The peer's rail names arrived: pairs rail k with the peer's rail k and brings the
  // fabric paths up. A bad name keeps that path down (the channel goes on without it).
  // `from`: the stream they came on (its keys give the receiving direction's).
  void takeRailNames(ChannelEntry& e, const Stream& from, std::span<const std::uint8_t> bytes);
  // One round of the rails' completions (before the events), and of every channel's
  // fabric paths (after them).
  std::size_t progressRails();  // completions handled
  void pumpFabricPaths(ChannelEntry& e, std::int64_t now);
  // The milliseconds the loop may sleep in epoll as far as the rails are concerned.
  int railSleepMs(int wanted);
  // Says goodbye on and drops every fabric path of the channel.
  void closeFabricPaths(ChannelEntry& e);

  // Shared-memory paths (shm.cc).
  bool shmEnabled() const { return options.shm == "auto"; }
  // The initiator's hello, once the channel is ready.
  void startShmPairing(ChannelEntry& e);
  // A pairing message came on `from` (answers go back on it).
  void takeShmPairing(ChannelEntry& e, Stream& from, std::span<const std::uint8_t> bytes);
  void sendShmPairing(Stream& via, const shm::PairingMessage& m);
  // Brings the path up over `segment` (the peer's doorbell taken from its process).
  void startShmPath(ChannelEntry& e, shm::ShmSegment segment, bool creator, std::int32_t peerPid, int peerDoorbell);
  // Before the engine schedules (acknowledgements open windows), and after it.
  std::size_t receiveShmPath(ChannelEntry& e, std::int64_t now);
  std::size_t sendShmPath(ChannelEntry& e, std::int64_t now);
  // How long the loop may sleep given the shared-memory paths (flags raised for their peers).
  int shmSleepMs(int wanted);
  // The progress thread woke (from the sleep shmSleepMs allowed): flags down.
  void shmAwake();
  void closeShmPath(ChannelEntry& e);
  // The peer's process exited (its pidfd, `fd`, became readable): the path fails at once,
  // not at its next look at the process (ShmPathConfig::peerPid). False: `fd` is no pidfd.
  bool takeShmPeerExit(int fd);
  void stopWatchingShmPeer(ChannelEntry& e);
  std::map<int, ChannelEntry*> shmPeerExits;  // pidfd -> its channel
  std::size_t shmWork = 0;  // records the shared-memory paths moved in this round
  std::size_t liveShmPaths = 0;  // channels whose shared-memory path is up (under poller->mu)
};

}  // namespace meridian::transport::tcp
