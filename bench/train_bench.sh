#!/usr/bin/env bash
# meridian-train benchmarks (issue 6), figures into bench/results/training.md.
#
# Part 1, loopback (4 local ranks on this machine):
#   accuracy   DDP on 4 ranks, the default model (784-1024-1024-10), AdamW, batch 256, until
#              EPOCHS epochs: test accuracy and the time to TARGET (default 0.88); DiLoCo
#              (H=16) the same way.
#   overlap    exposed communication as a share of the step, 4 ranks, 4 MiB buckets (overlapped
#              with backward; the default: ranks bound to their share of the CPUs, same-host
#              direct reads, the direct exchange and the compute thread at nice 10; then
#              unbound, then without the nice, then also with the ring, then
#              with MERIDIAN_DIRECT_READ=off) against one bucket of the whole gradient (no
#              overlap), side by side, and one rank alone; OVERLAP_ROUNDS alternated rounds,
#              medians and ranges in the table.
# Part 2, the lab (root and /dev/net/tun; skipped with a note otherwise): 1, 2, 4 and 6
#   nodes across regions (two-regions.yaml with 1 or 2 nodes per region, three-regions.yaml
#   with 2 per region; time scale 0.25, WAN links WAN_RATE Mbit/s per plane as in
#   lab_compare.sh, because the emulator thread moves ~600 Mbit/s in all), a mid-size model
#   (784-256-256-10, LAB_STEPS steps): samples/s and scaling efficiency against one node for
#   DDP, hybrid and DiLoCo, plus cross-region bytes; and the same training with OpenMPI doing
#   the collectives (meridian-train-mpi: MPI_Iallreduce per bucket; bench/lab/common.sh
#   says how mpirun reaches the namespaces), DDP and DiLoCo, side by side in the same lab.
#   Locally, meridian-train-mpi runs too (TCP BTL over loopback, as compare_mpi.sh).
#
# Usage: [EPOCHS=5] [TARGET=0.88] [OVERLAP_ROUNDS=5] [LAB_STEPS=120] [WAN_RATE=40] bench/train_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
train="$build/trainer/meridian-train"
trainMpi="$build/bench/meridian-train-mpi"
source "$root/bench/lab/common.sh"
labBin="$build/lab/meridian-lab"
epochs=${EPOCHS:-5}
target=${TARGET:-0.88}
labSteps=${LAB_STEPS:-120}
wanMbit=${WAN_RATE:-40}
out="$root/bench/results/training.md"
tmp=$(mktemp -d)
labName=mltb
labUp=0
cleanup() {
  [ "$labUp" = 1 ] && "$labBin" --lab "$labName" down >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
[ -x "$train" ] || { echo "missing $train: build it (ninja -C $build meridian-train)" >&2; exit 1; }
[ -x "$trainMpi" ] || { echo "missing $trainMpi: build it (needs libopenmpi-dev)" >&2; exit 1; }

rows=()
runTimeout=${RUN_TIMEOUT:-900}
# run NAME JSON CMD...: runs a training (at most RUN_TIMEOUT seconds), keeps its summary line
# for the tables.
run() {
  local name=$1 json=$2
  shift 2
  echo "== $name: $*" >&2
  timeout --kill-after=10 "$runTimeout" "$@" --json "$json" --quiet > "$tmp/$name.log" 2>&1 || ranFailed "$name"
  rows+=("$name|$json|$*")
}
ranFailed() { cat "$tmp/$1.log" >&2; echo "$1 failed" >&2; exit 1; }
# run_mpi_lab NAME JSON CMD...: run for an mpirun into the lab, through mpi_lab_launch: up
# once a meridian-train-mpi rank runs; a launch that hangs is started once more, and the
# report says so.
mpiTrainUp() { pgrep -f "^$trainMpi( |\$)" > /dev/null; }
mpiLaunchTimeout=120
relaunched=()
run_mpi_lab() {
  local name=$1 json=$2
  shift 2
  echo "== $name: $*" >&2
  mpi_lab_launch "$tmp/$name.log" mpiTrainUp "$mpiLaunchTimeout" "$runTimeout" "$@" --json "$json" --quiet || ranFailed "$name"
  [ "$MPI_LAB_RELAUNCHED" = 1 ] && relaunched+=("$name")
  rows+=("$name|$json|$*")
}

# ---- Part 1: loopback --------------------------------------------------------------------
run ddp4-accuracy "$tmp/ddp4.json" "$train" --ranks 4 --sync ddp --epochs "$epochs" --target-accuracy "$target"
run diloco4-accuracy "$tmp/diloco4.json" "$train" --ranks 4 --sync diloco -H 16 --epochs "$epochs" --target-accuracy "$target"
# The overlap runs are short and this machine is noisy: OVERLAP_ROUNDS rounds, each running
# every configuration once in turn, and the table shows each one's median and range.
overlapRuns=(
  "one-rank|$train --ranks 1 --max-steps 150"
  "ddp4-buckets-4MiB|$train --ranks 4 --sync ddp --max-steps 150"
  "ddp4-unbound|$train --ranks 4 --sync ddp --max-steps 150 --bind none"
  "ddp4-compute-nice-0|$train --ranks 4 --sync ddp --max-steps 150 --compute-nice 0"
  "ddp4-ring-nice-0|env MERIDIAN_ALGO=ring $train --ranks 4 --sync ddp --max-steps 150 --compute-nice 0"
  "ddp4-sockets-only|env MERIDIAN_DIRECT_READ=off $train --ranks 4 --sync ddp --max-steps 150"
  "ddp4-one-bucket|$train --ranks 4 --sync ddp --max-steps 150 --bucket-mb 64"
  "ddp4-bf16-wire|$train --ranks 4 --sync ddp --max-steps 150 --wire bf16"
  "openmpi-ddp4|mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed --mca btl tcp,self --mca btl_tcp_if_include lo -np 4 $trainMpi --sync ddp --max-steps 150"
)
overlapRounds=${OVERLAP_ROUNDS:-5}
for ((round = 1; round <= overlapRounds; round++)); do
  for entry in "${overlapRuns[@]}"; do
    # shellcheck disable=SC2086  # the command is a word list without quoting
    run "${entry%%|*}#$round" "$tmp/${entry%%|*}-$round.json" ${entry#*|}
  done
done

# ---- Part 2: the lab ------------------------------------------------------------------------
labNote=""
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/net/tun ] || [ ! -x "$labBin" ]; then
  labNote="Part 2 was skipped: it needs root, /dev/net/tun and meridian-lab."
else
  labModel=(--model 784-256-256-10 --batch 240 --max-steps "$labSteps" --eval-every 1000000)
  run lab-1-node "$tmp/lab1.json" "$train" --ranks 1 "${labModel[@]}"
  for nodes in 2 4 6; do
    case $nodes in
      2) sed 's/nodes: 2/nodes: 1/' "$root/lab/topologies/two-regions.yaml" > "$tmp/topo.yaml" ;;
      4) cp "$root/lab/topologies/two-regions.yaml" "$tmp/topo.yaml" ;;
      6) cp "$root/lab/topologies/three-regions.yaml" "$tmp/topo.yaml" ;;
    esac
    "$labBin" --lab "$labName" up "$tmp/topo.yaml" --time-scale 0.25 >/dev/null
    labUp=1
    # Every inter-region link at WAN_RATE per plane (100 ms of queue), as lab_compare.sh does.
    lab_set_wan_rate "$labName" "$tmp/topo.yaml" "$wanMbit" "$labBin" --lab "$labName"
    modes=(ddp diloco)
    [ "$nodes" -ge 4 ] && modes=(ddp hybrid diloco)
    for mode in "${modes[@]}"; do
      extra=()
      [ "$mode" != ddp ] && extra=(-H 16)
      run "lab-$nodes-nodes-$mode" "$tmp/lab$nodes-$mode.json" "$labBin" --lab "$labName" exec-all -- \
        "$train" --sync "$mode" "${labModel[@]}" "${extra[@]}"
    done
    mapfile -t nodeNames < <(mpi_lab_nodes "$labName" "$labBin" --lab "$labName")
    mpi_lab_prepare "$labName" "$tmp" "${nodeNames[@]}"
    for mode in ddp diloco; do
      extra=()
      [ "$mode" != ddp ] && extra=(-H 16)
      run_mpi_lab "lab-$nodes-nodes-$mode-openmpi" "$tmp/lab$nodes-$mode-mpi.json" "$labBin" --lab "$labName" run \
        "${nodeNames[0]}" -- "${MPI_LAB_ARGS[@]}" "$trainMpi" --sync "$mode" "${labModel[@]}" "${extra[@]}"
    done
    "$labBin" --lab "$labName" down >/dev/null
    labUp=0
  done
