#!/usr/bin/env bash
# Runs a libFuzzer binary for a bounded time from a seed corpus (copied, so the
# checked-in corpus is never modified). Usage: run_fuzzer.sh FUZZER SEED_DIR SECONDS
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3
[ -x "$fuzzer" ] || { echo "fuzzer $fuzzer was not built" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$seeds"/. "$work/"
cd "$work"
export MERIDIAN_LOG=off
exec "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 "$work"
