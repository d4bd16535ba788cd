#!/usr/bin/env bash
# How fast a path that routing avoided carries its share again once its weight is back to
# neutral (issue 24), before and after a change, side by side in one run; figures into
# bench/results/path-recovery.md. `meridian-transport-bench --recovery` is built a second
# time from BASE's product code (with this tree's bench/transport_bench.cc, so both run the
# same mode) in a scratch directory; then the two binaries run in turn, RUNS times each, so
# that a slow spell of this shared machine hits both. Each run is ROUNDS rounds on fresh
# devices: a warm-up message, two with path 1 at weight 0.1 (what routing gives a congested
# path), then MESSAGES at neutral weights.
#
# Usage: [BASE=rev] [RUNS=3] [ROUNDS=5] [MESSAGES=10] bench/path_recovery_bench.sh [BUILD_DIR]
# BASE defaults to the commit before the last change to transport/multipath/scheduler.cc.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
after="$build/bench/meridian-transport-bench"
base=${BASE:-$(git -C "$root" log -1 --format=%H -- transport/multipath/scheduler.cc)~1}
base=$(git -C "$root" rev-parse --short "$base")
runs=${RUNS:-3}
rounds=${ROUNDS:-5}
messages=${MESSAGES:-10}
out="$root/bench/results/path-recovery.md"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$after" ] || { echo "missing $after: build it (ninja -C $build meridian-transport-bench)" >&2; exit 1; }

echo "== building meridian-transport-bench at $base (product code) in $tmp" >&2
mkdir "$tmp/src"
git -C "$root" archive "$base" | tar -x -C "$tmp/src"
cp "$root/bench/transport_bench.cc" "$tmp/src/bench/transport_bench.cc"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$tmp/src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMERIDIAN_BUILD_TESTS=OFF \
  -DMERIDIAN_ENABLE_CUDA=OFF "${launcher[@]}" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log" >&2; exit 1; }
cmake --build "$tmp/build" -j 2 --target meridian-transport-bench > "$tmp/build.log" 2>&1 ||
  { tail -40 "$tmp/build.log" >&2; exit 1; }
declare -A bin=([before]="$tmp/build/bench/meridian-transport-bench" [after]="$after")

args="--recovery --paths 2 --streams 1 --size 32M --chunk 256k --rounds $rounds --messages $messages --fair-share 0.4"
args="$args --avoided-weight 0.1"
for run in $(seq 1 "$runs"); do
  for name in before after; do
    echo "== $name run $run: meridian-transport-bench $args" >&2
    # shellcheck disable=SC2086
    "${bin[$name]}" $args > "$tmp/$name-$run.txt"
    tail -1 "$tmp/$name-$run.txt" >&2
  done
done

python3 - "$tmp" "$out" "$runs" "$base" "$(git -C "$root" rev-parse --short HEAD)" "$args" <<'PY'
import datetime, re, statistics, sys
tmp, out, runs, base, head, args = sys.argv[1:]
runs = int(runs)
rx = re.compile(r"after the restore: ([\d. ]+?)(?:; fair from message (\d+) \(([\d.]+) s|; not fair within (\d+) messages)")
never_fair = float("inf")  # a round not fair within its messages: past every fair one
rows, raw = {}, {}
for name in ("before", "after"):
    msgs, secs, means, lines = [], [], [], []
    for r in range(1, runs + 1):
        text = open(f"{tmp}/{name}-{r}.txt").read()
        lines += [l for l in text.splitlines() if l.startswith("round")]
        for m in rx.finditer(text):
            shares = [float(x) for x in m.group(1).split()]
            means.append(sum(shares) / len(shares))
            msgs.append(int(m.group(2)) if m.group(2) else never_fair)
            secs.append(float(m.group(3)) if m.group(2) else never_fair)
    rows[name] = (msgs, secs, means)
    raw[name] = lines
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
def med(v, fmt, past):
    x = statistics.median(v)
    return past if x == never_fair else fmt.format(x)
lines = [
    "# A de-weighted path's return to its share (issue 24)",
    "",
    f"Recorded {now} on this machine (2 cores, loopback, shared with other work) by",
    f"`bench/path_recovery_bench.sh`: `meridian-transport-bench {args}`, built from {base}",
    f"(before) and {head} (after), run in turn {runs} times each. Every round opens fresh devices",
    "with two loopback paths, sends one 32 MiB message at neutral weights, two with path 1 at",
    "weight 0.1 (what routing gives a congested path), then puts the weights back to neutral",
    "and sends the messages below. A round is fair from the first of two messages in a row",
    "in which path 1 carried at least 40% of the bytes (an even split is 50%); time and bytes",
    "are counted from the restore to the end of that message. Medians are over all rounds, a",
    "round that was not fair counting as later than any that was.",
    "",
    "Once fair, path 1's share can still wander in either build (see the last messages of some",
    "rounds): on loopback both paths share the same cores, any split is about as fast as any",
    "other, and the estimator follows whatever share a path is given. What the change fixes is",
    "the return: the raised path probes up to the best path's rate instead of waiting for",
    "noise to carry it there.",
    "",
    "| build | rounds fair | messages to fair (median) | MiB to fair (median) | time to fair (median) | path 1's mean share after the restore (median) |",
    "| --- | --- | --- | --- | --- | --- |",
]
n = int(re.search(r"--messages (\d+)", args).group(1))
for name, rev in (("before", base), ("after", head)):
    msgs, secs, means = rows[name]
    fair = sum(1 for m in msgs if m != never_fair)
    mib = [32 * m for m in msgs]
    lines.append(f"| {name} ({rev}) | {fair} of {len(msgs)} | {med(msgs, '{:.1f}', f'> {n}')} | "
                 f"{med(mib, '{:.0f}', f'> {32 * n}')} | {med(secs, '{:.3f} s', 'not within the run')} | "
                 f"{statistics.median(means):.3f} |")
lines += ["", "Every round (path 1's share of each message after the restore):", ""]
for name in ("before", "after"):
    lines += [f"{name}:", "", "```"] + raw[name] + ["```", ""]
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
PY
