#!/usr/bin/env bash
# Shared-memory paths (issue 27): the collectives that run over channels (broadcast,
# all_gather, reduce_scatter) and point-to-point (sendrecv), ranks on one host, side by side:
#   meridian-shm   Meridian's defaults: a shared-memory path per channel (MERIDIAN_SHM=auto)
#   meridian-tcp   the same with MERIDIAN_SHM=off: loopback TCP with same-host direct reads,
#                  what channels between local ranks were before shared-memory paths
#   openmpi        OpenMPI with its defaults (vader shared memory + CMA), as users run it
#                  (no sendrecv in mpi-coll-bench: that row is Meridian's two only)
# The contenders run in turn ROUNDS times (default 5); tables give each one's median time per
# op and size (and its range), and the ratios of the medians. Writes
# bench/results/shm-paths-<ranks>ranks.md.
#
# Usage: [ROUNDS=5] [SIZES="-b 8 -e 16M -f 16"] bench/shm_paths_bench.sh [BUILD_DIR] [RANKS ...]
#        (defaults: build, 2 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
rounds=${ROUNDS:-5}
read -r -a sizes <<< "${SIZES:--b 8 -e 16M -f 16}"
ops=broadcast,all_gather,reduce_scatter
source "$root/bench/lib.sh"
bench_require_tools "$build" meridian-bench mpi-coll-bench
bench_require_mpirun
bench_require_rounds "$rounds"

# contender NAME RANKS: one run (table rows "op size time_us" on stdout).
contender() {
  local name=$1 n=$2
  case $name in
    meridian-shm) MERIDIAN_SHM=auto "$build/bench/meridian-bench" -N "$n" --ops "$ops,sendrecv" "${sizes[@]}" -n 50 -w 5 ;;
    meridian-tcp) MERIDIAN_SHM=off "$build/bench/meridian-bench" -N "$n" --ops "$ops,sendrecv" "${sizes[@]}" -n 50 -w 5 ;;
    openmpi) mpirun --allow-run-as-root --oversubscribe -np "$n" "$build/bench/mpi-coll-bench" --ops "$ops" \
               "${sizes[@]}" -n 50 -w 5 ;;
  esac 2>/dev/null | awk '$1 ~ /^[a-z_]+$/ && $2 ~ /^[0-9]+$/ && NF >= 7 {print $1, $2, $7}'
}

names=(meridian-shm meridian-tcp openmpi)
for n in "${ranks[@]}"; do
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for ((r = 1; r <= rounds; r++)); do
    for name in "${names[@]}"; do
      contender "$name" "$n" | sed "s/^/$name /" >> "$tmp/rows" || { echo "$name failed (round $r)" >&2; exit 1; }
    done
    echo "ranks $n: round $r of $rounds done" >&2
  done
  out="$root/bench/results/shm-paths-${n}ranks.md"
  {
    echo "# Shared-memory paths: $n ranks on one host"
    echo
    echo "Command: \`ROUNDS=$rounds SIZES=\"${sizes[*]}\" bench/shm_paths_bench.sh build $n\` ($(date -u +%Y-%m-%d),"
    echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))."
    echo "Median time per op in us over $rounds alternated rounds (min-max in brackets); ratios of medians,"
    echo "above 1 where Meridian's shared-memory paths are faster."
    echo
    echo "| op | size (B) | meridian-shm | meridian-tcp | openmpi | tcp / shm | openmpi / shm |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    awk '
      { key = $2 " " $3; t[$1, key] = t[$1, key] " " $4; if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
      function stats(list,   a, m, i, j, x) {
        m = split(substr(list, 2), a, " ")
        for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x }
        med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
        lo = a[1]; hi = a[m]; return m
      }
      END {
        for (i = 1; i <= k; i++) {
          key = order[i]; split(key, f, " ")
          row = "| " f[1] " | " f[2]
          ms = mt = mo = ""
          if (stats(t["meridian-shm", key]) > 0) { ms = med; row = row sprintf(" | %.1f [%.1f-%.1f]", med, lo, hi) } else row = row " | -"
          if (stats(t["meridian-tcp", key]) > 0) { mt = med; row = row sprintf(" | %.1f [%.1f-%.1f]", med, lo, hi) } else row = row " | -"
          if (t["openmpi", key] != "" && stats(t["openmpi", key]) > 0) { mo = med; row = row sprintf(" | %.1f [%.1f-%.1f]", med, lo, hi) } else row = row " | -"
          row = row ((ms > 0 && mt != "") ? sprintf(" | %.2f", mt / ms) : " | -")
          row = row ((ms > 0 && mo != "") ? sprintf(" | %.2f", mo / ms) : " | -")
          print row " |"
        }
      }' "$tmp/rows"
  } > "$out"
  echo "wrote $out"
  rm -rf "$tmp"
done