fi

relaunchNote=""
if ((${#relaunched[@]})); then
  relaunchNote="OpenMPI's launch hung (no rank up after $mpiLaunchTimeout s) and was started once more for: ${relaunched[*]}."
fi

# ---- Report ---------------------------------------------------------------------------
python3 - "$out" "$labNote" "$relaunchNote" "$(date -u +%Y-%m-%dT%H:%MZ)" "$(nproc)" "$overlapRounds" "${rows[@]}" <<'EOF'
import json, statistics, sys
out, note, relaunchNote, when, cores, rounds = sys.argv[1:7]
rows = [r.split("|", 2) for r in sys.argv[7:]]
data = {name: (json.load(open(path)), cmd) for name, path, cmd in rows}
def pct(x): return f"{100*x:.2f}%"
def exposed(j): return j["exposed_comm_s"] / max(j["compute_s"] + j["exposed_comm_s"], 1e-9)
L = []
L.append("# meridian-train benchmarks\n")
L.append(f"Recorded {when} on this machine ({cores} cores, no GPU) by `bench/train_bench.sh`; every figure below")
L.append("comes from the summary JSON of the command listed with it. Fashion-MNIST from Debian's")
L.append("`dataset-fashion-mnist`; CPU backend (OpenBLAS, one thread per rank).\n")
L.append("## Accuracy and time to target (4 local ranks, loopback)\n")
L.append("| run | test accuracy | time to target | wall | samples/s | exposed comm | sync payload |")
L.append("| --- | --- | --- | --- | --- | --- | --- |")
for n in ("ddp4-accuracy", "diloco4-accuracy"):
    j, _ = data[n]
    ttt = f"{j['time_to_target_s']:.1f} s" if j["time_to_target_s"] >= 0 else "not reached"
    L.append(f"| {n} | {pct(j['test_accuracy'])} | {ttt} (target {pct(j['target_accuracy'])}) | {j['wall_s']:.1f} s | "
             f"{j['samples_per_s']:.0f} | {pct(exposed(j))} | {j['payload_bytes']/1e9:.2f} GB |")
L.append("\n## Overlap (4 local ranks, loopback, 150 steps of the default model)\n")
L.append("Exposed communication = time a rank waits for gradient averages after its backward pass,")
L.append("as a share of compute + exposed communication. By default the 4 local ranks are bound to")
L.append("their share of the CPUs (two to a core here), move large messages by same-host direct reads")
L.append("(docs/transport.md), average by the direct exchange (docs/routing.md), and, being more ranks")
L.append("than cores, train at nice 10 so that communication goes first (docs/trainer.md).")
L.append("ddp4-unbound leaves their placement to the scheduler (--bind none); ddp4-compute-nice-0")
L.append("(bound) drops the nice, ddp4-ring-nice-0 also the")
L.append("direct exchange (MERIDIAN_ALGO=ring), ddp4-sockets-only moves everything over loopback TCP")
L.append("(MERIDIAN_DIRECT_READ=off, so the ring as well). openmpi-ddp4 binds its ranks too")
L.append("(--bind-to core:overload-allowed). Target: at most 20%.\n")
L.append(f"Each row: the median of {rounds} runs (range in brackets), the runs alternating with the other rows'.\n")
L.append("| run | exposed comm | step compute | samples/s | speedup vs one rank | compute nice |")
L.append("| --- | --- | --- | --- | --- | --- |")
def runsOf(base): return [data[n][0] for n in data if n.split("#")[0] == base]
def med(xs): return statistics.median(xs)
oneSps = med([j["samples_per_s"] for j in runsOf("one-rank")])
for n in ("one-rank", "ddp4-buckets-4MiB", "ddp4-unbound", "ddp4-compute-nice-0", "ddp4-ring-nice-0", "ddp4-sockets-only",
          "ddp4-one-bucket", "ddp4-bf16-wire", "openmpi-ddp4"):
    js = runsOf(n)
    ex = [exposed(j) for j in js]
    sps = med([j["samples_per_s"] for j in js])
    step = med([1e3 * j["compute_s"] / max(j["steps"], 1) for j in js])
    L.append(f"| {n} | {pct(med(ex))} [{pct(min(ex))}-{pct(max(ex))}] | {step:.1f} ms | {sps:.0f} | "
             f"{sps / oneSps:.2f}x | {js[0].get('compute_nice', 0)} |")
lab = [n for n in data if n.startswith("lab-")]
L.append("\n## Scaling across regions (the lab)\n")
if note:
    L.append(note + "\n")
else:
    base = data["lab-1-node"][0]
    L.append("Model 784-256-256-10, batch 240 (divides over 1, 2, 4 and 6 nodes); efficiency = samples/s / (nodes x one node's samples/s).")
    L.append("The nodes share this machine's 2 cores, so compute per node slows as nodes are added;")
    L.append("the one-node figure is one process alone.\n")
    L.append("OpenMPI rows: the same loop with MPI_Iallreduce / MPI_Allreduce (no transport byte counts).\n")
    if relaunchNote:
        L.append(relaunchNote + "\n")
    L.append("| run | nodes | regions | samples/s | speedup | efficiency | exposed comm | cross-region bytes | test accuracy |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in lab:
        j, _ = data[n]
        sp = j["samples_per_s"] / base["samples_per_s"]
        cross = "n/a" if n.endswith("openmpi") else f"{j['bytes_cross_region']/1e6:.1f} MB"
        L.append(f"| {n} | {j['ranks']} | {j['regions']} | {j['samples_per_s']:.0f} | {sp:.2f}x | {sp/j['ranks']:.2f} | "
                 f"{pct(exposed(j))} | {cross} | {pct(j['test_accuracy'])} |")
    L.append("\nMeridian against OpenMPI, same lab, same nodes, same training (samples/s ratio):\n")
    for n in lab:
        if n.endswith("-openmpi") and n[:-len("-openmpi")] in data:
            m = data[n[:-len("-openmpi")]][0]
            o = data[n][0]
            L.append(f"- {n[:-len('-openmpi')]}: Meridian {m['samples_per_s']:.0f} vs OpenMPI {o['samples_per_s']:.0f} "
                     f"samples/s = {m['samples_per_s']/o['samples_per_s']:.2f}x")
L.append("\n## Commands and raw summaries\n")
for name, path, cmd in rows:
    L.append(f"- {name}: `{cmd} --json F --quiet`\n\n  `{json.dumps(data[name][0], sort_keys=True)}`")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "written: $out" >&2
