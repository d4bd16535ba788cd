#!/usr/bin/env bash
# The README's first command: Meridian's main job. Installs what it needs, builds, and
# runs every collective across 4 local ranks (nccl-tests-style tables, each result
# checked). Later issues turn this into the cross-region training demo.
# Extra arguments go to meridian-bench (e.g. -e 16M, --ops all_reduce).
source "$(dirname "$0")/lib/common.sh"
ensure_packages
configure_and_build meridian-bench
say "running every collective across 4 local ranks"
exec "$MERIDIAN_BUILD/bench/meridian-bench" --ranks 4 --ops all -b 16 -e 64M -f 4 "$@"
