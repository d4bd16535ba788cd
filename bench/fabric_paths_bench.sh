#!/usr/bin/env bash
# Fabric paths beside TCP paths (issue 25), side by side in one run, rounds alternated:
#  1. loopback, one process, meridian-transport-bench (4 MiB messages, 8 in flight): Meridian's
#     own TCP path alone; a fabric path alone on tcp;ofi_rxm and on shm (the TCP path on standby,
#     MERIDIAN_FABRIC_TCP=standby); and mixed channels (one TCP path + one fabric path, striped);
#  2. two ranks on one host, meridian-bench allreduce: the same-host direct path (TCP + direct
#     reads, the default) against an shm fabric path alone and mixed;
#  3. the lab (root, /dev/net/tun), two-regions-fabric.yaml at time scale 0.25, both planes rate
#     limited to 100 Mbit/s between the regions: a loop of 16 MiB ring allreduces over the TCP
#     path alone (wan-b), the fabric path alone (wan-a) and both: the mixed channel must carry
#     at least 1.8x either alone.
# Usage: bench/fabric_paths_bench.sh [BUILD_DIR] [ROUNDS]    Writes bench/results/fabric-paths.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-5}
tbench="$build/bench/meridian-transport-bench"
mbench="$build/bench/meridian-bench"
lab=("$build/lab/meridian-lab" --lab mlfabench)
for b in "$tbench" "$mbench" "${lab[0]}"; do [ -x "$b" ] || { echo "missing $b: build first" >&2; exit 1; }; done
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces for part 3)" >&2; exit 1; }
tmp=$(mktemp -d)
cleanup() { "${lab[@]}" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
out="$root/bench/results/fabric-paths.md"
# median V...: full precision (for ratios); show V [DIGITS]: rounded for the tables.
median() { python3 -c 'import sys; v=sorted(float(x) for x in sys.argv[1:]); print(v[len(v)//2] if v else 0)' "$@"; }
show() { python3 -c 'import sys; print(f"{float(sys.argv[1]):.{int(sys.argv[2])}f}")' "$1" "${2:-3}"; }
ratio() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f"{a/b:.2f}" if b>0 else "-")' "$1" "$2"; }

