#!/usr/bin/env bash
# The lab emulator's own cost and accuracy: one TCP flow (iperf3) between two regions
# 5 ms apart, at a series of configured rates; for each, the rate reached, the packets
# per second and CPU the emulator spent, CPU per Gbit/s forwarded, and how late packets
# left against their delivery time (the emulator's delay error). Also the idle round trip
# against the configured one. Needs root, /dev/net/tun and iperf3.
#
# Usage: bench/lab_emulator_bench.sh [BUILD_DIR] [SECONDS] [TRIALS]   (defaults: build, 5, 2)
# Writes bench/results/lab-emulator.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
secs=${2:-5}
trials=${3:-2}
lab=("$build/lab/meridian-lab" --lab mlbench)
[ -x "${lab[0]}" ] || { echo "missing ${lab[0]}: build first" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 not found: apt-get install iperf3" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }

tmp=$(mktemp -d)
cleanup() { "${lab[@]}" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
cat > "$tmp/bench.yaml" <<'YAML'
name: emulator-bench
mtu: 9000
regions:
  - {name: a, nodes: 1}
  - {name: b, nodes: 1}
planes:
  - name: net
    intra: {delay: 100us}
    links:
      - {between: [a, b], delay: 5ms, rate: 100Mbit, queue: 4MiB}
YAML
"${lab[@]}" down >/dev/null 2>&1 || true
"${lab[@]}" up "$tmp/bench.yaml" >/dev/null

stat() { "${lab[@]}" status --json | python3 -c "import json,sys; e=json.load(sys.stdin)['emulator']; print(e['$1'])"; }

out="$root/bench/results/lab-emulator.md"
idle=$("${lab[@]}" run a-1 -- ping -q -c 50 -i 0.02 198.18.0.2 | awk -F/ '/^rtt/ {print $5}')
{
  echo "# meridian-lab emulator: cost and accuracy"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores ($(uname -m)), by:"
  echo
  echo '```'
  echo "bench/lab_emulator_bench.sh $build $secs $trials"
  echo "# one iperf3 TCP flow a-1 -> b-1 for ${secs} s per row, ${trials} rows per rate;"
  echo "# link a<->b: 5 ms one way, queue 4 MiB, MTU 9000"
  echo '```'
  echo
  echo "Idle round trip (ping, 50 x): configured 10.000 ms, measured ${idle} ms."
  echo
  echo "| configured rate | TCP goodput (Mbit/s) | goodput / rate | emulator packets/s | emulator CPU (% of a core) | CPU s per Gbit forwarded | mean lateness (us) | max lateness since up (us) | packets > 100 us late |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$out.tmp"

for rate in 100Mbit 250Mbit 500Mbit 1Gbit 2Gbit 4Gbit; do
for trial in $(seq "$trials"); do
  "${lab[@]}" set net a b --rate "$rate" >/dev/null
  "${lab[@]}" run b-1 -- iperf3 -s -1 -B 198.18.0.2 >/dev/null 2>&1 &
  server=$!
  sleep 0.5
  p0=$(stat packets_in); c0=$(stat cpu_s); l0=$(stat late_sum_us); o0=$(stat packets_out); n0=$(stat late_over_100us)
  "${lab[@]}" run a-1 -- iperf3 -c 198.18.0.2 -t "$secs" -J > "$tmp/iperf.json"
  wait "$server" || true
  p1=$(stat packets_in); c1=$(stat cpu_s); l1=$(stat late_sum_us); o1=$(stat packets_out); n1=$(stat late_over_100us)
  lmax=$(stat late_max_us)
  python3 - "$rate" "$secs" "$tmp/iperf.json" "$p0" "$p1" "$c0" "$c1" "$l0" "$l1" "$o0" "$o1" "$n0" "$n1" "$lmax" >> "$out.tmp" <<'PY'
import json, sys
rate, secs, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
p0, p1, c0, c1, l0, l1, o0, o1, n0, n1, lmax = map(float, sys.argv[4:15])
units = {"Mbit": 1e6, "Gbit": 1e9}
bps = float(rate[:-4]) * units[rate[-4:]]
got = json.load(open(path))["end"]["sum_received"]["bits_per_second"]
cpu = c1 - c0
print(f"| {rate} | {got/1e6:.1f} | {got/bps:.2f} | {(p1-p0)/secs:.0f} | {100*cpu/secs:.1f} | "
      f"{cpu/(got*secs/1e9):.3f} | {(l1-l0)/max(1,o1-o0):.1f} | {lmax:.0f} | {int(n1-n0)} |")
PY
  tail -1 "$out.tmp"
done
done
{
  echo
  echo "Lateness is how long after its computed delivery time a packet was written to the"
  echo "destination's TUN device (timer wake-up, queueing behind other packets in the"
  echo "emulator's one thread). The row where goodput stops following the configured rate is"
  echo "the emulator's ceiling on this machine (iperf3's two processes share the same cores)."
} >> "$out.tmp"
mv "$out.tmp" "$out"
echo "(written to $out)"
