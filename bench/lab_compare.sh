#!/usr/bin/env bash
# Allreduce across three regions, side by side in one run: Meridian (adaptive routing, then
# static striping), OpenMPI (TCP BTL) and Gloo (ring, TCP), one rank per node of the lab's
# three-regions.yaml (time scale 0.25), 16 MiB and 64 MiB, in two phases:
#   steady     every inter-region link at WAN_RATE per plane (default 40 Mbit/s, 100 ms of
#              queue), 1 Gbit/s inside regions as the topology has it;
#   congested  wan-a between london and virginia cut to a fifth of that both ways for the whole
#              run (every contender starts into it; restored afterwards).
# Why not the topology's own 200-400 Mbit/s WAN: the lab's emulator is one thread sharing
# 2 cores with six ranks and moves about 600 Mbit/s in all, so with fast WAN links every
# contender measures the emulator, not the WAN. At 40 Mbit/s per plane the WAN is the
# bottleneck, as it is between real regions (set WAN_RATE to try others).
# Prints a table of busbw per contender with the link-rate bound computed from the lab's own
# link table, and writes it, the exact commands and the raw rows to bench/results/lab-compare.md.
#
# How each contender reaches the namespaces:
#  - Meridian and Gloo: `meridian-lab exec-all` starts one process per node namespace. Meridian
#    stripes over both planes (MERIDIAN_PATHS); Gloo's TCP transport binds to one address, the
#    node's wan-a one, and the ranks meet through a gloo FileStore in a fresh directory under
#    this script's temporary folder (the namespaces share the filesystem).
#  - OpenMPI (bench/lab/common.sh): mpirun runs inside london-1's namespace (so its out-of-band address is reachable
#    from every node) with a hostfile of node names and plm_rsh_agent set to a tiny script that
#    runs the daemon's command line in the named node's namespace (`ip netns exec hb-<node> sh -c`)
#    instead of ssh; plm_rsh_no_tree_spawn keeps every launch on mpirun's side. The TCP BTL and
#    the out-of-band channel are limited to 198.18.0.0/16, so MPI stripes over both planes as it
#    would over two NICs, and its default algorithm choice stands (what a user gets). Six ranks
#    on two cores are oversubscribed, which OpenMPI cannot see through the namespaces (one slot
#    per "host"), so mpi_yield_when_idle is set as it would set it itself: its ranks otherwise
#    spin and starve the lab's emulator thread (twice the packet lateness, same busbw).
#
# Usage: [WAN_RATE=40] bench/lab_compare.sh [BUILD_DIR]   (root, /dev/net/tun; about 40 minutes on 2 cores,
# most of it OpenMPI and Gloo on the congested link)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lab/common.sh"
build=${1:-$root/build}
labName=hb
lab=("$build/lab/meridian-lab" --lab "$labName")
topology="$root/lab/topologies/three-regions.yaml"
timeScale=0.25
# 16 MiB and 64 MiB in one process per contender and phase: per size one checked op, one
# warm-up op, three timed ops (the three tools share this iteration rule).
sizes=(-b 16M -e 64M -f 4 -n 3 -w 1)
wanMbit=${WAN_RATE:-40}
wanMbit=${wanMbit%Mbit}
[[ $wanMbit =~ ^[0-9]+$ ]] && [ "$wanMbit" -gt 0 ] || { echo "WAN_RATE must be a whole number of Mbit/s" >&2; exit 1; }
wanQueue="$((wanMbit * 100000 / 8 / 1000))KB"  # 100 ms at that rate
congestion=(wan-a london virginia --rate "$((wanMbit / 5))Mbit")
runTimeout=900
launchTimeout=120
out=${OUT:-$root/bench/results/lab-compare.md}

[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
for tool in lab/meridian-lab bench/meridian-bench bench/mpi-coll-bench bench/gloo-coll-bench; do
  [ -x "$build/$tool" ] && continue
  echo "missing $build/$tool: build it (ninja -C $build ${tool#*/})" >&2
  case $tool in
    bench/mpi-coll-bench) echo "  (built when OpenMPI is found: apt-get install openmpi-bin libopenmpi-dev)" >&2 ;;
    bench/gloo-coll-bench) echo "  (built when Gloo is found: apt-get install libgloo-dev)" >&2 ;;
  esac
  exit 1
done
command -v mpirun >/dev/null || { echo "mpirun not found: apt-get install openmpi-bin" >&2; exit 1; }

