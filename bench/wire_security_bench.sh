#!/usr/bin/env bash
# What wire security costs: MERIDIAN_WIRE_SECURITY=encrypt (the default), authenticate and off,
# side by side in alternating rounds, medians and ratios to off:
#   1. loopback, 2 ranks (meridian-bench --ranks 2), allreduce busbw at 1-64 MiB, with
#      MERIDIAN_DIRECT_READ=off so every byte crosses TCP as it would between hosts;
#   2. the same with the defaults (same-host ranks read large messages from each other's memory:
#      no bytes on a wire to seal);
#   3. 8-byte allreduce latency, 2 ranks;
#   4. the three-region lab (meridian-lab, WAN links at WAN_RATE Mbit/s per plane), 16 MiB
#      allreduce busbw (root and /dev/net/tun; skipped with the reason otherwise);
#   5. fabric paths (libfabric tcp;ofi_rxm and shm, the TCP path on standby), one channel on
#      loopback (meridian-transport-bench, 4 MiB messages, 8 in flight), one-way goodput;
# and OpenSSL's own AES-256-GCM figure on this machine (openssl speed, 16 KiB blocks).
# Usage: [WAN_RATE=40] bench/wire_security_bench.sh [BUILD_DIR] [ROUNDS]
# Writes bench/results/wire-security.md (a "## Reading" section already there is kept).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lab/common.sh"
build=${1:-$root/build}
rounds=${2:-3}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer (got '$rounds')" >&2; exit 1; }
wanMbit=${WAN_RATE:-40}
bench="$build/bench/meridian-bench"
tbench="$build/bench/meridian-transport-bench"
for b in "$bench" "$tbench"; do [ -x "$b" ] || { echo "missing $b: build first (cmake --build $build)" >&2; exit 1; }; done
out="$root/bench/results/wire-security.md"
tmp=$(mktemp -d)
labName=ws
lab=("$build/lab/meridian-lab" --lab "$labName")
labUp=0
cleanup() { [ "$labUp" = 1 ] && "${lab[@]}" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
modes=(off authenticate encrypt)
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }

# rows FILE: "size busbw time" of each all_reduce row (rank 0's table).
rows() { awk '/^ *(\[[^]]*\] )?  all_reduce/ {sub(/^\[[^]]*\] /, ""); print $2, $9, $7}' "$1"; }

loop() {  # loop TAG ENV... : alternating rounds of the loopback sizes
  local tag=$1
  shift
  for r in $(seq "$rounds"); do
    for m in "${modes[@]}"; do
      env "$@" MERIDIAN_WIRE_SECURITY="$m" "$bench" --ranks 2 --ops all_reduce -b 1M -e 64M -f 4 -n 10 -w 2 \
        > "$tmp/$tag.$m.$r" 2>&1
      rows "$tmp/$tag.$m.$r" | sed "s/^/$m /" >> "$tmp/$tag.all"
    done
  done
}
table() {  # table TAG: per size, median busbw per mode and ratios to off
  echo "| size (B) | off busbw (GB/s) | authenticate | encrypt | authenticate / off | encrypt / off | rounds: encrypt |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for s in $(awk '{print $2}' "$tmp/$1.all" | sort -un); do
    local o a e
    o=$(awk -v s="$s" '$1 == "off" && $2 == s {print $3}' "$tmp/$1.all" | median)
    a=$(awk -v s="$s" '$1 == "authenticate" && $2 == s {print $3}' "$tmp/$1.all" | median)
    e=$(awk -v s="$s" '$1 == "encrypt" && $2 == s {print $3}' "$tmp/$1.all" | median)
    printf "| %s | %.3f | %.3f | %.3f | %.2f | %.2f | %s |\n" "$s" "$o" "$a" "$e" "$(awk -v a="$a" -v b="$o" 'BEGIN {print a / b}')" \
      "$(awk -v a="$e" -v b="$o" 'BEGIN {print a / b}')" \
      "$(awk -v s="$s" '$1 == "encrypt" && $2 == s {printf "%.3f ", $3}' "$tmp/$1.all")"
  done
}

