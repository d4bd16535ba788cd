#!/usr/bin/env bash
# The README's second command: the whole test suite. Installs what it needs, builds
# everything (the fuzzer through a clang sub-build), and runs ctest: labels unit and
# slow always; lab and gpu tests skip with the reason where root/TUN or a GPU is missing.
# Extra arguments go to ctest (e.g. -L unit, -R transport).
source "$(dirname "$0")/lib/common.sh"
ensure_packages
configure_and_build
say "running the tests"
cd "$MERIDIAN_BUILD"
exec ctest --output-on-failure --timeout 900 -j 2 "$@"