tmp=$(mktemp -d)
cleanup() { "${lab[@]}" down >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
started=$(date +%s)
loadBefore=$(cut -d' ' -f1-3 /proc/loadavg)

"${lab[@]}" down >/dev/null 2>&1 || true
"${lab[@]}" up "$topology" --time-scale "$timeScale" >/dev/null
lab_set_wan_rate "$labName" "$topology" "$wanMbit" "${lab[@]}"
"${lab[@]}" status > "$tmp/status.txt"
mapfile -t nodes < <(mpi_lab_nodes "$labName" "${lab[@]}")
[ ${#nodes[@]} -gt 1 ] || { echo "no nodes in the lab's status:" >&2; cat "$tmp/status.txt" >&2; exit 1; }

mpi_lab_prepare "$labName" "$tmp" "${nodes[@]}"

meridianCmd() {
  cmd=(env "MERIDIAN_ROUTING=$1" "${lab[@]}" exec-all -- "$build/bench/meridian-bench" --ops all_reduce "${sizes[@]}")
}
mpiCmd() {
  cmd=("${lab[@]}" run "${nodes[0]}" -- "${MPI_LAB_ARGS[@]}" "$build/bench/mpi-coll-bench" --ops all_reduce "${sizes[@]}")
}
glooCmd() {
  local store
  store=$(mktemp -d -p "$tmp" gloo-store.XXXX)
  cmd=("${lab[@]}" exec-all -- "$build/bench/gloo-coll-bench" --store-dir "$store" "${sizes[@]}")
}

# CONTENDERS picks a subset (e.g. "meridian-adaptive meridian-static"); with OUT, the table
# goes to another file, so a partial run does not replace the side-by-side one.
read -r -a contenders <<< "${CONTENDERS:-meridian-adaptive meridian-static openmpi gloo}"
failed=0
collBenchUp() { grep -q '^# mpi-coll-bench' "$1"; }
# runOne PHASE CONTENDER: one job, its rank-0 result rows in $tmp/PHASE.CONTENDER.rows.
runOne() {
  local phase=$1 who=$2 base="$tmp/$1.$2" t0 rc=0
  case $who in
    meridian-adaptive) meridianCmd adaptive ;;
    meridian-static) meridianCmd static ;;
    openmpi) mpiCmd ;;
    gloo) glooCmd ;;
  esac
  printf '%s / %s:\n ' "$phase" "$who" >> "$tmp/commands"
  printf ' %q' "${cmd[@]}" >> "$tmp/commands"
  echo >> "$tmp/commands"
  # Every run starts from empty TCP metrics, so no run inherits the windows of the one before.
  for n in "${nodes[@]}"; do ip netns exec "$labName-$n" ip tcp_metrics flush all 2>/dev/null || true; done
  "${lab[@]}" status --json > "$base.emu0.json"
  t0=$(date +%s.%N)
  if [ "$who" = openmpi ]; then
    # Rank 0 prints its header as soon as MPI_Init returns everywhere: a launch without it
    # after launchTimeout seconds is started once more (mpi_lab_launch), and the note says so.
    mpi_lab_launch "$base.log" collBenchUp "$launchTimeout" "$runTimeout" "${cmd[@]}" || rc=$?
    t0=$MPI_LAB_STARTED
    if [ "$MPI_LAB_RELAUNCHED" = 1 ]; then
      echo "  (launch hung: no rank up after ${launchTimeout} s; killed and started again)" >> "$tmp/commands"
    fi
  else
    timeout "$runTimeout" "${cmd[@]}" > "$base.log" 2>&1 || rc=$?
  fi
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}' > "$base.wall"
  "${lab[@]}" status --json > "$base.emu1.json"
  # Result rows as printed by rank 0 (exec-all prefixes lines with "[node] ").
  sed -E 's/^\[[^]]*\] //' "$base.log" | grep -E '^  all_reduce ' > "$base.rows" || true
  if [ "$rc" -ne 0 ] || [ "$(wc -l < "$base.rows")" -ne 2 ]; then
    echo "== $phase / $who failed (exit $rc); last lines:" >&2
    tail -15 "$base.log" >&2
    failed=1
  fi
  printf '  %-10s %-18s %6.1f s\n' "$phase" "$who" "$(cat "$base.wall")"
}

for phase in steady congested; do
  if [ "$phase" = congested ]; then "${lab[@]}" set "${congestion[@]}" >/dev/null; fi
  "${lab[@]}" status --json > "$tmp/$phase.links.json"
  for who in "${contenders[@]}"; do runOne "$phase" "$who"; done
  if [ "$phase" = congested ]; then "${lab[@]}" restore "${congestion[@]:0:3}" >/dev/null; fi
