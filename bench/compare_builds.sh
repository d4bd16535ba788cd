#!/usr/bin/env bash
# Two builds of Meridian side by side, to show a change moved no figure: the allreduce of
# compare_mpi.sh (Meridian's side: 4 local ranks, loopback TCP with MERIDIAN_DIRECT_READ=off,
# and again with same-host direct reads), the NCCL plugin's one-way goodput of
# nccl_plugin_bench.sh (meridian-nccl-check --listen/--connect --bench, two processes), and
# the DDP training step of train_bench.sh (meridian-train --ranks 4, 150 steps). The two
# builds take turns ROUNDS times (the order swaps every round); each table gives both
# medians (ranges in brackets) and their ratio, new / base (> 1: the new build is faster,
# except for times, where < 1 is faster).
#
# Usage: [ROUNDS=5] bench/compare_builds.sh BASE_BUILD_DIR NEW_BUILD_DIR [OUT.md]
# Each build needs meridian-bench, meridian-nccl-check, libnccl-net-meridian.so, meridian-train.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
base=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
out=${3:-}
rounds=${ROUNDS:-5}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer (got '$rounds')" >&2; exit 2; }
for b in "$base" "$new"; do
  for tool in bench/meridian-bench nccl_plugin/meridian-nccl-check nccl_plugin/libnccl-net-meridian.so trainer/meridian-train; do
    [ -e "$b/$tool" ] || { echo "missing $b/$tool: build it first" >&2; exit 1; }
  done
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MERIDIAN_SECRET=compare-builds MERIDIAN_METRICS_ADDR=0

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else printf "%.4g\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.4g-%.4g", lo, hi}'; }

# One round of every measurement with build $1, tagged $2 (base|new), round $3.
measure() {
  local b=$1 tag=$2 r=$3
  MERIDIAN_DIRECT_READ=off "$b/bench/meridian-bench" --ranks 4 --ops all_reduce -b 8 -e 16M -f 16 -n 20 -w 5 \
    | awk -v t="$tag" '/^  all_reduce/ {print "sockets", $2, $9, $7 > ("'"$tmp"'/ar." t ".'"$r"'")}'
  "$b/bench/meridian-bench" --ranks 4 --ops all_reduce -b 1M -e 16M -f 16 -n 20 -w 5 \
    | awk -v t="$tag" '/^  all_reduce/ {print "direct", $2, $9, $7 > ("'"$tmp"'/ard." t ".'"$r"'")}'
  local h="$tmp/handle.$tag.$r"
  LD_LIBRARY_PATH="$b/nccl_plugin" MERIDIAN_PATHS=127.0.0.1,127.0.0.2 MERIDIAN_TCP_STREAMS=2 \
    "$b/nccl_plugin/meridian-nccl-check" --listen --handle-file "$h" --bench 16M --iters 128 --inflight 4 \
    > "$tmp/rx.log" 2>&1 &
  local rx=$!
  LD_LIBRARY_PATH="$b/nccl_plugin" MERIDIAN_PATHS=127.0.0.1,127.0.0.2 MERIDIAN_TCP_STREAMS=2 \
    "$b/nccl_plugin/meridian-nccl-check" --connect --handle-file "$h" --bench 16M --iters 128 --inflight 4 \
    > "$tmp/tx.log" 2>&1 || { cat "$tmp/tx.log" >&2; exit 1; }
  wait "$rx" || { cat "$tmp/rx.log" >&2; exit 1; }
  awk '/streamed/ {print $(NF-1)}' "$tmp/rx.log" >> "$tmp/plugin.$tag"
  timeout 600 "$b/trainer/meridian-train" --ranks 4 --sync ddp --max-steps 150 --json "$tmp/train.json" --quiet \
    > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log" >&2; exit 1; }
  python3 - "$tmp/train.json" "$tmp" "$tag" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
busy = s["compute_s"] + s["exposed_comm_s"]
open(f"{sys.argv[2]}/sps.{sys.argv[3]}", "a").write(f"{s['samples_per_s']}\n")
open(f"{sys.argv[2]}/comm.{sys.argv[3]}", "a").write(f"{s['exposed_comm_s'] / busy if busy > 0 else 0}\n")
PY
}

for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order=(base new); else order=(new base); fi
  for tag in "${order[@]}"; do
    if [ "$tag" = base ]; then b=$base; else b=$new; fi
    echo "round $r/$rounds: $tag ($b)" >&2
    measure "$b" "$tag" "$r"
  done
done

row() {  # row LABEL BASEFILE NEWFILE
  local mb mn
  mb=$(median < "$2"); mn=$(median < "$3")
  printf "| %s | %s [%s] | %s [%s] | %s |\n" "$1" "$mb" "$(range < "$2")" "$mn" "$(range < "$3")" \
    "$(awk -v a="$mn" -v b="$mb" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')"
}
{
  echo "# Two builds side by side"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores by \`ROUNDS=$rounds bench/compare_builds.sh $1 $2\`:"
  echo "base = \`$(git -C "$base/.." rev-parse --short HEAD 2>/dev/null || echo "$base")\`, new = \`$(git -C "$new/.." rev-parse --short HEAD 2>/dev/null || echo "$new")\`"
  echo "(plus uncommitted changes where the tree has them). Medians of $rounds alternated rounds, [lowest-highest]."
  echo
  echo "## Allreduce, 4 local ranks (meridian-bench --ranks 4 --ops all_reduce -n 20 -w 5)"
  echo
  echo "| size (B), transport | base busbw GB/s | new busbw GB/s | new / base |"
  echo "| --- | --- | --- | --- |"
  for kind in ar ard; do
    for size in $(cat "$tmp/$kind.base."* | awk '{print $2}' | sort -un); do
      label=$([ "$kind" = ar ] && echo "sockets (MERIDIAN_DIRECT_READ=off)" || echo "direct reads")
      cat "$tmp/$kind.base."* | awk -v s="$size" '$2 == s {print $3}' > "$tmp/x.b"
      cat "$tmp/$kind.new."* | awk -v s="$size" '$2 == s {print $3}' > "$tmp/x.n"
      row "$size, $label" "$tmp/x.b" "$tmp/x.n"
    done
  done
  echo
  echo "8-byte allreduce time (us; < 1 is faster):"
  echo
  echo "| | base | new | new / base |"
  echo "| --- | --- | --- | --- |"
  cat "$tmp/ar.base."* | awk '$2 == 8 {print $4}' > "$tmp/x.b"
  cat "$tmp/ar.new."* | awk '$2 == 8 {print $4}' > "$tmp/x.n"
  row "8 B allreduce, sockets" "$tmp/x.b" "$tmp/x.n"
  echo
  echo "## NCCL plugin, one way, 16 MiB messages, 4 in flight, 2 loopback paths x 2 streams (MiB/s)"
  echo
  echo "| | base | new | new / base |"
  echo "| --- | --- | --- | --- |"
  row "meridian-nccl-check --bench 16M" "$tmp/plugin.base" "$tmp/plugin.new"
  echo
  echo "## Training, DDP on 4 local ranks, 150 steps of the default model"
  echo
  echo "| | base | new | new / base |"
  echo "| --- | --- | --- | --- |"
  row "samples/s" "$tmp/sps.base" "$tmp/sps.new"
  row "exposed communication share (< 1 is better)" "$tmp/comm.base" "$tmp/comm.new"
} > "$tmp/report.md"
if [ -n "$out" ]; then cp "$tmp/report.md" "$out"; fi
cat "$tmp/report.md"
