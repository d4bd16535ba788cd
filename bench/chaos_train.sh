#!/usr/bin/env bash
# Chaos run of elastic training (issue 28): meridian-train --ranks 4 (DDP, elastic, the real
# Fashion-MNIST) for about DURATION seconds while, every INTERVAL seconds, one rank (chosen at
# random, never the one hosting the job's store) is killed with SIGKILL and, DELAY seconds
# later, a process started with --join takes its job rank back. Every progress line of the run
# is timestamped as it arrives.
#
# Figures:
#   availability  the share of wall time in which training made progress: every gap between
#                 two progress lines (LOG_EVERY steps apart) longer than 3x the median gap counts,
#                 beyond the median, as time without progress;
#   recoveries    from the cut collective to the survivors' agreed state (the trainer's own
#                 figure per change), and the time to admit each joiner with the state;
#   samples lost  none by design (the cut step is redone with the whole global batch): the
#                 run must end at its last step with every rank's weights equal (the trainer
#                 checks them at the end of an elastic DDP run) and exit 0, joiners included.
# A calibration run without faults first measures the steps that fill DURATION; its accuracy
# is the undisturbed reference. Writes bench/results/chaos-training.md.
#
# Each gap counted is put down to the last fault event (kill or join) before it: what losses
# cost and what joins cost, apart.
# KEEP=DIR keeps the run's logs (chaos.log, faults.log, joiner-N.log) in DIR.
#
# Usage: [DURATION=300] [INTERVAL=30] [DELAY=5] [LOG_EVERY=10] [SEED=1] [KEEP=DIR] bench/chaos_train.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
duration=${DURATION:-300}
interval=${INTERVAL:-30}
delay=${DELAY:-5}
logEvery=${LOG_EVERY:-10}
seed=${SEED:-1}
for v in duration interval delay logEvery seed; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer (got '${!v}')" >&2; exit 1; }
done
(( delay < interval )) || { echo "DELAY ($delay) must be shorter than INTERVAL ($interval)" >&2; exit 1; }
train="$build/trainer/meridian-train"
[ -x "$train" ] || { echo "missing $train: build first (cmake --build $build)" >&2; exit 1; }
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "missing $data: apt-get install dataset-fashion-mnist" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp -r "$tmp"/. "$KEEP"/; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
common=(--data-dir "$data" --sync ddp --model 784-512-512-10 --batch 256 --eval-every 1000000 --seed "$seed")
export MERIDIAN_SECRET=${MERIDIAN_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export MERIDIAN_METRICS_ADDR=0

# Calibration: how many steps fill DURATION undisturbed (and the reference accuracy).
"$train" --ranks 4 "${common[@]}" --max-steps 300 --quiet --json "$tmp/calib.json" > "$tmp/calib.log" 2>&1 ||
  { cat "$tmp/calib.log" >&2; exit 1; }
steps=$(python3 -c "import json,sys; j=json.load(open('$tmp/calib.json')); print(max(300, int($duration * j['samples_per_s'] / 256)))")
echo "calibration: $steps steps fill about ${duration} s" >&2
"$train" --ranks 4 "${common[@]}" --max-steps "$steps" --quiet --json "$tmp/straight.json" > "$tmp/straight.log" 2>&1 ||
  { cat "$tmp/straight.log" >&2; exit 1; }

# The chaos run: the launcher's output timestamped line by line.
"$train" --ranks 4 "${common[@]}" --max-steps "$steps" --log-every "$logEvery" --json "$tmp/chaos.json" 2>&1 |
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done > "$tmp/chaos.log" &
pipeline=$!
# job rank -> pid, for the ranks the launcher started and the joiners started here.
declare -A pidOf=()
launcher=""
for ((i = 0; i < 100 && ${#pidOf[@]} < 4; i++)); do
  sleep 0.1
  launcher=$(pgrep -o -f -- "^$train --ranks 4 .*--json $tmp/chaos.json" || true)
  [ -n "$launcher" ] || continue
  pidOf=()
  for c in $(cat "/proc/$launcher/task/$launcher/children" 2>/dev/null); do
    r=$(tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | sed -n 's/^MERIDIAN_RANK=//p')
    [ -n "$r" ] && pidOf[$r]=$c
  done
done
(( ${#pidOf[@]} == 4 )) || { echo "the training did not start its 4 ranks" >&2; exit 1; }
pids+=("$launcher")
launchEnv() { tr '\0' '\n' < "/proc/${pidOf[1]}/environ" | sed -n "s/^$1=//p"; }  # as rank 1 was started
store=$(launchEnv MERIDIAN_STORE)
# A joiner starts where the rank it replaces ran, as a supervisor restarting that rank would:
# with the launch environment it had (how many ranks share the host, among the rest).
localSize=$(launchEnv MERIDIAN_LOCAL_WORLD_SIZE)
RANDOM=$seed
faults=0
start=$(date +%s)
joiners=()
killed=()
while kill -0 "$launcher" 2>/dev/null; do
  sleep "$((interval - delay))"
  kill -0 "$launcher" 2>/dev/null || break
  victim=$((1 + RANDOM % 3))  # job rank 0 hosts the job's store
  p=${pidOf[$victim]:-}
  if [ -z "$p" ] || ! kill -0 "$p" 2>/dev/null; then continue; fi
  kill -9 "$p"
  killed+=("$p")
  faults=$((faults + 1))
  printf '%s [chaos] killed job rank %s (pid %s)\n' "$EPOCHREALTIME" "$victim" "$p" >> "$tmp/faults.log"
  sleep "$delay"
  kill -0 "$launcher" 2>/dev/null || break
  MERIDIAN_STORE=$store MERIDIAN_RANK=$victim MERIDIAN_LOCAL_RANK=$victim MERIDIAN_LOCAL_WORLD_SIZE=$localSize \
    "$train" --join "${common[@]}" --max-steps "$steps" --quiet \
    > "$tmp/joiner-$faults.log" 2>&1 &
  pidOf[$victim]=$!
  pids+=("$!")
  joiners+=("$!")
  printf '%s [chaos] started a joiner for job rank %s (pid %s)\n' "$EPOCHREALTIME" "$victim" "$!" >> "$tmp/faults.log"
done
runStatus=0
wait "$pipeline" || runStatus=$?  # the launcher's status (pipefail)
python3 -c "import json; json.load(open('$tmp/chaos.json'))" 2>/dev/null || runStatus=1
# A joiner that was itself a later victim ended by our SIGKILL; every other one must end well.
joinFailures=0
for j in "${joiners[@]}"; do
  if wait "$j"; then continue; fi
  [[ " ${killed[*]} " == *" $j "* ]] || joinFailures=$((joinFailures + 1))
done
out="$root/bench/results/chaos-training.md"
python3 - "$tmp" "$faults" "$joinFailures" "$runStatus" "$duration" "$interval" "$delay" "$logEvery" "$seed" \
  "$(nproc)" "$(date -u +%Y-%m-%d)" > "$out" <<'PY'
import json, re, statistics, sys
tmp, faults, joinFailures, runStatus, duration, interval, delay, logEvery, seed, cores, day = sys.argv[1:]
lines = [l.rstrip("\n").split(" ", 1) for l in open(f"{tmp}/chaos.log") if " " in l]
progress = [float(t) for t, text in lines if re.search(r"\bstep +\d+/\d+ \|", text)]
gaps = [b - a for a, b in zip(progress, progress[1:])]
wall = progress[-1] - progress[0] if len(progress) > 1 else 0
median = statistics.median(gaps) if gaps else 0
lost = sum(g - median for g in gaps if g > 3 * median)
# Each counted gap (its end) put down to the last fault event before it.
events = []
for l in open(f"{tmp}/faults.log") if faults != "0" else []:
    t, text = l.split(" ", 1)
    events.append((float(t), "kill" if "killed" in text else "join"))
lostAfter = {"kill": 0.0, "join": 0.0, "none": 0.0}
for a, b in zip(progress, progress[1:]):
    if b - a <= 3 * median:
        continue
    before = [kind for t, kind in events if t <= b]
    lostAfter[before[-1] if before else "none"] += b - a - median
availability = 1 - lost / wall if wall > 0 else 0
recover = [float(m.group(1)) for t, text in lines
           for m in [re.search(r"; ([0-9.]+) s to recover, going on from step", text)] if m]
admit = [float(m.group(1)) for t, text in lines
         for m in [re.search(r"joined(?:, [^;]*?)?, at step \d+(?: \(asked at step \d+\))?, "
                             r"(?:state handed over in|the members stopped) ([0-9.]+) s", text)] if m]
ok = runStatus == "0"
j = json.load(open(f"{tmp}/chaos.json")) if ok else {}
s = json.load(open(f"{tmp}/straight.json"))
print("# Chaos: elastic training through rank kills and joins")
print()
print(f"Command: `DURATION={duration} INTERVAL={interval} DELAY={delay} LOG_EVERY={logEvery} SEED={seed} "
      f"bench/chaos_train.sh build` ({day}, {cores} cores): `meridian-train --ranks 4 --sync ddp --model "
      f"784-512-512-10 --batch 256` on the real Fashion-MNIST; every {interval} s a random rank other than job rank 0 "
      f"killed with SIGKILL, a `--join` process for its job rank started {delay} s later.")
print()
print("| figure | value |")
print("| --- | --- |")
print(f"| faults (kills, each followed by a join) | {faults} |")
print(f"| run ended at its last step, exit 0 | {'yes' if ok and j.get('final_step') == s['final_step'] else 'NO'} "
      f"({j.get('final_step', '-')} of {s['final_step']} steps) |")
print(f"| joiners that failed | {joinFailures} |")
print(f"| membership | {' -> '.join(str(x) for x in j.get('world_sizes', []))} |")
print(f"| wall time, chaos vs undisturbed | {j.get('wall_s', 0):.1f} s vs {s['wall_s']:.1f} s |")
print(f"| availability (progress share of wall time) | {100 * availability:.2f}% ({lost:.1f} s without progress "
      f"in {wall:.1f} s; median gap between progress lines {1e3 * median:.0f} ms) |")
print(f"| time without progress after kills / after joins / after neither | {lostAfter['kill']:.1f} s / "
      f"{lostAfter['join']:.1f} s / {lostAfter['none']:.1f} s |")
if recover:
    print(f"| recovery per loss (cut step to agreed state) | median {statistics.median(recover):.2f} s, "
          f"max {max(recover):.2f} s over {len(recover)} |")
if admit:
    print(f"| admitting a joiner (the members' stop: switch and state hand-over) | median {statistics.median(admit):.2f} s, max {max(admit):.2f} s "
          f"over {len(admit)} |")
print(f"| samples lost | 0 by design: the cut step is redone with the whole global batch |")
print(f"| test accuracy, chaos vs undisturbed | {100 * j.get('test_accuracy', 0):.2f}% vs {100 * s['test_accuracy']:.2f}% |")
print()
if faults and lost > 0:
    per = lost / int(faults)
    for every in (3600, 86400):
        print(f"At one fault every {every // 3600} h, {per:.2f} s without progress per fault gives an availability of "
              f"{100 * (1 - per / every):.4f}%.")
    print()
print("Time without progress per fault is what the run measured (loss: detection, agreement, successor, state; "
      "join: the members' admission at a step boundary), divided evenly over the faults; the extrapolation assumes "
      "faults one at a time, each costing what these did.")
PY
cat "$out"