done
"${lab[@]}" down >/dev/null

mkdir -p "$root/bench/results"
python3 - "$tmp" "$build" "$started" "$loadBefore" "$timeScale" "${nodes[*]}" "${congestion[*]}" "$wanMbit" \
  "${contenders[@]}" > "$out.tmp" <<'PY'
import json, os, subprocess, sys, time

tmp, build, started, load_before, time_scale, nodes, congestion, wan_mbit = sys.argv[1:9]
contenders = sys.argv[9:]
nodes = nodes.split()
n = len(nodes)
phases = ["steady", "congested"]
names = {"meridian-adaptive": "Meridian adaptive", "meridian-static": "Meridian static",
         "openmpi": "OpenMPI", "gloo": "Gloo"}

# Node -> region from the status table (columns: node region namespace addresses...).
region = {}
for line in open(f"{tmp}/status.txt"):
    f = line.split()
    if len(f) >= 3 and f[0] in nodes and f[2].endswith(f[0]):
        region[f[0]] = f[1]

def rows(phase, who):
    """size in bytes -> busbw in GB/s, recomputed from the time column (the tools print 3 decimals)."""
    out = {}
    try:
        for line in open(f"{tmp}/{phase}.{who}.rows"):
            f = line.split()
            size, us = int(f[1]), float(f[6])
            out[size] = size / (us * 1e3) * 2 * (n - 1) / n
    except FileNotFoundError:
        pass
    return out

def ring_bound(phase, planes=None):
    """Busbw bound of a ring over the nodes in rank order, on direct links, using `planes`.

    Each rank sends 2(n-1)/n x S over its ring edge per allreduce of S bytes, so
    t >= 2(n-1)/n x S / c_min and busbw = 2(n-1)/n x S / t <= c_min: the slowest ring edge's
    capacity, that is, the sum over the usable planes of the rate of the link (one direction)
    that the edge crosses."""
    links = json.load(open(f"{tmp}/{phase}.links.json"))["links"]
    rate = {(l["plane"], l["src"], l["dst"]): (0 if l["cut"] else l["rate_bps"]) for l in links}
    use = planes or {l["plane"] for l in links}
    caps = []
    for i in range(n):
        a, b = region[nodes[i]], region[nodes[(i + 1) % n]]
        caps.append(sum(rate[(p, a, b)] for p in use))
    return min(caps) / 8e9

def cut_bound(phase):
    """Any algorithm on direct links: each region must receive >= S bytes (the others' share of
    the result) over its incoming inter-region links, so algbw <= min over regions of the
    incoming capacity, busbw <= 2(n-1)/n of that."""
    links = json.load(open(f"{tmp}/{phase}.links.json"))["links"]
    inbound = {}
    for l in links:
        if l["src"] != l["dst"] and not l["cut"]:
            inbound[l["dst"]] = inbound.get(l["dst"], 0) + l["rate_bps"]
    return min(inbound.values()) / 8e9 * 2 * (n - 1) / n

def emulator_late_ms(phase, who):
    try:
        a = json.load(open(f"{tmp}/{phase}.{who}.emu0.json"))["emulator"]
        b = json.load(open(f"{tmp}/{phase}.{who}.emu1.json"))["emulator"]
    except FileNotFoundError:
        return float("nan")
    pk = b["packets_out"] - a["packets_out"]
    return (b["late_sum_us"] - a["late_sum_us"]) / max(1, pk) / 1e3

def fmt(v):
    return f"{v:.4f}" if v is not None else "failed"

mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.split("\n")[0].split()[-1]
gloo_version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libgloo-dev"],
                              capture_output=True, text=True).stdout
elapsed = time.time() - float(started)
load_after = " ".join(open("/proc/loadavg").read().split()[:3])

p = print
p("# Allreduce across three regions: Meridian vs OpenMPI vs Gloo in the lab")
p()
p(f"Measured {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())} on {os.cpu_count()} cores by "
  f"`bench/lab_compare.sh {build}` ({elapsed / 60:.1f} min; load average {load_before} before, {load_after} after).")