echo "== loopback, every byte over TCP" >&2
loop tcp MERIDIAN_DIRECT_READ=off
echo "== loopback, defaults" >&2
loop dflt MERIDIAN_DIRECT_READ=auto
echo "== 8-byte latency" >&2
for r in $(seq "$rounds"); do
  for m in "${modes[@]}"; do
    MERIDIAN_WIRE_SECURITY="$m" "$bench" --ranks 2 --ops all_reduce -b 8 -e 8 -n 3000 -w 300 > "$tmp/lat.$m.$r" 2>&1
    rows "$tmp/lat.$m.$r" | awk -v m="$m" '{print m, $3}' >> "$tmp/lat.all"
  done
done
fabricArgs=(--paths 1 --streams 2 --size 4M --inflight 8 --iters 256)
for r in $(seq "$rounds"); do
  for p in "tcp;ofi_rxm" shm; do
    for m in "${modes[@]}"; do
      MERIDIAN_WIRE_SECURITY="$m" MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER="$p" MERIDIAN_FABRIC_TCP=standby \
        "$tbench" "${fabricArgs[@]}" > "$tmp/fab.$m.$r" 2>&1 || { echo "fabric run failed ($p, $m):" >&2; tail -20 "$tmp/fab.$m.$r" >&2; exit 1; }
      awk -v p="$p" -v m="$m" '/^aggregate/ {print p, m, $2}' "$tmp/fab.$m.$r" >> "$tmp/fab.all"
    done
  done
done
speed=$(openssl speed -evp aes-256-gcm -bytes 16384 -seconds 2 2>/dev/null | awk '/^AES-256-GCM/ {sub(/k$/, "", $2); printf "%.2f", $2 / 1e6}')

labNote=""
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/net/tun ] || [ ! -x "$build/lab/meridian-lab" ]; then
  labNote="not run: needs root, /dev/net/tun and $build/lab/meridian-lab"
else
  echo "== three-region lab" >&2
  topology="$root/lab/topologies/three-regions.yaml"
  "${lab[@]}" down >/dev/null 2>&1 || true
  "${lab[@]}" up "$topology" --time-scale 1 >/dev/null
  labUp=1
  lab_set_wan_rate "$labName" "$topology" "$wanMbit" "${lab[@]}"
  for r in $(seq "$rounds"); do
    for m in off encrypt; do
      MERIDIAN_WIRE_SECURITY="$m" timeout 600 "${lab[@]}" exec-all -- "$bench" --ops all_reduce -b 16M -e 16M -n 3 -w 1 \
        > "$tmp/lab.$m.$r" 2>&1 || { echo "lab run failed ($m):" >&2; tail -20 "$tmp/lab.$m.$r" >&2; exit 1; }
      rows "$tmp/lab.$m.$r" | awk -v m="$m" '{print m, $3}' >> "$tmp/lab.all"
    done
  done
fi

