#!/usr/bin/env bash
# The trainer's exposed communication on 4 local ranks with and without shared memory
# (issue 27): meridian-train --ranks 4 --sync ddp --max-steps STEPS with MERIDIAN_SHM=auto
# (the default: allreduce through the host arena, every channel with a shared-memory path)
# against MERIDIAN_SHM=off (channels over loopback TCP with same-host direct reads, the
# direct exchange), ROUNDS alternated rounds; medians and ranges of the exposed communication
# (a share of compute + exposed communication), step compute time and samples/s.
# Writes bench/results/training-shm.md.
#
# Usage: [ROUNDS=5] [STEPS=150] bench/train_shm_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
source "$root/bench/lib.sh"
bench_train_rounds "$build" 150
run_one() { MERIDIAN_SHM=$1 "$train" --ranks 4 --sync ddp --max-steps "$steps" --json "$2" --quiet; }
bench_train_ab auto off
out="$root/bench/results/training-shm.md"
python3 - "$tmp" "$rounds" "$steps" "$(nproc)" "$(date -u +%Y-%m-%d)" > "$out" <<'PY'
import json, statistics, sys
tmp, rounds, steps, cores, day = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def runs(shm): return [json.load(open(f"{tmp}/{shm}-{r}.json")) for r in range(1, rounds + 1)]
def exposed(j): return j["exposed_comm_s"] / max(j["compute_s"] + j["exposed_comm_s"], 1e-9)
print("# Trainer on 4 local ranks: shared memory on and off")
print()
print(f"Command: `ROUNDS={rounds} STEPS={steps} bench/train_shm_bench.sh build` ({day}, {cores} cores): "
      f"`meridian-train --ranks 4 --sync ddp --max-steps {steps}` with MERIDIAN_SHM=auto and off in turn.")
print("Medians over the rounds, [min-max].")
print()
print("| MERIDIAN_SHM | exposed comm (share of the step) | exposed comm per step | step compute | samples/s |")
print("| --- | --- | --- | --- | --- |")
meds = {}
for shm in ("auto", "off"):
    js = runs(shm)
    ex = [exposed(j) for j in js]
    per = [1e3 * j["exposed_comm_s"] / max(j["steps"], 1) for j in js]
    comp = [1e3 * j["compute_s"] / max(j["steps"], 1) for j in js]
    sps = [j["samples_per_s"] for j in js]
    meds[shm] = (statistics.median(per), statistics.median(sps))
    print(f"| {shm} | {100*statistics.median(ex):.1f}% [{100*min(ex):.1f}-{100*max(ex):.1f}] | "
          f"{statistics.median(per):.2f} ms [{min(per):.2f}-{max(per):.2f}] | {statistics.median(comp):.2f} ms | "
          f"{statistics.median(sps):.0f} [{min(sps):.0f}-{max(sps):.0f}] |")
print()
print(f"Exposed communication per step, off / auto: {meds['off'][0] / max(meds['auto'][0], 1e-9):.2f}; "
      f"samples/s, auto / off: {meds['auto'][1] / max(meds['off'][1], 1e-9):.2f}.")
PY
echo "wrote $out"
