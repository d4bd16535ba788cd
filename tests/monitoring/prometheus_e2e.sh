#!/usr/bin/env bash
# End to end (label slow): Debian's real Prometheus scrapes a real job, and every query of
# every shipped dashboard (panels and annotations) returns data with the labels it needs.
#
# The job: meridian-train --ranks 4 over two loopback "planes" in two named regions, on the
# real Fashion-MNIST, long enough for Prometheus to scrape every rank several times. Its
# --ranks launcher writes the service-discovery file Prometheus watches; nothing is
# configured by hand. Prometheus, its data and the discovery files live in a scratch
# directory, on ports of their own, and are stopped by PID however the test ends.
# Usage: prometheus_e2e.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
command -v prometheus >/dev/null || { echo "prometheus not found: apt-get install prometheus" >&2; exit 1; }
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "Fashion-MNIST missing: apt-get install dataset-fashion-mnist" >&2; exit 1; }
work=$(mktemp -d)
export MERIDIAN_PROMETHEUS_DIR="$work/prometheus"
export MERIDIAN_PROMETHEUS_SD_DIR="$work/sd"
export MERIDIAN_PROMETHEUS_ADDR=127.0.0.1:$((19490 + RANDOM % 500))
export MERIDIAN_SCRAPE_INTERVAL=1s
export MERIDIAN_METRICS_ADDR=127.0.0.1:$((19000 + RANDOM % 400))
jobPid=""
cleanup() {
  set +e
  if [ -n "$jobPid" ]; then kill "$jobPid" 2>/dev/null; wait "$jobPid" 2>/dev/null || true; fi
  "$src/scripts/prometheus.sh" stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$src/scripts/prometheus.sh" start
MERIDIAN_PATHS=127.0.0.1,127.0.0.2 MERIDIAN_PLANES=lo-a,lo-b \
  "$build/trainer/meridian-train" --ranks 4 --regions east,east,west,west --model 784-128-10 --batch 64 \
  --epochs 100 --log-every 10 --eval-every 20 > "$work/train.log" 2>&1 &
jobPid=$!
# Every panel and annotation query, checked against Prometheus until all pass (up to 90 s).
python3 "$src/tests/monitoring/check_queries.py" --prometheus "http://$MERIDIAN_PROMETHEUS_ADDR" \
  --dashboards "$src/monitoring/grafana/dashboards" --timeout 90 --ranks 4 || {
  echo "--- training output:"; tail -n 20 "$work/train.log"
  echo "--- prometheus log:"; tail -n 20 "$MERIDIAN_PROMETHEUS_DIR/prometheus.log"
  exit 1
}
kill -0 "$jobPid" 2>/dev/null || { echo "the training job ended early:"; tail -n 20 "$work/train.log"; exit 1; }
