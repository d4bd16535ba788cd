#!/usr/bin/env bash
# Routing in the lab, side by side in one run (root, /dev/net/tun):
#  1. two regions (time scale 0.25): a loop of 16 MiB allreduces while wan-a between the
#     regions drops from 100 to 20 Mbit/s at t=6 s; Meridian adaptive vs static striping;
#     then the same with real UDP cross-traffic of 80 Mbit/s each way on wan-a instead of the
#     rate cut, for the ring (adaptive, static) and for the plan the planner picks;
#  2. three regions (time scale 0.25, every inter-region link 20 Mbit/s per plane, so the
#     WAN and not the emulator is the bottleneck): flat ring vs region-hierarchical allreduce
#     of 4 MiB: time per op and bytes across regions;
#  3. the same three regions with London <-> Virginia cut to 2 Mbit/s per plane: the
#     hierarchical allreduce of 4 MiB with relay paths (MERIDIAN_RELAY=auto, through Singapore)
#     and without (off), alternating.
# Usage: bench/routing_lab_bench.sh [BUILD_DIR]    Writes bench/results/routing-lab.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
lab=("$build/lab/meridian-lab" --lab mlbench)
benchbin="$build/bench/meridian-bench"
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
tmp=$(mktemp -d)
cleanup() { "${lab[@]}" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
out="$root/bench/results/routing-lab.md"
summary() {  # summary JSON FROM TO [relay]: time per op, cross-region MiB per op, median busbw of rows in [FROM, TO), share on wan-a (or on the relay path)
  python3 - "$@" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["timeline"]
lo, hi = float(sys.argv[2]), float(sys.argv[3])
r = [x for x in rows if x["t_start"] >= lo and x["t"] <= hi]
ops = sum(x["ops"] for x in r) or 1
t = (r[-1]["t"] - r[0]["t_start"]) if r else 0
b = sum(sum(x["cross_region_bytes"]) for x in r)
bw = sorted(x["busbw_gbps"] for x in r)
relay = len(sys.argv) > 4  # the relay slot is the path after the planes (absent when off)
def part(v): return (v[2] if len(v) > 2 else 0) if relay else v[0]
p0 = [part(x["cross_region_bytes"]) / max(1, sum(x["cross_region_bytes"])) for x in r]
print(f"{t/ops:.2f} | {b/ops/2**20:.1f} | {bw[len(bw)//2] if bw else 0:.4f} | {100*sum(p0)/max(1,len(p0)):.0f}%")
PY
}
{
  echo "# Routing in the lab"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, by \`bench/routing_lab_bench.sh $build\`."
  echo
  echo "## 1. One plane degrades under load (two regions, 4 nodes, time scale 0.25)"
  echo
  echo "Loop of 16 MiB ring allreduces (\`MERIDIAN_ALGO=ring meridian-bench --duration 16 --interval 1\`, one rank per node);"
  echo "at t=6 s \`meridian-lab set wan-a east west --rate 20Mbit\` (from 100). Link-rate bound on busbw:"
  echo "0.0250 GB/s before (2 planes x 100 Mbit/s), 0.0150 GB/s after (20 + 100 Mbit/s)."
  echo
  echo "| routing | phase | s per op | cross-region MiB per op | median busbw (GB/s) | share on wan-a |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$out.tmp"
"${lab[@]}" down >/dev/null 2>&1 || true
"${lab[@]}" up "$root/lab/topologies/two-regions.yaml" --time-scale 0.25 >/dev/null
for mode in adaptive static; do
  "${lab[@]}" restore wan-a east west >/dev/null
  (sleep 6; "${lab[@]}" set wan-a east west --rate 20Mbit >/dev/null) &
  MERIDIAN_ALGO=ring MERIDIAN_ROUTING=$mode "${lab[@]}" exec-all -- "$benchbin" --ops all_reduce -b 16M -e 16M --duration 16 \
    --interval 1 --check 0 --json "$tmp/$mode.json" >/dev/null 2>&1
  wait
  echo "| $mode | before (t 1-5 s) | $(summary "$tmp/$mode.json" 1 5) |" >> "$out.tmp"
  echo "| $mode | after (t 9-16 s) | $(summary "$tmp/$mode.json" 9 100) |" >> "$out.tmp"
done
"${lab[@]}" restore wan-a east west >/dev/null
{
  echo
  echo "The same loop with real cross-traffic instead: at t=6 s two \`meridian-lab cross-traffic wan-a\`"
  echo "UDP flows of 80 Mbit/s (east->west and west->east, 11 s) take most of wan-a's 100 Mbit/s and"
  echo "fill its queue; the bound after is 0.0150 GB/s again (20 + 100 Mbit/s). \`auto\` lets the planner"
  echo "choose (it picks the region-hierarchical allreduce here, whose cross-region traffic comes in"
  echo "one burst per op)."
  echo
  echo "| routing, algorithm | phase | s per op | cross-region MiB per op | median busbw (GB/s) | share on wan-a |"
  echo "| --- | --- | --- | --- | --- | --- |"
} >> "$out.tmp"
for run in "adaptive ring" "static ring" "adaptive auto"; do
  set -- $run
  (sleep 6; "${lab[@]}" cross-traffic wan-a east west --rate 80Mbit --duration 11s >/dev/null &
   "${lab[@]}" cross-traffic wan-a west east --rate 80Mbit --duration 11s >/dev/null; wait) &
  MERIDIAN_ALGO=$2 MERIDIAN_ROUTING=$1 "${lab[@]}" exec-all -- "$benchbin" --ops all_reduce -b 16M -e 16M --duration 16 \
    --interval 1 --check 0 --json "$tmp/x-$1-$2.json" >/dev/null 2>&1
  wait
  echo "| $1, $2 | before (t 1-5 s) | $(summary "$tmp/x-$1-$2.json" 1 5) |" >> "$out.tmp"
  echo "| $1, $2 | after (t 9-16 s) | $(summary "$tmp/x-$1-$2.json" 9 100) |" >> "$out.tmp"
done
"${lab[@]}" down >/dev/null
{
  echo
  echo "## 2. Flat ring vs region-hierarchical allreduce (three regions, 6 nodes, time scale 0.25)"
  echo
  echo "Every inter-region link set to 20 Mbit/s per plane (100 ms of queue), 4 MiB allreduces for 12 s"
  echo "each, \`MERIDIAN_ALGO=ring\` then \`hierarchical\`, twice, first 4 s dropped (warm-up). At the"
  echo "topology's own 200-400 Mbit/s the emulator (one thread sharing 2 cores with six ranks, about"
  echo "600 Mbit/s in all) would be the bottleneck for both algorithms."
  echo
  echo "| algorithm | s per op | cross-region MiB per op | median busbw (GB/s) | share on wan-a |"
  echo "| --- | --- | --- | --- | --- |"
} >> "$out.tmp"
"${lab[@]}" up "$root/lab/topologies/three-regions.yaml" --time-scale 0.25 >/dev/null
for p in wan-a wan-b; do
  for pair in "london virginia" "london singapore" "virginia singapore"; do
    "${lab[@]}" set $p $pair --rate 20Mbit --queue 250KB >/dev/null
  done
done
for algo in ring hierarchical ring hierarchical; do
  MERIDIAN_ALGO=$algo "${lab[@]}" exec-all -- "$benchbin" --ops all_reduce -b 4M -e 4M --duration 12 \
    --interval 4 --check 0 --json "$tmp/$algo.json" >/dev/null 2>&1
  echo "| $algo | $(summary "$tmp/$algo.json" 3.5 100) |" >> "$out.tmp"
done
{
  echo
  echo "## 3. Relay paths around a slow region pair (three regions, 6 nodes, time scale 0.25)"
  echo
  echo "As in 2, and London <-> Virginia cut to 2 Mbit/s per plane (25 KB of queue). 4 MiB"
  echo "hierarchical allreduces for 30 s each, \`MERIDIAN_RELAY=auto\` then \`off\`, twice; the"
  echo "first 8 s dropped (relays open once the slow pairs' rates are measured). Link-rate bound"
  echo "on the London-Virginia leg of the cross-region step: 4 Mbit/s direct, up to 4 + 40 Mbit/s"
  echo "with relays through Singapore (whose links also carry its own share)."
  echo
  echo "| relay | s per op | cross-region MiB per op | median busbw (GB/s) | share on the relay paths |"
  echo "| --- | --- | --- | --- | --- |"
} >> "$out.tmp"
for p in wan-a wan-b; do
  "${lab[@]}" set $p london virginia --rate 2Mbit --queue 25KB >/dev/null
done
for relay in auto off auto off; do
  MERIDIAN_ALGO=hierarchical MERIDIAN_RELAY=$relay "${lab[@]}" exec-all -- "$benchbin" --ops all_reduce -b 4M -e 4M \
    --duration 30 --interval 2 --check 0 --json "$tmp/relay-$relay.json" >/dev/null 2>&1
  echo "| $relay | $(summary "$tmp/relay-$relay.json" 8 100 relay) |" >> "$out.tmp"
done
mv "$out.tmp" "$out"
cat "$out"
