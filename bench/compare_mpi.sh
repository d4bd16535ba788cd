#!/usr/bin/env bash
# Side by side: Meridian's allreduce against OpenMPI's MPI_Allreduce, same ranks, same sizes,
# in two configurations each:
#   shared memory: OpenMPI with its defaults (vader shared memory with CMA single copies, as
#     users run it) against Meridian with its defaults (ranks on one host: shared memory,
#     MERIDIAN_SHM=auto);
#   TCP only: OpenMPI's TCP BTL over loopback (its default algorithm and its ring) against
#     Meridian with MERIDIAN_SHM=off MERIDIAN_DIRECT_READ=off (every byte through the sockets).
# On this noisy machine one run of each says little, so the contenders run in turn ROUNDS
# times (default 5), and the tables give each one's median busbw per size (and its range);
# the 8-byte latency is the median of ROUNDS runs of 2000 iterations each, alternated the
# same way. Writes bench/results/allreduce-vs-openmpi-<ranks>ranks.md.
#
# Usage: [ROUNDS=5] [SIZES="-b 8 -e 64M -f 2"] bench/compare_mpi.sh [BUILD_DIR] [RANKS ...]
#        (defaults: build, 2 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
rounds=${ROUNDS:-5}
read -r -a sizes <<< "${SIZES:--b 8 -e 64M -f 2}"
lat=(-b 8 -e 8 -n 2000 -w 200)
mpiSm=(mpirun --allow-run-as-root --oversubscribe)
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl tcp,self --mca btl_tcp_if_include lo
     --mca pml ob1)
ring=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
source "$root/bench/lib.sh"
bench_require_tools "$build" meridian-bench mpi-coll-bench
bench_require_mpirun
bench_require_rounds "$rounds"

# contender NAME RANKS ARGS...: one run of one contender (its table on stdout).
contender() {
  local name=$1 n=$2
  shift 2
  case $name in
    mpi-sm) "${mpiSm[@]}" -np "$n" "$build/bench/mpi-coll-bench" --ops all_reduce "$@" --label "defaults" ;;
    meridian) "$build/bench/meridian-bench" --ranks "$n" --ops all_reduce "$@" ;;
    mpi-default) "${mpi[@]}" -np "$n" "$build/bench/mpi-coll-bench" --ops all_reduce "$@" --label "tcp btl, default" ;;
    mpi-ring) "${mpi[@]}" -np "$n" "${ring[@]}" "$build/bench/mpi-coll-bench" --ops all_reduce "$@" --label "tcp btl, ring" ;;
    meridian-tcp) MERIDIAN_SHM=off MERIDIAN_DIRECT_READ=off "$build/bench/meridian-bench" --ranks "$n" --ops all_reduce "$@" ;;
  esac
}
names=(mpi-sm meridian mpi-default mpi-ring meridian-tcp)