{
  echo "# Wire security: what sealing every frame costs"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')) by"
  echo "\`bench/wire_security_bench.sh $build $rounds\`: \`MERIDIAN_WIRE_SECURITY=off|authenticate|encrypt meridian-bench"
  echo "--ranks 2 --ops all_reduce -b 1M -e 64M -f 4 -n 10 -w 2\`, the modes alternating, $rounds rounds, medians."
  echo "OpenSSL's AES-256-GCM on this machine: **${speed} GB/s** per core (\`openssl speed -evp aes-256-gcm -bytes 16384\`)."
  echo
  echo "## Loopback, 2 ranks, every byte over TCP (MERIDIAN_DIRECT_READ=off)"
  echo
  table tcp
  echo
  echo "## Loopback, 2 ranks, defaults (large messages read from the peer's memory: nothing on a wire)"
  echo
  table dflt
  echo
  echo "## 8-byte allreduce latency, 2 ranks (us, median of $rounds)"
  echo
  echo "| off | authenticate | encrypt | added by encrypt |"
  echo "| --- | --- | --- | --- |"
  lo=$(awk '$1 == "off" {print $2}' "$tmp/lat.all" | median)
  la=$(awk '$1 == "authenticate" {print $2}' "$tmp/lat.all" | median)
  le=$(awk '$1 == "encrypt" {print $2}' "$tmp/lat.all" | median)
  printf "| %.1f | %.1f | %.1f | %.1f |\n" "$lo" "$la" "$le" "$(awk -v a="$le" -v b="$lo" 'BEGIN {print a - b}')"
  echo
  echo "## Three-region lab, 16 MiB allreduce time (ms), WAN ${wanMbit} Mbit/s per plane"
  echo
  if [ -n "$labNote" ]; then
    echo "$labNote"
  else
    echo "\`meridian-lab up lab/topologies/three-regions.yaml\`, every inter-region link at ${wanMbit} Mbit/s per plane,"
    echo "\`MERIDIAN_WIRE_SECURITY=off|encrypt meridian-lab exec-all -- meridian-bench --ops all_reduce -b 16M -e 16M -n 3 -w 1\`."
    echo
    echo "| off | encrypt | encrypt / off (time) | rounds: off | rounds: encrypt |"
    echo "| --- | --- | --- | --- | --- |"
    o=$(awk '$1 == "off" {print $2 / 1000}' "$tmp/lab.all" | median)
    e=$(awk '$1 == "encrypt" {print $2 / 1000}' "$tmp/lab.all" | median)
    printf "| %.0f | %.0f | %.2f | %s | %s |\n" "$o" "$e" "$(awk -v a="$e" -v b="$o" 'BEGIN {print a / b}')" \
      "$(awk '$1 == "off" {printf "%.0f ", $2 / 1000}' "$tmp/lab.all")" "$(awk '$1 == "encrypt" {printf "%.0f ", $2 / 1000}' "$tmp/lab.all")"
  fi
  echo
  echo "## Fabric paths, one channel on loopback (GB/s, one way)"
  echo
  echo "\`MERIDIAN_WIRE_SECURITY=off|authenticate|encrypt MERIDIAN_FABRIC=on MERIDIAN_FABRIC_PROVIDER=<p> MERIDIAN_FABRIC_TCP=standby"
  echo "meridian-transport-bench ${fabricArgs[*]}\` (every byte on the fabric path; medians of $rounds)."
  echo
  echo "| provider | off | authenticate | encrypt | authenticate / off | encrypt / off | rounds: encrypt |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for p in "tcp;ofi_rxm" shm; do
    o=$(awk -v p="$p" '$1 == p && $2 == "off" {print $3}' "$tmp/fab.all" | median)
    a=$(awk -v p="$p" '$1 == p && $2 == "authenticate" {print $3}' "$tmp/fab.all" | median)
    e=$(awk -v p="$p" '$1 == p && $2 == "encrypt" {print $3}' "$tmp/fab.all" | median)
    printf "| %s | %.3f | %.3f | %.3f | %.2f | %.2f | %s |\n" "$p" "$o" "$a" "$e" "$(awk -v a="$a" -v b="$o" 'BEGIN {print a / b}')" \
      "$(awk -v a="$e" -v b="$o" 'BEGIN {print a / b}')" "$(awk -v p="$p" '$1 == p && $2 == "encrypt" {printf "%.3f ", $3}' "$tmp/fab.all")"
  done
  if [ -f "$out" ] && grep -q '^## Reading' "$out"; then
    echo
    sed -n '/^## Reading/,$p' "$out"
  fi
} > "$tmp/out.md"
mkdir -p "$(dirname "$out")"
mv "$tmp/out.md" "$out"
cat "$out"
