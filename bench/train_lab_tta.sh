#!/usr/bin/env bash
# Time to accuracy across three regions (issue 6): meridian-train on the six nodes of the
# lab's three-regions.yaml (time scale 0.25; every WAN link WAN_RATE Mbit/s per plane, see
# bench/lab/common.sh), DDP against DiLoCo (H=16) and hybrid (H=16), each until TARGET test
# accuracy (--stop-at-target) or EPOCHS epochs, evaluated every EVAL steps. Model 784-256-256-10, batch 240.
# Writes bench/results/training-lab-tta.md with the commands and the raw summaries.
# Usage: [TARGET=0.87] [EPOCHS=4] [EVAL=100] [WAN_RATE=40] bench/train_lab_tta.sh [BUILD_DIR]  (root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
source "$root/bench/lab/common.sh"
train="$build/trainer/meridian-train"
labName=mltta
lab=("$build/lab/meridian-lab" --lab "$labName")
topology="$root/lab/topologies/three-regions.yaml"
target=${TARGET:-0.87}
epochs=${EPOCHS:-4}
eval=${EVAL:-100}
wanMbit=${WAN_RATE:-40}
out="$root/bench/results/training-lab-tta.md"
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
tmp=$(mktemp -d)
trap '"${lab[@]}" down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
"${lab[@]}" up "$topology" --time-scale 0.25 >/dev/null
lab_set_wan_rate "$labName" "$topology" "$wanMbit" "${lab[@]}"
common=(--model 784-256-256-10 --batch 240 --epochs "$epochs" --target-accuracy "$target" --stop-at-target
        --eval-every "$eval")
names=()
for mode in ddp diloco hybrid; do
  extra=()
  [ "$mode" != ddp ] && extra=(-H 16)
  cmd=("${lab[@]}" exec-all -- "$train" --sync "$mode" "${common[@]}" "${extra[@]}")
  echo "== $mode: ${cmd[*]}" >&2
  "${cmd[@]}" --json "$tmp/$mode.json" > "$tmp/$mode.log" 2>&1 || { cat "$tmp/$mode.log" >&2; exit 1; }
  grep -E "^eval|test accuracy|time to" "$tmp/$mode.log" | sed 's/^\[[^]]*\] //' >&2
  names+=("$mode|${cmd[*]}")
done
python3 - "$out" "$tmp" "$(date -u +%Y-%m-%dT%H:%MZ)" "$wanMbit" "${names[@]}" <<'PY'
import json, sys
out, tmp, when, wan = sys.argv[1:5]
rows = [r.split("|", 1) for r in sys.argv[5:]]
L = ["# Time to accuracy across three lab regions\n",
     f"Recorded {when} by `bench/train_lab_tta.sh` on this 2-core machine: six nodes of",
     f"`lab/topologies/three-regions.yaml` (time scale 0.25: 20-54 ms one-way), every WAN link {wan} Mbit/s",
     "per plane (two planes), model 784-256-256-10, batch 240, CPU backend.\n",
     "| sync | test accuracy | time to target | wall | samples/s | exposed comm | cross-region bytes |",
     "| --- | --- | --- | --- | --- | --- | --- |"]
raw = []
for mode, cmd in rows:
    j = json.load(open(f"{tmp}/{mode}.json"))
    ttt = f"{j['time_to_target_s']:.1f} s" if j["time_to_target_s"] >= 0 else "not reached"
    e = j["exposed_comm_s"] / max(j["compute_s"] + j["exposed_comm_s"], 1e-9)
    L.append(f"| {mode} | {100*j['test_accuracy']:.2f}% | {ttt} (target {100*j['target_accuracy']:.0f}%) | {j['wall_s']:.1f} s | "
             f"{j['samples_per_s']:.0f} | {100*e:.1f}% | {j['bytes_cross_region']/1e6:.1f} MB |")
    raw.append(f"- {mode}: `{cmd} --json F`\n\n  ```json\n  {json.dumps(j, sort_keys=True)}\n  ```")
L.append("\nEach run stops at the first evaluation (every few steps, as the command says) at or above the")
L.append("target; the time to target is that evaluation's time since training started.\n")
L.append("## Commands and raw summaries\n")
L += raw
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