mkdir -p "$root/bench/results"
for n in "${ranks[@]}"; do
  out="$root/bench/results/allreduce-vs-openmpi-${n}ranks.md"
  tmp=$(mktemp -d)
  for ((r = 1; r <= rounds; r++)); do
    for c in "${names[@]}"; do
      echo "== $n ranks, round $r/$rounds: $c"
      contender "$c" "$n" "${sizes[@]}" | tee "$tmp/$c.$r" | { grep -E '^  all_reduce +(65536|1048576|16777216|67108864) ' || true; }
      contender "$c" "$n" "${lat[@]}" | awk '/^  all_reduce/ {print $7}' > "$tmp/lat.$c.$r"
    done
  done
  # Per size: each contender's median busbw over the rounds (and min-max), the ratio of
  # Meridian's median to the better OpenMPI median, and the median times.
  table=$(for c in "${names[@]}"; do for ((r = 1; r <= rounds; r++)); do
            awk -v c="$c" '/^  all_reduce/ {print c, $2, $9, $7}' "$tmp/$c.$r"; done; done | awk -v rounds="$rounds" '
    function median(key, k, m, i, j, t, v) {
      m = cnt[key]
      for (i = 1; i <= m; i++) v[i] = val[key, i]
      for (i = 2; i <= m; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
      lo[key] = v[1]; hi[key] = v[m]
      return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    {
      if (!(($2) in seen)) { seen[$2] = 1; order[++ns] = $2 }
      k = $1 SUBSEP $2; val[k, ++cnt[k]] = $3
      kt = "t" SUBSEP $1 SUBSEP $2; val[kt, ++cnt[kt]] = $4
    }
    END {
      printf "| size (B) | OpenMPI defaults (shared memory) | Meridian defaults (shared memory) | ratio | OpenMPI TCP, default | OpenMPI TCP, ring | Meridian TCP | ratio TCP |\n"
      printf "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
      for (i = 1; i <= ns; i++) {
        s = order[i]
        a = median("mpi-sm" SUBSEP s); b = median("meridian" SUBSEP s)
        d = median("mpi-default" SUBSEP s); g = median("mpi-ring" SUBSEP s); m = median("meridian-tcp" SUBSEP s)
        best = d > g ? d : g
        printf "| %s | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.2f | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.2f |\n", s,
               a, lo["mpi-sm" SUBSEP s], hi["mpi-sm" SUBSEP s], b, lo["meridian" SUBSEP s], hi["meridian" SUBSEP s],
               (a > 0 ? b / a : 0),
               d, lo["mpi-default" SUBSEP s], hi["mpi-default" SUBSEP s], g, lo["mpi-ring" SUBSEP s], hi["mpi-ring" SUBSEP s],
               m, lo["meridian-tcp" SUBSEP s], hi["meridian-tcp" SUBSEP s], (best > 0 ? m / best : 0)
      }
    }')
  medianOf() { sort -g "$@" | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  latOf() { medianOf "$tmp"/lat."$1".*; }
  runsOf() { sort -g "$tmp"/lat."$1".* | paste -sd' '; }
  latLine="8-byte allreduce latency (us), median of $rounds runs of 2000 iterations (after 200 warm-up), alternated: OpenMPI defaults $(latOf mpi-sm) ($(runsOf mpi-sm)), Meridian defaults $(latOf meridian) ($(runsOf meridian)), ratio $(awk -v a="$(latOf meridian)" -v b="$(latOf mpi-sm)" 'BEGIN {printf "%.2f", a / b}'); TCP only: OpenMPI $(latOf mpi-default) ($(runsOf mpi-default)), Meridian $(latOf meridian-tcp) ($(runsOf meridian-tcp)), ratio $(awk -v a="$(latOf meridian-tcp)" -v b="$(latOf mpi-default)" 'BEGIN {printf "%.2f", a / b}')"
  echo "$latLine"
  {
    echo "# Allreduce, $n ranks on one machine: Meridian vs OpenMPI $(mpirun --version | head -1 | awk '{print $NF}')"
    echo
    echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), f32 sum, Meridian at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), by:"
    echo
    echo '```'
    echo "ROUNDS=$rounds bench/compare_mpi.sh $build $n"
    echo "# = $rounds rounds, each running in turn:"
    echo "#   ${mpiSm[*]} -np $n mpi-coll-bench --ops all_reduce ${sizes[*]}"
    echo "#   meridian-bench --ranks $n --ops all_reduce ${sizes[*]}"
    echo "#   ${mpi[*]} -np $n mpi-coll-bench --ops all_reduce ${sizes[*]}"
    echo "#   the same with ${ring[*]}"
    echo "#   MERIDIAN_SHM=off MERIDIAN_DIRECT_READ=off meridian-bench --ranks $n --ops all_reduce ${sizes[*]}"
    echo "#   and each of the five again with ${lat[*]} (latency)"
    echo '```'
    echo
    echo "busbw in GB/s (nccl-tests convention, 2(n-1)/n x algbw): the median over the rounds, with the"
    echo "lowest and highest in brackets. Ratio > 1: Meridian is faster (\"ratio\": against OpenMPI's defaults;"
    echo "\"ratio TCP\": against the better of OpenMPI's two TCP configurations)."
    echo
    echo "$table"
    echo
    echo "$latLine"
    echo
    echo "## Raw tables of round 1"
    for c in "${names[@]}"; do echo; echo '```'; cat "$tmp/$c.1"; echo '```'; done
  } > "$out"
  echo
  echo "$table"
  echo "(written to $out)"
  rm -rf "$tmp"
done
