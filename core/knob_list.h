// Every MERIDIAN_* environment variable, declared once: (identifier, name, default, range or
// choices, one sentence). The README's knob table is generated from this list
// (`meridian-knobs --markdown`, checked by tests/core/knobs_test).
//   STRING(id, "NAME", "default", "doc")
//   INT(id, "NAME", "default", min, max, "doc"): a value outside [min, max] is refused with one
//   message naming the knob and the range, wherever it is read (core/knobs.h).
//   INT_OR_ZERO(id, "NAME", "default", min, max, "doc"): the same, with 0 allowed too (it
//   means what the doc says: off, automatic).
//   CHOICE(id, "NAME", "default", "allowed|values", "doc"): an enumeration; a value outside
//   the allowed ones is refused the same way.
#define MERIDIAN_KNOBS(STRING, INT, INT_OR_ZERO, CHOICE)                                            \
  STRING(kLog, "MERIDIAN_LOG", "warn",                                                              \
    "Log level (trace, debug, info, warn, error, off), optionally followed by `:` and a comma "     \
    "list of subsystems (core, transport, routing, collectives, kernels, trainer, monitoring, lab, " \
    "bench, plugin) to restrict it to.")                                                            \
  STRING(kSecret, "MERIDIAN_SECRET", "",                                                            \
    "The job secret every connection proves it holds (HMAC-SHA256 challenge-response).")            \
  STRING(kSecretFile, "MERIDIAN_SECRET_FILE", "",                                                   \
    "A file holding the job secret, used when MERIDIAN_SECRET is not set.")                         \
  INT(kInsecure, "MERIDIAN_INSECURE", "0", 0, 1,                                                   \
    "1: let a job of several ranks run without a secret (on a well-known development one). "        \
    "Insecure: anyone who reaches its ports can join.")                                              \
  CHOICE(kWireSecurity, "MERIDIAN_WIRE_SECURITY", "encrypt", "encrypt|authenticate|off",           \
    "Every frame after the handshake: encrypt (AES-256-GCM), authenticate (GMAC: readable but "     \
    "tamper-proof) or off (insecure: no integrity at all). Both ends must agree.")                  \
  STRING(kCheckpointSecret, "MERIDIAN_CHECKPOINT_SECRET", "",                                       \
    "The secret meridian-train signs and verifies checkpoints with (HMAC-SHA256); empty: the job " \
    "secret, else the checkpoint directory's key file (checkpoint.key, 0600, made on first use).")  \
  INT(kRank, "MERIDIAN_RANK", "-1", -1, INT32_MAX,                                                  \
    "This process's rank; falls back to OpenMPI, torchrun or Slurm variables.")                     \
  INT(kWorldSize, "MERIDIAN_WORLD_SIZE", "-1", -1, INT32_MAX,                                       \
    "Number of ranks; falls back to OpenMPI, torchrun or Slurm variables.")                         \
  INT(kLocalRank, "MERIDIAN_LOCAL_RANK", "-1", -1, INT32_MAX,                                       \
    "This process's rank among the ranks on its host (with MERIDIAN_RANK; selects a GPU).")         \
  INT(kLocalWorldSize, "MERIDIAN_LOCAL_WORLD_SIZE", "-1", -1, INT32_MAX,                            \
    "How many ranks run on this host (with MERIDIAN_RANK).")                                        \
  STRING(kStore, "MERIDIAN_STORE", "",                                                              \
    "host:port of the bootstrap store hosted by rank 0; falls back to MASTER_ADDR/MASTER_PORT.")    \
  INT(kStoreFd, "MERIDIAN_STORE_FD", "-1", -1, INT32_MAX,                                           \
    "Set by the --ranks launchers for rank 0 only: an inherited socket already listening on "       \
    "MERIDIAN_STORE's port, which rank 0's store adopts instead of binding the port again.")        \
  INT(kStoreMaxValueBytes, "MERIDIAN_STORE_MAX_VALUE_BYTES", "67108864", 0, 64 << 20,                \
    "Largest value the bootstrap store takes in one SET, in bytes; a larger one is refused with "   \
    "an error (the connection stays usable).")                                                      \
  INT(kStoreMaxBytes, "MERIDIAN_STORE_MAX_BYTES", "268435456", 1 << 20, INT64_C(1) << 40,           \
    "Budget of the bootstrap store, in bytes: its keys and values plus the values of SETs still "   \
    "arriving; a SET beyond it is refused with an error.")                                          \
  INT(kStoreIdleTimeoutMs, "MERIDIAN_STORE_IDLE_TIMEOUT_MS", "300000", 10, INT32_MAX,              \
    "The store closes an authenticated connection that moved no byte for this long, in "           \
    "milliseconds (not one blocked in GET or WAIT); its client reconnects when it next calls.")     \
  STRING(kPaths, "MERIDIAN_PATHS", "",                                                              \
    "Comma-separated local IPv4 addresses, one per network path; empty means the address that "     \
    "reaches the store.")                                                                           \
  INT(kTcpStreams, "MERIDIAN_TCP_STREAMS", "2", 1, 16, "TCP streams per path to each peer.")          \
  INT_OR_ZERO(kTcpSockBufBytes, "MERIDIAN_TCP_SOCKBUF_BYTES", "4194304", 64 << 10, 1 << 30,         \
    "Send and receive socket buffer size requested for data streams, in bytes (0: the kernel's "    \
    "autotuning).")                                                                                 \
  INT_OR_ZERO(kTcpNotsentLowatBytes, "MERIDIAN_TCP_NOTSENT_LOWAT_BYTES", "262144", 16 << 10, 1 << 30, \
    "Unsent bytes a data stream may leave in the kernel (TCP_NOTSENT_LOWAT; 0: no limit), so "      \
    "acknowledgements need not queue behind seconds of a slow path's data.")                        \
  INT(kChunkBytes, "MERIDIAN_CHUNK_BYTES", "524288", 4096, 64 << 20,                                \
    "Size of the chunks a message is cut into and striped over paths, in bytes.")                   \
  INT(kPathStallMs, "MERIDIAN_PATH_STALL_MS", "3000", 10, 3600000,                                  \
    "A path with unacknowledged chunks and no acknowledgement for this long is declared stalled "   \
    "and its chunks are resent on other paths (a path too slow for its bytes in flight gets "       \
    "twice what its measured rate needs, at most 4x this).")                                        \
  INT(kMaxUnexpectedBytes, "MERIDIAN_MAX_UNEXPECTED_BYTES", "1073741824", 1 << 20, INT64_C(1) << 40, \
    "Bytes a peer may send ahead of matching receives before its channel fails.")                   \
  INT(kTimeoutMs, "MERIDIAN_TIMEOUT_MS", "120000", 1, INT32_MAX,                                    \
    "Deadline for bootstrap, connection set-up and blocking collectives, in milliseconds.")         \
  INT(kPeerTimeoutMs, "MERIDIAN_PEER_TIMEOUT_MS", "5000", 100, 3600000,                             \
    "A peer from which nothing was heard for this long (no probe echo, no link-state row, sent "    \
    "every MERIDIAN_LINK_STATE_INTERVAL_MS, no byte on its channel) is declared lost, as is one "    \
    "whose channel failed. 5 s: 20 round trips London-Singapore and 5 heartbeats.")                 \
  CHOICE(kElastic, "MERIDIAN_ELASTIC", "off", "on|off",                                             \
    "on: once the survivors of a lost rank agree on the new membership, a communicator builds its " \
    "successor over them, and its ops fail with `aborted: membership epoch N` until the caller "    \
    "takes it (Communicator::successor, docs/elastic.md); off: a lost rank breaks it for good. "    \
    "meridian-train turns it on unless --elastic off.")                                             \
  CHOICE(kJoin, "MERIDIAN_JOIN", "off", "on|off",                                                   \
    "on: meridian-train joins the running elastic job at MERIDIAN_STORE (as --join does), asking "  \
    "for MERIDIAN_RANK back; meridian-lab restarts a node's rank with it (docs/elastic.md).")       \
  INT(kSmallAllreduceBytes, "MERIDIAN_SMALL_ALLREDUCE_BYTES", "65536", 0, INT64_C(1) << 40,         \
    "Allreduce messages up to this size use recursive doubling; larger ones use the ring.")         \
  INT(kRingSegmentBytes, "MERIDIAN_RING_SEGMENT_BYTES", "1048576", 1024, INT64_C(1) << 34,          \
    "Pipelining segment of the ring algorithms, in bytes.")                                         \
  STRING(kRegion, "MERIDIAN_REGION", "",                                                            \
    "This rank's region (e.g. london); empty: inferred by clustering the measured round trips.")    \
  INT(kProbeIntervalMs, "MERIDIAN_PROBE_INTERVAL_MS", "100", 10, 60000,                             \
    "Period of the probes sent on every path to every peer, in milliseconds.")                      \
  CHOICE(kRouting, "MERIDIAN_ROUTING", "adaptive", "adaptive|static",                               \
    "adaptive: re-plan collectives and path weights from measurements; static: never adapt.")       \
  CHOICE(kNcclDevices, "MERIDIAN_NCCL_DEVICES", "virtual", "virtual|paths",                         \
    "NCCL net plugin: virtual (one device spanning every path, striped inside) or paths (one "      \
    "device per path, for NCCL to choose among).")                                                  \
  STRING(kNcclLinks, "MERIDIAN_NCCL_LINKS", "",                                                     \
    "NCCL net plugin: a `meridian-probe --json` report of the job's links; the plugin's devices "   \
    "then report NCCL the measured one-way latency to the farthest region and, from a report "      \
    "made with --rate-seconds, the measured speed (needs MERIDIAN_REGION).")                        \
  CHOICE(kDirectRead, "MERIDIAN_DIRECT_READ", "auto", "auto|off",                                   \
    "auto: ranks on one host (same boot, user, network and PID namespaces) that may read each "     \
    "other's memory move messages above 64 KiB by reading them from the sender (process_vm_readv), " \
    "one copy instead of loopback TCP's two; off: always through the sockets.")                     \
  CHOICE(kShm, "MERIDIAN_SHM", "auto", "auto|off",                                                 \
    "auto: ranks on one host (same boot, user and namespaces) talk through shared memory: "       \
    "every channel to such a peer gets a shared-memory path (a /dev/shm segment per pair, 4 MiB "  \
    "down to 260 KiB as peers on the host grow, "                                                   \
    "its TCP paths on standby), and when every rank of a communicator shares the host, allreduce " \
    "and barrier run through a 4 MiB segment per rank (segments are unlinked once mapped); "        \
    "off: TCP (and direct reads) only.")                                           \
  CHOICE(kFabric, "MERIDIAN_FABRIC", "auto", "auto|on|off",                                         \
    "Fabric paths through libfabric beside the TCP paths of every channel: auto (only where a "     \
    "real RDMA provider, verbs;ofi_rxm or efa, is present), on (the provider MERIDIAN_FABRIC_"      \
    "PROVIDER names, or the best present; a rail that cannot open fails the device) or off.")       \
  STRING(kFabricProvider, "MERIDIAN_FABRIC_PROVIDER", "",                                           \
    "libfabric provider of the fabric paths: verbs;ofi_rxm, efa, tcp;ofi_rxm or shm (empty: the "   \
    "best present, in that order; with auto, RDMA ones only).")                                     \
  STRING(kFabricDomain, "MERIDIAN_FABRIC_DOMAIN", "",                                               \
    "libfabric domain (NIC) of the fabric paths, as fi_info lists it (mlx5_0, lo); empty: the "     \
    "first the provider offers.")                                                                   \
  CHOICE(kFabricTcp, "MERIDIAN_FABRIC_TCP", "data", "data|standby",                                 \
    "With fabric paths: data (the TCP paths carry data beside them, striped by measured rate) or "  \
    "standby (TCP carries control only, and the data while no fabric path to that peer is "         \
    "usable).")                                                                                     \
  CHOICE(kRelay, "MERIDIAN_RELAY", "auto", "auto|off",                                              \
    "auto: with adaptive routing, a channel adds a relay path through a third rank while its "      \
    "direct link is worse than two hops; off: never (every rank must agree).")                      \
  CHOICE(kAlgo, "MERIDIAN_ALGO", "auto",                                                            \
         "auto|ring|recursive_doubling|hierarchical|direct",                                        \
    "Allreduce algorithm: auto (shared memory when every rank shares one host and MERIDIAN_SHM "    \
    "allows, else the direct exchange when at most 8 ranks share one host and read each other, "   \
    "else the planner's choice once links are measured), ring, recursive_doubling, hierarchical "   \
    "(by region) or direct (two rounds of all-to-all exchange).")                                   \
  INT(kLinkStateIntervalMs, "MERIDIAN_LINK_STATE_INTERVAL_MS", "1000", 10, 3600000,                 \
    "Period at which every rank sends its row of the link-state table to the others, in "           \
    "milliseconds.")                                                                                \
  INT(kReplanIntervalMs, "MERIDIAN_REPLAN_INTERVAL_MS", "5000", 0, 86400000,                        \
    "Least time between two collective re-plans by rank 0, in milliseconds.")                       \
  INT(kChaosReplanMs, "MERIDIAN_CHAOS_REPLAN_MS", "0", 0, 86400000,                                 \
    "Testing: rank 0 forces a random valid plan this often, in milliseconds (0: never).")           \
  STRING(kMetricsAddr, "MERIDIAN_METRICS_ADDR", "",                                                 \
    "host:port where local rank 0 serves Prometheus metrics on /metrics (local rank r: port + "     \
    "r); unset: 127.0.0.1:9400; 0: off.")                                                           \
  STRING(kPlanes, "MERIDIAN_PLANES", "",                                                            \
    "Names of the planes of MERIDIAN_PATHS, comma-separated in the same order (e.g. "               \
    "wan-a,wan-b); they label per-path metrics (meridian-lab sets them).")                          \
  STRING(kPrometheusSdDir, "MERIDIAN_PROMETHEUS_SD_DIR", "",                                        \
    "Directory of the Prometheus file-based service discovery files that meridian-lab and the "     \
    "--ranks launchers keep current with every rank's metrics endpoint; unset: prometheus-sd in "   \
    "this user's private directory ($XDG_RUNTIME_DIR/meridian, /run/user/UID/meridian, else "       \
    "/tmp/meridian-UID, mode 0700). Refused unless owned by this user and writable by nobody else.")

#include <cstdint>  // the ranges above

namespace meridian {}  // keeps this header a valid translation unit on its own
