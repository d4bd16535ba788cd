#!/usr/bin/env bash
# The NCCL plugin's adapter cost: one-way goodput over two loopback paths (2 TCP streams each,
# 512 KiB chunks, 4 messages in flight) through libnccl-net-meridian.so's function table
# (meridian-nccl-check --bench: a listener and a connector process, as two NCCL ranks) against
# Meridian's transport used directly in the same shape (meridian-transport-bench --listen /
# --connect --poll: two processes, the caller spinning on test() as NCCL's proxy thread does),
# which is the baseline of the ratio. The one-process transport bench (both devices in one
# process, the caller blocking in wait) is shown too, for reference.
# Alternating in one run, ROUNDS times per size; medians and their ratio.
# Then the plugin against a plain one (libnccl-net-plainsock.so, bench/plainsock_plugin.cc: one
# TCP socket per connection, no striping, progress inside test()), both driven the same way,
# 4 MiB messages, 8 in flight, each plugin with its defaults, as a new user would run them.
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
  echo "alternating rounds, measured at the receiver."
  echo
  echo "- plugin: \`meridian-nccl-check --listen/--connect --bench SIZE --inflight 4\` (two processes, NCCL's calls:"
  echo "  isend/irecv with NULL-request retries and test polling);"
  echo "- transport: \`meridian-transport-bench --listen/--connect --poll --paths 2 --streams 2 --inflight 4\` (two"
  echo "  processes, isend/irecv on the channels, test polling): the same shape without the adapter, the ratio's baseline;"
  echo "- one process: \`meridian-transport-bench --paths 2 --streams 2 --inflight 4\` (both ends in one process, wait)."
  echo
  echo "| size | messages | transport (MiB/s) | plugin (MiB/s) | plugin / transport | one process (MiB/s) | rounds: transport | rounds: plugin |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$tmp/table"
for size in 1M 16M 64M; do
  case $size in 1M) iters=1024 ;; 16M) iters=128 ;; 64M) iters=32 ;; esac
  bytes=$(( ${size%M} * 1048576 ))
  : > "$tmp/t"; : > "$tmp/p"; : > "$tmp/o"
  for r in $(seq "$rounds"); do
    "$tbench" --paths 2 --streams 2 --size "$size" --inflight 4 --iters "$iters" \
      | awk '/^aggregate/ {print $2 * 1e9 / 1048576}' >> "$tmp/o"
    h="$tmp/handle"
    rm -f "$h"*
    "$tbench" --listen --handle-file "$h" --poll --paths 2 --streams 2 --size "$size" --inflight 4 --iters "$iters" \
      > "$tmp/trx.log" 2>&1 &
    rx=$!
    "$tbench" --connect --handle-file "$h" --poll --paths 2 --streams 2 --size "$size" --inflight 4 --iters "$iters" \
      > "$tmp/ttx.log" 2>&1 || { cat "$tmp/ttx.log" >&2; exit 1; }
    wait "$rx" || { cat "$tmp/trx.log" >&2; exit 1; }
    awk '/^aggregate/ {print $2 * 1e9 / 1048576}' "$tmp/trx.log" >> "$tmp/t"
    rm -f "$h"
    "$check" --listen --handle-file "$h" --bench "$size" --iters "$iters" --inflight 4 > "$tmp/rx.log" 2>&1 &
    rx=$!
    sleep 0.3
    "$check" --connect --handle-file "$h" --bench "$size" --iters "$iters" --inflight 4 > "$tmp/tx.log" 2>&1
    wait "$rx"
    awk '/streamed/ {print $(NF-1)}' "$tmp/rx.log" >> "$tmp/p"
  done
  t=$(median < "$tmp/t"); p=$(median < "$tmp/p"); o=$(median < "$tmp/o")
  ratio=$(awk -v a="$p" -v b="$t" 'BEGIN {printf "%.2f", a / b}')
  printf "| %s | %d | %.0f | %.0f | %s | %.0f | %s | %s |\n" "$size" "$iters" "$t" "$p" "$ratio" "$o" \
    "$(xargs printf '%.0f ' < "$tmp/t")" "$(xargs printf '%.0f ' < "$tmp/p")" >> "$tmp/table"
  echo "$size: transport $t MiB/s, plugin $p MiB/s ($ratio); one process $o MiB/s" >&2
done
# Against a plain plugin: each with its own defaults (the knobs set above are cleared).
plain() {  # plain PLUGIN: MiB/s at the receiver
  local h="$tmp/handle"
  rm -f "$h"*
  env -u MERIDIAN_PATHS -u MERIDIAN_TCP_STREAMS "$check" --plugin "$1" --listen --handle-file "$h" --bench 4M \
    --iters 1024 --inflight 8 > "$tmp/rx.log" 2>&1 &
  local rx=$!
  env -u MERIDIAN_PATHS -u MERIDIAN_TCP_STREAMS "$check" --plugin "$1" --connect --handle-file "$h" --bench 4M \
    --iters 1024 --inflight 8 > "$tmp/tx.log" 2>&1 || { cat "$tmp/tx.log" >&2; exit 1; }
  wait "$rx" || { cat "$tmp/rx.log" >&2; exit 1; }
  awk '/streamed/ {print $(NF-1)}' "$tmp/rx.log"
}
export LD_LIBRARY_PATH="$build/bench:$LD_LIBRARY_PATH"
: > "$tmp/plain"; : > "$tmp/mer"
for r in $(seq "$rounds"); do
  plain libnccl-net-plainsock.so >> "$tmp/plain"
  plain libnccl-net-meridian.so >> "$tmp/mer"
done
pm=$(median < "$tmp/plain"); mm=$(median < "$tmp/mer")
ratio=$(awk -v a="$mm" -v b="$pm" 'BEGIN {printf "%.2f", a / b}')
{
  echo
  echo "## Against a plain plugin"
  echo
  echo "\`meridian-nccl-check --plugin P --listen/--connect --bench 4M --iters 1024 --inflight 8\`, each plugin with its"
  echo "defaults (Meridian: one loopback path, 2 TCP streams); P = libnccl-net-plainsock.so (bench/plainsock_plugin.cc:"
  echo "one TCP socket per connection, no striping, progress inside test()) or libnccl-net-meridian.so. MiB/s at the"
  echo "receiver, median of $rounds alternating rounds."
  echo
  echo "| plain plugin (MiB/s) | Meridian (MiB/s) | Meridian / plain | rounds: plain | rounds: Meridian |"
  echo "| --- | --- | --- | --- | --- |"
  printf "| %.0f | %.0f | %s | %s | %s |\n" "$pm" "$mm" "$ratio" "$(xargs printf '%.0f ' < "$tmp/plain")" \
    "$(xargs printf '%.0f ' < "$tmp/mer")"
} >> "$tmp/table"
echo "plain plugin $pm MiB/s, Meridian $mm MiB/s ($ratio)" >&2
mv "$tmp/table" "$out"
cat "$out"
