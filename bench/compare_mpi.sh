#!/usr/bin/env bash
# Side by side: Meridian's allreduce against OpenMPI's MPI_Allreduce (TCP BTL over
# loopback, no shared memory; its default algorithm and its ring), same ranks, same
# sizes, one run. Prints the three tables and a ratio table, and writes them to
# bench/results/allreduce-vs-openmpi-<ranks>ranks.md.
#
# Usage: bench/compare_mpi.sh [BUILD_DIR] [RANKS ...]      (defaults: build, 2 4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
sizes=(-b 8 -e 64M -f 2)
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl tcp,self --mca btl_tcp_if_include lo
     --mca pml ob1)
for tool in "$build/bench/meridian-bench" "$build/bench/mpi-coll-bench"; do
  [ -x "$tool" ] || { echo "missing $tool: build first (cmake --build $build)" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "mpirun not found: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1; }

mkdir -p "$root/bench/results"
for n in "${ranks[@]}"; do
  out="$root/bench/results/allreduce-vs-openmpi-${n}ranks.md"
  tmp=$(mktemp -d)
  echo "== $n ranks: OpenMPI default algorithm"
  "${mpi[@]}" -np "$n" "$build/bench/mpi-coll-bench" --ops all_reduce "${sizes[@]}" --label "tcp btl, default" \
    | tee "$tmp/mpi-default"
  echo "== $n ranks: OpenMPI ring (coll_tuned_allreduce_algorithm 4)"
  "${mpi[@]}" -np "$n" --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \
    "$build/bench/mpi-coll-bench" --ops all_reduce "${sizes[@]}" --label "tcp btl, ring" | tee "$tmp/mpi-ring"
  echo "== $n ranks: Meridian"
  "$build/bench/meridian-bench" --ranks "$n" --ops all_reduce "${sizes[@]}" | tee "$tmp/meridian"
  # Small-message latency needs many iterations to settle (the sweep does 20 per size).
  lat=(-b 8 -e 8 -n 2000 -w 200)
  mpiLat=$("${mpi[@]}" -np "$n" "$build/bench/mpi-coll-bench" --ops all_reduce "${lat[@]}" | awk '/^  all_reduce/ {print $7}')
  merLat=$("$build/bench/meridian-bench" --ranks "$n" --ops all_reduce "${lat[@]}" | awk '/^  all_reduce/ {print $7}')
  latLine="8-byte allreduce latency over 2000 iterations (after 200 warm-up): OpenMPI default ${mpiLat} us, Meridian ${merLat} us, ratio $(awk -v a="$merLat" -v b="$mpiLat" 'BEGIN {printf "%.2f", a / b}')"
  echo "$latLine"
  # Ratio table: Meridian busbw over the better OpenMPI busbw; latency ratio at each size.
  ratios=$(awk '
    FNR == 1 { file++ }
    /^  all_reduce/ { bw[file, $2] = $9; t[file, $2] = $7; if (file == 1) order[++n] = $2 }
    END {
      printf "| size (B) | OpenMPI default busbw | OpenMPI ring busbw | Meridian busbw | Meridian / best OpenMPI busbw | OpenMPI default time (us) | Meridian time (us) | time ratio (Meridian / OpenMPI default) |\n"
      printf "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
      for (i = 1; i <= n; i++) {
        s = order[i]; best = bw[1, s] > bw[2, s] ? bw[1, s] : bw[2, s]
        printf "| %s | %s | %s | %s | %.2f | %s | %s | %.2f |\n", s, bw[1, s], bw[2, s], bw[3, s],
               (best > 0 ? bw[3, s] / best : 0), t[1, s], t[3, s], (t[1, s] > 0 ? t[3, s] / t[1, s] : 0)
      }
    }' "$tmp/mpi-default" "$tmp/mpi-ring" "$tmp/meridian")
  {
    echo "# Allreduce, $n ranks on one machine: Meridian vs OpenMPI $(mpirun --version | head -1 | awk '{print $NF}')"
    echo
    echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(uname -m)), loopback TCP, f32 sum, by:"
    echo
    echo '```'
    echo "bench/compare_mpi.sh $build $n"
    echo "# = ${mpi[*]} -np $n mpi-coll-bench --ops all_reduce ${sizes[*]}"
    echo "#   (and again with --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)"
    echo "#   meridian-bench --ranks $n --ops all_reduce ${sizes[*]}"
    echo '```'
    echo
    echo "busbw in GB/s (nccl-tests convention, 2(n-1)/n x algbw). Ratio > 1: Meridian is faster."
    echo
    echo "$ratios"
    echo
    echo "$latLine"
    echo
    echo "## Raw tables"
    for f in mpi-default mpi-ring meridian; do echo; echo '```'; cat "$tmp/$f"; echo '```'; done
  } > "$out"
  echo
  echo "$ratios"
  echo "(written to $out)"
  rm -rf "$tmp"
done