p(f"OpenMPI {mpi_version} (TCP BTL, ob1, default algorithm), Gloo {gloo_version} (ring allreduce, TCP).")
p()
p(f"Lab: `lab/topologies/three-regions.yaml` at time scale {time_scale} (delays x{time_scale}), "
  f"{n} nodes ({', '.join(nodes)}), one rank per node in that order. Phase *steady*: every inter-region link "
  f"at {wan_mbit} Mbit/s per plane with 100 ms of queue (the emulator moves about 600 Mbit/s in all on 2 cores, "
  f"so faster WAN links would measure it, not the WAN), 1 Gbit/s inside regions. "
  f"Phase *congested*: `meridian-lab set {congestion}` (both ways) before each contender starts, "
  f"restored at the end of the phase. f32 sum; per size one checked op, `-w` warm-up and `-n` timed ops "
  f"(see Commands); "
  f"busbw = 2(n-1)/n x size / time of the slowest rank (nccl-tests convention), in GB/s.")
p()
p("| phase | size | " + " | ".join(names[c] for c in contenders)
  + " | ring bound, both planes | ring bound, wan-a only | adaptive / static | adaptive / best of OpenMPI, Gloo |")
p("| --- | --- | " + " | ".join("---" for _ in contenders) + " | --- | --- | --- | --- |")
bounds = {}
for phase in phases:
    both, wana = ring_bound(phase), ring_bound(phase, ["wan-a"])
    bounds[phase] = (both, wana, cut_bound(phase))
    for size in sorted({s for c in contenders for s in rows(phase, c)}):
        bw = {c: rows(phase, c).get(size) for c in contenders}
        ad, st = bw.get("meridian-adaptive"), bw.get("meridian-static")
        others = [bw[c] for c in ("openmpi", "gloo") if bw.get(c)]
        r1 = f"{ad / st:.2f}" if ad and st else "-"
        r2 = f"{ad / max(others):.2f}" if ad and others else "-"
        p(f"| {phase} | {size >> 20} MiB | " + " | ".join(fmt(bw[c]) for c in contenders)
          + f" | {both:.4f} | {wana:.4f} | {r1} | {r2} |")
p()
p("Link-rate bound, from the lab's link table in each phase (`meridian-lab status --json`): a ring allreduce")
p("over n ranks sends 2(n-1)/n x S bytes over every ring edge, so busbw <= the capacity of its slowest edge,")
p("one direction, summed over the planes the contender uses: both for Meridian and OpenMPI, wan-a for Gloo.")
p("The ring in rank order crosses london->virginia, virginia->singapore and singapore->london; any ring over")
p("three contiguous regions crosses london<->virginia once, so reordering cannot avoid the congested link.")
p("OpenMPI's default algorithm is not a ring; algorithms that relay through a third region or use both")
p("directions of each link are bounded only by each region's incoming capacity, which must carry the other")
p("regions' share of S: busbw <= 2(n-1)/n x min over regions of it = "
  + ", ".join(f"{bounds[ph][2]:.4f} GB/s {ph}" for ph in phases) + ".")
p()
p("## Runs")
p()
p("| phase | contender | wall time (s) | emulator mean lateness (ms) |")
p("| --- | --- | --- | --- |")
for phase in phases:
    for c in contenders:
        wall = open(f"{tmp}/{phase}.{c}.wall").read().strip()
        p(f"| {phase} | {names[c]} | {float(wall):.1f} | {emulator_late_ms(phase, c):.2f} |")
p()
p("Emulator lateness: how late packets left the emulator on average during the run (its one thread shares")
p("the machine's cores with the ranks); a few ms against 10-27 ms one-way delays is the lab's error bar here.")
p()
p("## Commands")
p()
p("`$TMP` is the script's temporary folder; the hostfile lists the nodes in rank order, `slots=1` each.")
p()
p("```")
p(open(f"{tmp}/commands").read().rstrip().replace(tmp, "$TMP"))
p("```")
p()
p("plm_rsh_agent for mpirun (written by the script):")
p()
p("```sh")
p(open(f"{tmp}/netns-rsh").read().rstrip())
p("```")
p()
p("## Raw rows (rank 0)")
p()
p("Columns: op, size (B), count, type, redop, iters, time (us), algbw (GB/s), busbw (GB/s), #wrong.")
for phase in phases:
    for c in contenders:
        p()
        p(f"{phase} / {names[c]}:")
        p("```")
        try:
            p(open(f"{tmp}/{phase}.{c}.rows").read().rstrip() or "(no rows: the run failed)")
        except FileNotFoundError:
            p("(not run)")
        p("```")
PY
mv "$out.tmp" "$out"
sed -n '/^| phase | size/,/^$/p' "$out"
echo "(written to $out)"
exit "$failed"
