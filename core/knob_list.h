// Every MERIDIAN_* environment variable, declared once: (identifier, name, type, default,
// one sentence). The README's knob table is generated from this list
// (`meridian-knobs --markdown`, checked by tests/core/knobs_test).
//   X(id, "NAME", Int|String, "default", "doc")
//   CHOICE(id, "NAME", "default", "allowed|values", "doc"): an enumeration; a value outside
//   the allowed ones is refused with one message wherever it is read (core/knobs.h).
#define MERIDIAN_KNOBS(X, CHOICE)                                                                  \
  X(kLog, "MERIDIAN_LOG", String, "warn",                                                          \
    "Log level (trace, debug, info, warn, error, off), optionally followed by `:` and a comma "     \
    "list of subsystems (core, transport, routing, collectives, kernels, trainer, monitoring, lab, " \
    "bench, plugin) to restrict it to.")                                                           \
  X(kSecret, "MERIDIAN_SECRET", String, "",                                                        \
    "The job secret every connection proves it holds (HMAC-SHA256 challenge-response).")           \
  X(kSecretFile, "MERIDIAN_SECRET_FILE", String, "",                                               \
    "A file holding the job secret, used when MERIDIAN_SECRET is not set.")                        \
  X(kInsecure, "MERIDIAN_INSECURE", Int, "0",                                                      \
    "1: let a job of several ranks run without a secret (on a well-known development one). "        \
    "Insecure: anyone who reaches its ports can join.")                                              \
  CHOICE(kWireSecurity, "MERIDIAN_WIRE_SECURITY", "encrypt", "encrypt|authenticate|off",           \
    "Every frame after the handshake: encrypt (AES-256-GCM), authenticate (GMAC: readable but "     \
    "tamper-proof) or off (insecure: no integrity at all). Both ends must agree.")                  \
  X(kCheckpointSecret, "MERIDIAN_CHECKPOINT_SECRET", String, "",                                   \
    "The secret meridian-train signs and verifies checkpoints with (HMAC-SHA256); empty: the job " \
    "secret, else the checkpoint directory's key file (checkpoint.key, 0600, made on first use).")  \
  X(kRank, "MERIDIAN_RANK", Int, "-1",                                                             \
    "This process's rank; falls back to OpenMPI, torchrun or Slurm variables.")                    \
  X(kWorldSize, "MERIDIAN_WORLD_SIZE", Int, "-1",                                                  \
    "Number of ranks; falls back to OpenMPI, torchrun or Slurm variables.")                        \
  X(kLocalRank, "MERIDIAN_LOCAL_RANK", Int, "-1",                                                  \
    "This process's rank among the ranks on its host (with MERIDIAN_RANK; selects a GPU).")       \
  X(kLocalWorldSize, "MERIDIAN_LOCAL_WORLD_SIZE", Int, "-1",                                       \
    "How many ranks run on this host (with MERIDIAN_RANK).")                                        \
  X(kStore, "MERIDIAN_STORE", String, "",                                                          \
    "host:port of the bootstrap store hosted by rank 0; falls back to MASTER_ADDR/MASTER_PORT.")   \
  X(kPaths, "MERIDIAN_PATHS", String, "",                                                          \
    "Comma-separated local IPv4 addresses, one per network path; empty means the address that "    \
    "reaches the store.")                                                                          \
  X(kTcpStreams, "MERIDIAN_TCP_STREAMS", Int, "2", "TCP streams per path to each peer (1-16).")   \
  X(kTcpSockBufBytes, "MERIDIAN_TCP_SOCKBUF_BYTES", Int, "4194304",                                \
    "Send and receive socket buffer size requested for data streams, in bytes.")                   \
  X(kTcpNotsentLowatBytes, "MERIDIAN_TCP_NOTSENT_LOWAT_BYTES", Int, "262144",                      \
    "Unsent bytes a data stream may leave in the kernel (TCP_NOTSENT_LOWAT; 0: no limit), so "     \
    "acknowledgements need not queue behind seconds of a slow path's data.")                       \
  X(kChunkBytes, "MERIDIAN_CHUNK_BYTES", Int, "524288",                                            \
    "Size of the chunks a message is cut into and striped over paths, in bytes.")                  \
  X(kPathStallMs, "MERIDIAN_PATH_STALL_MS", Int, "3000",                                           \
    "A path with unacknowledged chunks and no acknowledgement for this long is declared stalled "  \
    "and its chunks are resent on other paths (a path too slow for its bytes in flight gets "      \
    "twice what its measured rate needs, at most 4x this).")                                       \
  X(kMaxUnexpectedBytes, "MERIDIAN_MAX_UNEXPECTED_BYTES", Int, "1073741824",                       \
    "Bytes a peer may send ahead of matching receives before its channel fails.")                  \
  X(kTimeoutMs, "MERIDIAN_TIMEOUT_MS", Int, "120000",                                              \
    "Deadline for bootstrap, connection set-up and blocking collectives, in milliseconds.")        \
  X(kSmallAllreduceBytes, "MERIDIAN_SMALL_ALLREDUCE_BYTES", Int, "65536",                          \
    "Allreduce messages up to this size use recursive doubling; larger ones use the ring.")        \
  X(kRingSegmentBytes, "MERIDIAN_RING_SEGMENT_BYTES", Int, "1048576",                              \
    "Pipelining segment of the ring algorithms, in bytes.")                                         \
  X(kRegion, "MERIDIAN_REGION", String, "",                                                        \
    "This rank's region (e.g. london); empty: inferred by clustering the measured round trips.")  \
  X(kProbeIntervalMs, "MERIDIAN_PROBE_INTERVAL_MS", Int, "100",                                    \
    "Period of the probes sent on every path to every peer, in milliseconds.")                     \
  CHOICE(kRouting, "MERIDIAN_ROUTING", "adaptive", "adaptive|static",                              \
    "adaptive: re-plan collectives and path weights from measurements; static: never adapt.")      \
  CHOICE(kNcclDevices, "MERIDIAN_NCCL_DEVICES", "virtual", "virtual|paths",                        \
    "NCCL net plugin: virtual (one device spanning every path, striped inside) or paths (one "     \
    "device per path, for NCCL to choose among).")                                                  \
  X(kNcclLinks, "MERIDIAN_NCCL_LINKS", String, "",                                                 \
    "NCCL net plugin: a `meridian-probe --json` report of the job's links; the plugin's devices "  \
    "then report NCCL the measured one-way latency to the farthest region and, from a report "    \
    "made with --rate-seconds, the measured speed (needs MERIDIAN_REGION).")                      \
  CHOICE(kDirectRead, "MERIDIAN_DIRECT_READ", "auto", "auto|off",                                  \
    "auto: ranks on one host (same boot, user, network and PID namespaces) that may read each "    \
    "other's memory move messages above 64 KiB by reading them from the sender (process_vm_readv), " \
    "one copy instead of loopback TCP's two; off: always through the sockets.")                    \
  CHOICE(kFabric, "MERIDIAN_FABRIC", "auto", "auto|on|off",                                       \
    "Fabric paths through libfabric beside the TCP paths of every channel: auto (only where a "    \
    "real RDMA provider, verbs;ofi_rxm or efa, is present), on (the provider MERIDIAN_FABRIC_"     \
    "PROVIDER names, or the best present; a rail that cannot open fails the device) or off.")       \
  X(kFabricProvider, "MERIDIAN_FABRIC_PROVIDER", String, "",                                       \
    "libfabric provider of the fabric paths: verbs;ofi_rxm, efa, tcp;ofi_rxm or shm (empty: the "  \
    "best present, in that order; with auto, RDMA ones only).")                                    \
  X(kFabricDomain, "MERIDIAN_FABRIC_DOMAIN", String, "",                                           \
    "libfabric domain (NIC) of the fabric paths, as fi_info lists it (mlx5_0, lo); empty: the "   \
    "first the provider offers.")                                                                   \
  CHOICE(kFabricTcp, "MERIDIAN_FABRIC_TCP", "data", "data|standby",                                \
    "With fabric paths: data (the TCP paths carry data beside them, striped by measured rate) or " \
    "standby (TCP carries control only, and the data while no fabric path to that peer is "       \
    "usable).")                                                                                     \
  CHOICE(kRelay, "MERIDIAN_RELAY", "auto", "auto|off",                                             \
    "auto: with adaptive routing, a channel adds a relay path through a third rank while its "     \
    "direct link is worse than two hops; off: never (every rank must agree).")                     \
  CHOICE(kAlgo, "MERIDIAN_ALGO", "auto",                                                           \
         "auto|ring|recursive_doubling|hierarchical|direct",                                       \
    "Allreduce algorithm: auto (the direct exchange when at most 8 ranks all share one host, "    \
    "else the planner's choice once links are measured), ring, recursive_doubling, hierarchical "  \
    "(by region) or direct (two rounds of all-to-all exchange).")                                   \
  X(kLinkStateIntervalMs, "MERIDIAN_LINK_STATE_INTERVAL_MS", Int, "1000",                          \
    "Period at which every rank sends its row of the link-state table to the others, in "          \
    "milliseconds.")                                                                                \
  X(kReplanIntervalMs, "MERIDIAN_REPLAN_INTERVAL_MS", Int, "5000",                                 \
    "Least time between two collective re-plans by rank 0, in milliseconds.")                      \
  X(kChaosReplanMs, "MERIDIAN_CHAOS_REPLAN_MS", Int, "0",                                          \
    "Testing: rank 0 forces a random valid plan this often, in milliseconds (0: never).")         \
  X(kMetricsAddr, "MERIDIAN_METRICS_ADDR", String, "",                                             \
    "host:port where local rank 0 serves Prometheus metrics on /metrics (local rank r: port + "    \
    "r); unset: 127.0.0.1:9400; 0: off.")                                                         \
  X(kPlanes, "MERIDIAN_PLANES", String, "",                                                        \
    "Names of the planes of MERIDIAN_PATHS, comma-separated in the same order (e.g. "              \
    "wan-a,wan-b); they label per-path metrics (meridian-lab sets them).")                          \
  X(kPrometheusSdDir, "MERIDIAN_PROMETHEUS_SD_DIR", String, "/tmp/meridian-prometheus-sd",          \
    "Directory of the Prometheus file-based service discovery files that meridian-lab and the "    \
    "--ranks launchers keep current with every rank's metrics endpoint.")

namespace meridian {}  // keeps this header a valid translation unit on its own
