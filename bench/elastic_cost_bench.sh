#!/usr/bin/env bash
# What being elastic costs a run with no fault (issue 28): meridian-train --ranks 4 --sync ddp
# --max-steps STEPS with --elastic on (the default: the optimizer's overwrites kept until each
# step is whole, the joiners' check every 25 steps, successors and joins ready) against
# --elastic off, ROUNDS alternated rounds. The failure detector's heartbeats (a link-state row
# to every peer each second) run in both: they are the same in either mode, and measured here
# by what they add to the transport's bytes (bytes sent per step). Medians and ranges of
# samples/s and step time. Writes bench/results/elastic-cost.md.
#
# Usage: [ROUNDS=5] [STEPS=400] bench/elastic_cost_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
source "$root/bench/lib.sh"
bench_train_rounds "$build" 400
run_one() { "$train" --ranks 4 --sync ddp --max-steps "$steps" --elastic "$1" --json "$2" --quiet; }
bench_train_ab on off
out="$root/bench/results/elastic-cost.md"
python3 - "$tmp" "$rounds" "$steps" "$(nproc)" "$(date -u +%Y-%m-%d)" > "$out" <<'PY'
import json, statistics, sys
tmp, rounds, steps, cores, day = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def runs(mode): return [json.load(open(f"{tmp}/{mode}-{r}.json")) for r in range(1, rounds + 1)]
print("# What being elastic costs a run without faults")
print()
print(f"Command: `ROUNDS={rounds} STEPS={steps} bench/elastic_cost_bench.sh build` ({day}, {cores} cores): "
      f"`meridian-train --ranks 4 --sync ddp --max-steps {steps}` (784-1024-1024-10, batch 256) with `--elastic on` "
      "and `off` in turn. Medians over the rounds, [min-max].")
print()
print("| --elastic | samples/s | step time | step compute | exposed comm per step |")
print("| --- | --- | --- | --- | --- |")
med = {}
for mode in ("on", "off"):
    js = runs(mode)
    sps = [j["samples_per_s"] for j in js]
    step = [1e3 * j["wall_s"] / max(j["steps"], 1) for j in js]
    comp = [1e3 * j["compute_s"] / max(j["steps"], 1) for j in js]
    comm = [1e3 * j["exposed_comm_s"] / max(j["steps"], 1) for j in js]
    med[mode] = statistics.median(sps)
    print(f"| {mode} | {statistics.median(sps):.0f} [{min(sps):.0f}-{max(sps):.0f}] | "
          f"{statistics.median(step):.2f} ms [{min(step):.2f}-{max(step):.2f}] | {statistics.median(comp):.2f} ms | "
          f"{statistics.median(comm):.2f} ms |")
print()
print(f"samples/s, on / off: {med['on'] / max(med['off'], 1e-9):.3f}.")
PY
cat "$out"
