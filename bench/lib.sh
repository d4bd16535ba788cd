# Checks the benchmark scripts share (sourced, not run).

# bench_require_tools BUILD_DIR TOOL...: each bench/TOOL of the build exists.
bench_require_tools() {
  local build=$1 tool
  shift
  for tool in "$@"; do
    [ -x "$build/bench/$tool" ] || { echo "missing $build/bench/$tool: build first (cmake --build $build)" >&2; exit 1; }
  done
}

# bench_require_mpirun: OpenMPI's launcher is installed.
bench_require_mpirun() {
  command -v mpirun >/dev/null || { echo "mpirun not found: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1; }
}

# bench_require_rounds N: N is a positive integer (the ROUNDS setting).
bench_require_rounds() {
  [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer (got '$1')" >&2; exit 1; }
}

# bench_train_rounds BUILD_DIR DEFAULT_STEPS: the A/B trainer benchmarks' settings. Sets
# rounds (ROUNDS, default 5) and steps (STEPS, default DEFAULT_STEPS), both checked, train
# (the build's meridian-train, which must exist) and tmp (a scratch folder removed on exit).
bench_train_rounds() {
  rounds=${ROUNDS:-5}
  steps=${STEPS:-$2}
  bench_require_rounds "$rounds"
  [[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "STEPS must be a positive integer (got '$steps')" >&2; exit 1; }
  train="$1/trainer/meridian-train"
  [ -x "$train" ] || { echo "missing $train: build first (cmake --build $1)" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
}

# bench_train_ab MODE...: ROUNDS rounds, each running the caller's `run_one MODE JSON` for
# every mode in turn (alternated, so the machine's drift falls on all of them alike); a run's
# output goes to $tmp/MODE-ROUND.log (shown if it fails), its summary to $tmp/MODE-ROUND.json.
bench_train_ab() {
  local r mode
  for ((r = 1; r <= rounds; r++)); do
    for mode in "$@"; do
      run_one "$mode" "$tmp/$mode-$r.json" > "$tmp/$mode-$r.log" 2>&1 ||
        { cat "$tmp/$mode-$r.log" >&2; echo "$mode failed" >&2; exit 1; }
    done
    echo "round $r of $rounds done" >&2
  done
}
