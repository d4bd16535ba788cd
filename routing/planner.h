// The collective planner: an alpha-beta cost model of the allreduce algorithms over a measured view
// of the network, and the search that picks, per message-size class, which algorithm to run and
// how (ring order, region groups, hub). Pure functions of the view: deterministic, no clock, no
// I/O, so that every rank given the same view derives the same plan without talking, and so that
// the model can be unit-tested on synthetic views.
//
// Model assumptions, shared by every formula below:
//  - Moving b bytes over the link src->dst costs latencySec + b / bytesPerSec (alpha + b*beta);
//    a link with bytesPerSec 0 is unusable and costs +infinity.
//  - Links are independent: the measured rate of a pair is what one flow achieves on it (on a
//    WAN that is the per-flow window/RTT limit, far below the NIC), so concurrent flows on
//    different pairs do not slow each other down.
//  - Algorithms run in lock-step rounds: a round in which several pairs transfer lasts as long as
//    its slowest transfer. This over-estimates a little (real ranks run ahead where they can) but
//    ranks algorithms the same way a real run does, which is all the planner needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace meridian::routing {

// What the planner knows of one directed link between two ranks.
struct LinkCost {
  double latencySec = 0;   // one-way latency (alpha)
  double bytesPerSec = 0;  // achievable rate (1/beta); 0 = unusable
};

// What the planner knows of the network: per ordered rank pair an alpha-beta cost.
struct NetworkView {
  int ranks = 0;
  std::vector<LinkCost> links;  // [src * ranks + dst]; the diagonal is ignored
  std::vector<int> regionOf;    // per rank, region index 0..regions-1
  int regions = 1;
  // How fast one rank combines a received vector into its own (bytes of vector per second,
  // f32 sum), as measured on the planning rank; 0 = unknown, reductions cost nothing. Only
  // matters where links are as fast as memory (one host, a fast LAN): there, an algorithm
  // that reduces whole vectors between transfers loses to a ring that overlaps them.
  double reduceBytesPerSec = 0;
  const LinkCost& link(int src, int dst) const;
};

enum class Algorithm { kRing, kHalvingDoubling, kTree, kHierarchical, kParameterServer };
const char* algorithmName(Algorithm algorithm);

struct Plan {
  Algorithm algorithm = Algorithm::kRing;
  // kRing: the order ranks pass data in (a permutation of 0..ranks-1; empty = identity).
  // kHalvingDoubling / kTree: a renumbering of the ranks (virtual rank v is ringOrder[v]; empty =
  // identity), so that the partners of the early, cheap-to-get-wrong rounds can be kept inside a
  // region. The executor maps virtual ranks back through it.
  std::vector<int> ringOrder;
  // kHierarchical: ranks grouped by region (each group ordered as its intra-region ring; all
  // groups the same size); the cross-region step runs between ranks with the same local index
  // (the i-th of each group), around the groups in crossOrder.
  std::vector<std::vector<int>> groups;
  std::vector<int> crossOrder;  // kHierarchical: ring order of the groups (indices into groups; empty = identity)
  int root = 0;                 // kTree: the tree's root; kParameterServer: the hub rank
  double predictedSec = 0;
  std::string reason;  // one line: why this one (for logs)
};

// Alpha-beta prediction of an allreduce of `bytes` with `plan` on `view`, in seconds. With n
// ranks, B = bytes and t(i->j, b) the link cost above:
//  - kRing: 2(n-1) steps (reduce-scatter then allgather), each moving B/n over every hop of the
//    ring at once: 2(n-1) * max over hops i->j of t(i->j, B/n).
//  - kHalvingDoubling: the recursive-doubling exchange collectives runs for small messages
//    (whole vector every round). p = the largest power of two <= n, e = n - p. Fold: virtual
//    ranks 2k hand their vector to 2k+1 for k < e, max t(2k->2k+1, B); then log2(p) rounds
//    among the p survivors, partners at distance 1, 2, 4, ... of the survivor numbering, each
//    round max over survivors s of t(s->partner(s), B); unfold: max t(2k+1->2k, B).
//  - kTree: binomial reduce to root then binomial broadcast from it (as collectives' binomial
//    reduce/broadcast), ceil(log2 n) rounds each way on whole vectors. With v the virtual rank
//    relative to root, in the round of mask m the ranks with v mod 2m == m send to v - m for
//    the reduce (m = 1, 2, 4, ...), and receive from it for the broadcast (m descending); each
//    round costs its slowest such link at B.
//  - kHierarchical: R groups of g ranks. Reduce-scatter around each region's ring, allreduce of
//    the resulting B/g shard across regions between the ranks of each local index (all g at
//    once), then allgather around each region's ring:
//      2(g-1) * max over groups of (ring step of the group at B/g)
//    + the cross step. Up to kDirectCrossMaxRegions regions it is a direct exchange (each rank
//    sends its R-1 peers their B/(g*R) piece, reduces its own, sends it back to all):
//      2 * max over local indices i and group pairs a != b of t(a_i -> b_i, B/(g*R));
//    beyond, a ring over the groups in crossOrder:
//      2(R-1) * max over local indices of (ring step of the cross ring at B/(g*R)).
//  - kParameterServer: every rank sends its whole vector to the hub h, which reduces and sends
//    the result back: max over j of t(j->h, B) + max over j of t(h->j, B). Bounded by the hub's
//    own links only, which is why choosePlan only offers it when the hub is much better
//    connected than the rest (otherwise it would flatter a hub whose NIC is shared n-1 ways).
// Reductions (r(b) = b / view.reduceBytesPerSec, 0 when unknown): the ring and the hierarchical
// region rings reduce segment by segment while the next segment travels, so a reduce-scatter
// step lasts max(link, r(B/n)); recursive doubling, the tree and the direct cross-region
// exchange reduce a whole received vector (or shard) before the next round: + r per round and
// per received piece; the hub of kParameterServer folds in n-1 vectors segment by segment while
// they arrive: max(push, (n-1) r(B)).
// One rank costs 0 whatever the plan. A plan that does not fit the view (an order that is not a
// permutation, a root out of range, unequal or incomplete groups) is a caller bug: CheckError.
double predictSeconds(const NetworkView& view, const Plan& plan, std::size_t bytes);