# ---- 1. loopback, transport bench
declare -A kinds=(
  [tcp]="MERIDIAN_FABRIC=off"
  [fabric-tcp-ofi-rxm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=tcp;ofi_rxm MERIDIAN_FABRIC_TCP=standby"
  [mixed-tcp-ofi-rxm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=tcp;ofi_rxm MERIDIAN_FABRIC_TCP=data"
  [fabric-shm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=shm MERIDIAN_FABRIC_TCP=standby"
  [mixed-shm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=shm MERIDIAN_FABRIC_TCP=data"
)
order=(tcp fabric-tcp-ofi-rxm mixed-tcp-ofi-rxm fabric-shm mixed-shm)
targs=(--paths 1 --streams 2 --size 4M --inflight 8 --iters 256)
declare -A gbps
for r in $(seq "$rounds"); do
  for k in "${order[@]}"; do
    line=$(env ${kinds[$k]} "$tbench" "${targs[@]}" | awk '/^aggregate/ {print $2}')
    gbps[$k]="${gbps[$k]:-} $line"
  done
done
{
  echo "# Fabric paths beside TCP paths"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
  echo "libfabric $(dpkg-query -W -f='${Version}' libfabric1 2>/dev/null || echo '?'), by \`bench/fabric_paths_bench.sh $build $rounds\`."
  echo "Medians of $rounds alternated rounds. verbs and efa need hardware this machine does not have: not measured."
  echo
  echo "## 1. One channel on loopback, by path kind"
  echo
  echo "\`<env> meridian-transport-bench ${targs[*]}\` (one process, two devices; one-way goodput)."
  echo
  echo "| path kind | environment | GB/s (median) | rounds | vs Meridian TCP |"
  echo "| --- | --- | --- | --- | --- |"
  tcp=$(median ${gbps[tcp]})
  for k in "${order[@]}"; do
    m=$(median ${gbps[$k]})
    echo "| $k | \`${kinds[$k]}\` | $(show "$m") | ${gbps[$k]# } | $(ratio "$m" "$tcp") |"
  done
} > "$out.tmp"

# ---- 2. two ranks on one host
declare -A local=(
  [direct]="MERIDIAN_FABRIC=off"
  [shm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=shm MERIDIAN_FABRIC_TCP=standby"
  [mixed-shm]="MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=shm MERIDIAN_FABRIC_TCP=data"
)
lorder=(direct shm mixed-shm)
margs=(--ranks 2 --ops all_reduce -b 1M -e 16M -f 16 -n 20 -w 3)
declare -A l1 l16
for r in $(seq "$rounds"); do
  for k in "${lorder[@]}"; do
    env ${local[$k]} "$mbench" "${margs[@]}" --json "$tmp/l.json" >/dev/null
    read -r a b < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"]; print(r[0]["busbw_gbps"], r[-1]["busbw_gbps"])' "$tmp/l.json")
    l1[$k]="${l1[$k]:-} $a"
    l16[$k]="${l16[$k]:-} $b"
  done
done
{
  echo
  echo "## 2. Two ranks on one host: the same-host direct path against shm fabric paths"
  echo
  echo "\`<env> meridian-bench ${margs[*]}\`: allreduce busbw. \`direct\` is the default for ranks on one"
  echo "host: loopback TCP, with messages above 64 KiB read from the sender's memory (process_vm_readv)."
  echo
  echo "| path | environment | 1 MiB busbw GB/s | 16 MiB busbw GB/s | 16 MiB vs direct |"
  echo "| --- | --- | --- | --- | --- |"
  d16=$(median ${l16[direct]})
  for k in "${lorder[@]}"; do
    m16=$(median ${l16[$k]})
    echo "| $k | \`${local[$k]}\` | $(show "$(median ${l1[$k]})") | $(show "$m16") | $(ratio "$m16" "$d16") |"
  done
} >> "$out.tmp"

# ---- 3. the lab: rate-limited planes, one of each kind
declare -A planes=(
  [tcp-alone]="MERIDIAN_FABRIC=off"
  [fabric-alone]="MERIDIAN_FABRIC_TCP=standby"
  [mixed]="MERIDIAN_FABRIC_TCP=data"
)
porder=(tcp-alone fabric-alone mixed)
labrounds=$(( rounds < 3 ? rounds : 3 ))
"${lab[@]}" down >/dev/null 2>&1 || true
"${lab[@]}" up "$root/lab/topologies/two-regions-fabric.yaml" --time-scale 0.25 >/dev/null
declare -A bw
for r in $(seq "$labrounds"); do
  for k in "${porder[@]}"; do
    MERIDIAN_ALGO=ring "${lab[@]}" exec-all -- env ${planes[$k]} "$mbench" --ops all_reduce -b 16M -e 16M \
      --duration 12 --interval 1 --check 0 --json "$tmp/p.json" >/dev/null 2>&1
    v=$(python3 -c 'import json,sys; r=[x["busbw_gbps"] for x in json.load(open(sys.argv[1]))["timeline"] if x["t_start"]>=2]; r.sort(); print(f"{r[len(r)//2]:.5f}" if r else 0)' "$tmp/p.json")
    bw[$k]="${bw[$k]:-} $v"
  done
done
{
  echo
  echo "## 3. The lab: a mixed channel on two rate-limited planes"
  echo
  echo "\`meridian-lab up lab/topologies/two-regions-fabric.yaml --time-scale 0.25\` (4 nodes in two regions;"
  echo "wan-a carries the fabric path, tcp;ofi_rxm bound to its interface; wan-b the TCP path; 100 Mbit/s"
  echo "each between the regions), then \`MERIDIAN_ALGO=ring meridian-lab exec-all -- env <env> meridian-bench"
  echo "--ops all_reduce -b 16M -e 16M --duration 12 --interval 1\`: median busbw of the rows from t=2 s,"
  echo "$labrounds alternated rounds. Link-rate bound: 0.0125 GB/s per plane, 0.0250 GB/s on both."
  echo
  echo "| paths | environment | busbw GB/s (median) | rounds |"
  echo "| --- | --- | --- | --- |"
  for k in "${porder[@]}"; do echo "| $k | \`${planes[$k]}\` | $(show "$(median ${bw[$k]})" 4) | ${bw[$k]# } |"; done
  mixed=$(median ${bw[mixed]}); t=$(median ${bw[tcp-alone]}); f=$(median ${bw[fabric-alone]})
  echo
  echo "Mixed over TCP alone: **$(ratio "$mixed" "$t")x**; mixed over the fabric path alone: **$(ratio "$mixed" "$f")x** (target: at least 1.8x each)."
} >> "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
