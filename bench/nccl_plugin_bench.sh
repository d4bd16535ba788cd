#!/usr/bin/env bash
# The NCCL plugin's adapter cost: one-way goodput over two loopback paths (2 TCP streams each,
# 512 KiB chunks, 4 messages in flight) through libnccl-net-meridian.so's function table
# (meridian-nccl-check --bench: a listener and a connector process, as two NCCL ranks) against
# Meridian's transport used directly (meridian-transport-bench: two devices, one process).
# Alternating in one run, ROUNDS times per size; medians and their ratio.
# Usage: bench/nccl_plugin_bench.sh [BUILD_DIR] [ROUNDS]    Writes bench/results/nccl-plugin.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
out="$root/bench/results/nccl-plugin.md"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check="$build/nccl_plugin/meridian-nccl-check"
tbench="$build/bench/meridian-transport-bench"
export LD_LIBRARY_PATH="$build/nccl_plugin:${LD_LIBRARY_PATH:-}" MERIDIAN_PATHS=127.0.0.1,127.0.0.2 \
  MERIDIAN_TCP_STREAMS=2 MERIDIAN_SECRET=nccl-plugin-bench
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
{
  echo "# NCCL plugin: adapter cost against the transport used directly"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores by \`bench/nccl_plugin_bench.sh $build $rounds\`."
  echo "Loopback, 2 paths x 2 TCP streams, 512 KiB chunks, 4 messages in flight, one way; MiB/s, median of $rounds"
  echo "alternating rounds. Plugin: \`meridian-nccl-check --listen/--connect --bench SIZE\` (two processes,"
  echo "NCCL's calls: isend/irecv with NULL-request retries and test polling). Transport: \`meridian-transport-bench"
  echo "--paths 2 --streams 2 --inflight 4\` (isend/irecv on the channels, wait)."
  echo
  echo "| size | messages | transport (MiB/s) | plugin (MiB/s) | plugin / transport | rounds: transport | rounds: plugin |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$tmp/table"
for size in 1M 16M 64M; do
  case $size in 1M) iters=1024 ;; 16M) iters=128 ;; 64M) iters=32 ;; esac
  bytes=$(( ${size%M} * 1048576 ))
  : > "$tmp/t"; : > "$tmp/p"
  for r in $(seq "$rounds"); do
    "$tbench" --paths 2 --streams 2 --size "$size" --inflight 4 --iters "$iters" \
      | awk '/^aggregate/ {print $2 * 1e9 / 1048576}' >> "$tmp/t"
    h="$tmp/handle"
    "$check" --listen --handle-file "$h" --bench "$size" --iters "$iters" --inflight 4 > "$tmp/rx.log" 2>&1 &
    rx=$!
    sleep 0.3
    "$check" --connect --handle-file "$h" --bench "$size" --iters "$iters" --inflight 4 > "$tmp/tx.log" 2>&1
    wait "$rx"
    awk '/streamed/ {print $(NF-1)}' "$tmp/rx.log" >> "$tmp/p"
  done
  t=$(median < "$tmp/t"); p=$(median < "$tmp/p")
  ratio=$(awk -v a="$p" -v b="$t" 'BEGIN {printf "%.2f", a / b}')
  printf "| %s | %d | %.0f | %.0f | %s | %s | %s |\n" "$size" "$iters" "$t" "$p" "$ratio" \
    "$(xargs printf '%.0f ' < "$tmp/t")" "$(xargs printf '%.0f ' < "$tmp/p")" >> "$tmp/table"
  echo "$size: transport $t MiB/s, plugin $p MiB/s ($ratio)" >&2
done
mv "$tmp/table" "$out"
cat "$out"
