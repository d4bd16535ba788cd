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
