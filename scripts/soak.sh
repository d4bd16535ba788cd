#!/usr/bin/env bash
# Runs the test suite several times in a row, to show it does not fail at random: stops at
# the first failing run and prints its output. With --busy, `stress-ng --cpu <cores>` keeps
# every core busy meanwhile (started and stopped here, by its PID).
#
# Usage: scripts/soak.sh [--busy] ROUNDS [CTEST ARGS ...]
#   scripts/soak.sh --busy 5 -L 'unit|slow'    # the unit and slow labels, 5 times, cores busy
#   scripts/soak.sh 3                          # the whole suite, 3 times, quiet machine
# Expects a build in build/ (./scripts/test.sh makes one); MERIDIAN_BUILD_DIR overrides it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MERIDIAN_BUILD_DIR:-$root/build}
busy=0
if [ "${1:-}" = --busy ]; then
  busy=1
  shift
fi
rounds=${1:-}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { sed -n '2,9p' "$0" >&2; exit 2; }
shift
[ -f "$build/CTestTestfile.cmake" ] || { echo "no build in $build: run ./scripts/test.sh first" >&2; exit 1; }
stress=""
cleanup() { [ -n "$stress" ] && kill "$stress" 2>/dev/null && wait "$stress" 2>/dev/null; true; }
trap cleanup EXIT
if [ "$busy" = 1 ]; then
  command -v stress-ng >/dev/null || { echo "stress-ng not found: apt-get install stress-ng" >&2; exit 1; }
  stress-ng --cpu "$(nproc)" --quiet &
  stress=$!
fi
log=$(mktemp)
for r in $(seq "$rounds"); do
  start=$(date +%s)
  if (cd "$build" && ctest --output-on-failure --timeout 900 -j 2 "$@") > "$log" 2>&1; then
    echo "run $r/$rounds: $(grep -E 'tests passed' "$log" | tail -1) in $(( $(date +%s) - start )) s"
  else
    echo "run $r/$rounds: FAILED after $(( $(date +%s) - start )) s" >&2
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
done
rm -f "$log"
echo "all $rounds runs passed$([ "$busy" = 1 ] && echo " with stress-ng --cpu $(nproc) running")"