// Up to this many regions the hierarchical cross-region step is a direct exchange: it uses
// every region pair's link at once and waits for one latency per phase, where a ring would
// use R of the R(R-1) directed links for 2(R-1) steps. Beyond it, each rank's R-1
// concurrent flows would share its NIC too thinly for the independent-links model to hold.
inline constexpr std::size_t kDirectCrossMaxRegions = 8;

// Whether `plan` fits `ranks` ranks (orders are permutations, roots in range, hierarchical
// groups of equal size >= 1 holding every rank once, at least 2 of them, cross order a
// permutation of the groups): invalidArgument saying what is wrong. For plans from the
// wire; predictSeconds and the executors take a plan that passed.
Status validatePlan(const Plan& plan, int ranks);

// A valid plan picked at random among every algorithm that applies to `view` (random
// orders, roots, hubs, group rotations and cross orders): what forced re-plans use to prove
// that any plan the planner might publish runs correctly. Deterministic for a seed.
Plan randomPlan(const NetworkView& view, std::uint64_t seed);

// Bottleneck ring steps within this fraction of the best found count as equal (measured rates
// are EWMA estimates; a few percent is noise), so that the tie goes to the ring with the
// lower total cost, i.e. fewer slow (cross-region) hops.
inline constexpr double kRingBottleneckTolerance = 0.05;

// A ring order that avoids slow pairs: a heuristic for the asymmetric TSP on cost(i->j) =
// latency + chunkBytes/rate. Minimises the bottleneck hop first (a ring step lasts as long as its
// slowest hop), then the total cost among orders whose bottleneck is within
// kRingBottleneckTolerance of the best found. Steps:
//  1. nearest neighbour from every start (and the identity) seeds a local search of or-opt moves
//     (a run of 1-3 ranks moved elsewhere) and 2-opt moves (a run reversed) on (bottleneck, total);
//  2. the bottleneck is lowered further by bisecting a threshold tau (to the tolerance's
//     resolution), asking a budgeted depth-first search for a cycle through every rank that uses
//     only hops costing <= tau: moves alone stall where the slowest hop can only go several at once;
//  3. the same moves then lower the total while keeping the bottleneck within the tolerance.
// Deterministic (ties go to the lower index); a rotation starting at rank 0. About 1 ms for 64 ranks.
std::vector<int> chooseRingOrder(const NetworkView& view, std::size_t chunkBytes);

// The plan with the lowest predicted time for `bytes` among the candidates that apply:
//  - kRing on chooseRingOrder(view, bytes/n);
//  - kHalvingDoubling and kTree (every root) on the rank numbering, on that ring order and, with
//    regions, on region-major order (ranks sorted by region), so that near partners share a region;
//  - kHierarchical when there are >= 2 non-empty regions of equal size >= 2 (an uneven split would
//    leave ranks without a cross-region partner of the same local index; the flat algorithms
//    cover that case). Each region ring from chooseRingOrder, the region order from the
//    worst-case local-index links, and each group rotated to pair up well across regions;
//  - kParameterServer through each hub whose slowest link (either direction, to anyone) is at
//    least kHubAdvantage times the median rate of the links not touching it.
// Ties go to the earlier candidate in that list. reason names the winner, its time, the runner-up.
inline constexpr double kHubAdvantage = 2.0;
Plan choosePlan(const NetworkView& view, std::size_t bytes);

// Plans for each size class: message sizes 2^k from 1 KiB to 1 GiB.
struct PlanTable {
  std::vector<std::size_t> classBytes;  // increasing
  std::vector<Plan> plans;              // plans[i] was chosen for classBytes[i]
  // The plan of the smallest class >= bytes (the last class for anything larger), so that a
  // message is planned as one at least its size. CheckError on an empty table.
  const Plan& forBytes(std::size_t bytes) const;
};
inline constexpr std::size_t kMinClassBytes = std::size_t{1} << 10;
inline constexpr std::size_t kMaxClassBytes = std::size_t{1} << 30;
PlanTable planAll(const NetworkView& view);

// A relay path offered to the multipath channel between ranks a and b: through `via`, a third
// rank, when the direct link is worse than two hops.
struct RelayOffer {
  int via = -1;          // -1: no third rank beats the direct link
  double directSec = 0;  // a transfer of the reference size, direct (the slower direction)
  double relaySec = 0;   // ... and through `via` (the slower direction)
};
// Direct costs latency + bytes / rate; through c, both legs' latencies plus the bytes at the
// slower leg's rate (the relay forwards as it receives). Both directions are costed and the
// slower counts, as a relay path carries both. A relay runs on one plane while the view's rates
// are summed over the planes: it gets `legShare` (1 / planes) of each leg's rate. Between two
// regions only ranks of a third region are candidates (through a rank of either region the
// relay would cross the same region pair, usually the same WAN link). The best candidate,
// when it beats direct.
RelayOffer bestRelay(const NetworkView& view, int a, int b, double bytes, double legShare = 1.0);

// Validates a view: ranks >= 1, regions >= 1, links of ranks*ranks entries, regionOf of ranks
// entries each in [0, regions), off-diagonal latencies and rates finite and >= 0.
// invalidArgument otherwise. The other functions assume a valid view.
Status validate(const NetworkView& view);

}  // namespace meridian::routing
