# Shared by the README's two commands: install what Meridian needs from Debian (only
# what is missing, quietly), then configure and build. Source it; do not run it.
set -euo pipefail

MERIDIAN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MERIDIAN_BUILD=${MERIDIAN_BUILD_DIR:-$MERIDIAN_ROOT/build}

# Debian packages: the build, the tests, and the side-by-side benchmarks.
MERIDIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libssl-dev zlib1g-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
  dataset-fashion-mnist
  libgtest-dev libgmock-dev libbenchmark-dev
  libfabric-dev libibverbs-dev
  openmpi-bin libopenmpi-dev libgloo-dev
  clang libclang-rt-14-dev
  iproute2 libyaml-cpp-dev iperf3 iputils-ping
  libopenblas-dev zlib1g-dev dataset-fashion-mnist
  prometheus-cpp-dev prometheus gnuplot-nox
)
# npm, for the Grafana dashboard schema check (tests/monitoring). Nodesource's nodejs ships
# its own npm and conflicts with Debian's, so ask Debian only when there is none.
command -v npm >/dev/null 2>&1 || MERIDIAN_PACKAGES+=(npm)

say() { printf '\033[1m[meridian]\033[0m %s\n' "$*" >&2; }

ensure_packages() {
  local missing=()
  for p in "${MERIDIAN_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { say "need root to install: ${missing[*]}"; exit 1; }
    sudo=(sudo)
  fi
  say "installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# configure_and_build [TARGET...]: Release-with-debug-info build in $MERIDIAN_BUILD.
configure_and_build() {
  local jobs
  jobs=$(nproc)
  if [ ! -f "$MERIDIAN_BUILD/build.ninja" ]; then
    say "configuring $MERIDIAN_BUILD"
    # ccache, where the machine has it, keeps rebuilds of a fresh clone cheap.
    local launcher=()
    command -v ccache >/dev/null 2>&1 &&
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    cmake -S "$MERIDIAN_ROOT" -B "$MERIDIAN_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DMERIDIAN_WERROR=ON "${launcher[@]}" >/dev/null
  fi
  say "building${*:+ $*}"
  if [ $# -gt 0 ]; then
    cmake --build "$MERIDIAN_BUILD" -j "$jobs" --target "$@"
  else
    cmake --build "$MERIDIAN_BUILD" -j "$jobs"
  fi
}
