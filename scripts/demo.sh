#!/usr/bin/env bash
# The README's first command: Meridian's main job, a cross-region training demo.
#
# Installs what it needs, builds, then: brings up the three-region lab (London, Virginia,
# Singapore; two nodes each, real round trips of 78-217 ms, every WAN link 40 Mbit/s per
# plane), starts Debian's Prometheus on 127.0.0.1:9490 (it finds every node through the lab's
# service-discovery file), runs meridian-train on all six nodes, cuts one cross-region path
# (wan-a London-Virginia) to a tenth of its rate at 30% of the run, 15 s later takes
# Singapore off the network for 20 s (every plane, both ways: its ranks are declared lost,
# London and Virginia train on, Singapore rejoins once it is back), and ends with a summary:
# accuracy, wall time, speedup against one node, the latency matrix Meridian measured, the
# congestion and the outage with how Meridian responded (membership, training rate, each
# plane's cross-region traffic before and after each event), and where the metrics,
# dashboards and the PNG are. The lab and Prometheus are taken down at the end, also on
# Ctrl-C or a failure, unless --keep.
#
# Needs root (network namespaces) and /dev/net/tun. About 3 minutes after the build.
# Options: --keep (or MERIDIAN_DEMO_KEEP=1) leaves the lab and Prometheus up for a look.
# Environment: MERIDIAN_DEMO_SYNC (hybrid), MERIDIAN_DEMO_EPOCHS (4), MERIDIAN_DEMO_OUT
# (./demo-out), MERIDIAN_DEMO_OUTAGE=0 leaves the outage out.
keep=${MERIDIAN_DEMO_KEEP:-0}
for arg in "$@"; do
  case $arg in
    --keep) keep=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$arg' (expected --keep)" >&2; exit 2 ;;
  esac
done
source "$(dirname "$0")/lib/common.sh"
source "$MERIDIAN_ROOT/bench/lab/common.sh"
ensure_packages
configure_and_build meridian-train meridian-lab

[ "$(id -u)" -eq 0 ] || { say "the demo needs root (it creates network namespaces)"; exit 1; }
[ -c /dev/net/tun ] || { say "the demo needs /dev/net/tun (modprobe tun)"; exit 1; }

sync=${MERIDIAN_DEMO_SYNC:-hybrid}
epochs=${MERIDIAN_DEMO_EPOCHS:-4}
outage=${MERIDIAN_DEMO_OUTAGE:-1}
outageRegion=singapore
outageAfter=15   # seconds after the congestion
outageFor=20
out=${MERIDIAN_DEMO_OUT:-$PWD/demo-out}
wanMbit=40
congestedMbit=4
labName=demo
lab=("$MERIDIAN_BUILD/lab/meridian-lab" --lab "$labName")
topology="$MERIDIAN_ROOT/lab/topologies/three-regions.yaml"
prom=127.0.0.1:9490
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log "$out"/*.dat "$out"/*.png "$out"/inject.txt "$out"/isolate.txt "$out"/reconnect.txt
export MERIDIAN_PROMETHEUS_DIR="$out/prometheus"

trainPid=""
readerPid=""
timelinePid=""
startedProm=0
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  set +e  # tear everything down, whatever fails on the way
  # The training job first (its ranks die with it), then the lab and Prometheus.
  if [ -n "$trainPid" ]; then kill "$trainPid" 2>/dev/null; wait "$trainPid" 2>/dev/null || true; fi
  if [ -n "$readerPid" ]; then kill "$readerPid" 2>/dev/null; wait "$readerPid" 2>/dev/null || true; fi
  if [ -n "$timelinePid" ]; then kill "$timelinePid" 2>/dev/null; wait "$timelinePid" 2>/dev/null || true; fi
  if [ "$keep" = 1 ] && [ "$code" = 0 ]; then
    "${lab[@]}" reconnect "$outageRegion" >/dev/null 2>&1 || true  # an outage the run outlived
    say "left up: lab '$labName' (${lab[*]} down) and Prometheus (MERIDIAN_PROMETHEUS_DIR=$MERIDIAN_PROMETHEUS_DIR scripts/prometheus.sh stop)"
    exit 0
  fi
  "${lab[@]}" down >/dev/null 2>&1 || true
  if [ "$startedProm" = 1 ]; then "$MERIDIAN_ROOT/scripts/prometheus.sh" stop >/dev/null 2>&1 || true; fi
  exit "$code"
}
trap cleanup EXIT
# Ctrl-C: the script waits in `wait` (below), which a signal interrupts at once.
trap 'echo; say "interrupted: tearing down"; exit 130' INT TERM

say "bringing up the three-region lab (London, Virginia, Singapore; 2 nodes each)"
"${lab[@]}" down >/dev/null 2>&1 || true
"${lab[@]}" up "$topology" > "$out/lab-up.log"
lab_set_wan_rate "$labName" "$topology" "$wanMbit" "${lab[@]}"

if [ "$("$MERIDIAN_ROOT/scripts/prometheus.sh" status | cut -d' ' -f1)" != running ]; then
  # Every second: the outage's membership changes and the traffic moving take seconds.
  MERIDIAN_SCRAPE_INTERVAL=1s "$MERIDIAN_ROOT/scripts/prometheus.sh" start > "$out/prometheus-start.log"
  startedProm=1
fi
say "Prometheus on http://$prom (config $MERIDIAN_PROMETHEUS_DIR/prometheus.yml)"

# ---- Training, with a progress line and the congestion injected half-way ----------------
say "training on 6 nodes: sync $sync, $epochs epochs of Fashion-MNIST; wan-a London-Virginia drops to ${congestedMbit} Mbit/s at 30%"
[ "$outage" = 1 ] && say "then, ${outageAfter} s later, ${outageRegion^} goes off the network for ${outageFor} s"
"${lab[@]}" exec-all -- "$MERIDIAN_BUILD/trainer/meridian-train" --sync "$sync" -H 16 --model 784-256-256-10 \
  --batch 240 --epochs "$epochs" --log-every 5 --eval-every 100 --json "$out/train.json" > "$out/train.log" 2>&1 &
trainPid=$!
bar() {  # bar STEP TOTAL TEXT
  local width=30 filled=$(( $1 * 30 / ($2 > 0 ? $2 : 1) ))
  printf '\r  [%-*s] %s' "$width" "$(printf '%*s' "$filled" '' | tr ' ' '#')" "$3"
}
membershipLine='membership: ([0-9]+) -> ([0-9]+) ranks'  # rank 0's line for each change
progress() {
  local injected=0 step total line
  tail -n +1 --pid="$trainPid" -F "$out/train.log" 2>/dev/null | while IFS= read -r line; do
    if [[ $line =~ step\ +([0-9]+)/([0-9]+)\ \|.*loss\ ([0-9.]+).*train\ acc\ +([0-9.]+)%.*\|\ +([0-9]+)\ samples/s ]]; then
      step=${BASH_REMATCH[1]}
      total=${BASH_REMATCH[2]}
      bar "$step" "$total" "step $step/$total  loss ${BASH_REMATCH[3]}  train acc ${BASH_REMATCH[4]}%  ${BASH_REMATCH[5]} samples/s  "
      if [ "$injected" = 0 ] && [ "$step" -ge $((total * 3 / 10)) ]; then
        "${lab[@]}" set wan-a london virginia --rate "${congestedMbit}Mbit" >/dev/null
        date +%s.%N > "$out/inject.txt"
        injected=1
        printf '\n  >> congestion injected at step %s: wan-a London-Virginia now %s Mbit/s\n' "$step" "$congestedMbit"
      fi
    elif [[ $line =~ $membershipLine ]]; then
      printf '\n  >> membership %s -> %s ranks\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    fi
  done
}
# The outage, on its own clock from the congestion: the region's every plane cut both ways,
# then put back. Its times go to isolate.txt and reconnect.txt for the report.
timeline() {
  while [ ! -s "$out/inject.txt" ]; do sleep 0.2; done
  sleep "$outageAfter"
  "${lab[@]}" isolate "$outageRegion" >/dev/null && date +%s.%N > "$out/isolate.txt"
  printf '\n  >> %s taken off the network (every plane, both ways) for %s s\n' "${outageRegion^}" "$outageFor"
  sleep "$outageFor"
  "${lab[@]}" reconnect "$outageRegion" >/dev/null && date +%s.%N > "$out/reconnect.txt"
  printf '\n  >> %s back on the network\n' "${outageRegion^}"
}
progress &
readerPid=$!
if [ "$outage" = 1 ]; then
  timeline &
  timelinePid=$!
fi
if ! wait "$trainPid"; then
  trainPid=""
  echo
  say "training failed; its output:"
  tail -n 30 "$out/train.log" >&2
  exit 1
fi
trainPid=""
wait "$readerPid" 2>/dev/null || true
readerPid=""
if [ -n "$timelinePid" ]; then  # a run shorter than the outage: the region comes back now
  kill "$timelinePid" 2>/dev/null || true  # done already when the run outlived the outage
  wait "$timelinePid" 2>/dev/null || true
  timelinePid=""
  if [ -s "$out/isolate.txt" ] && [ ! -s "$out/reconnect.txt" ]; then "${lab[@]}" reconnect "$outageRegion" >/dev/null; fi
fi
echo
sleep 3  # one more scrape after the end

# ---- What Prometheus saw -------------------------------------------------------------------
python3 "$MERIDIAN_ROOT/scripts/lib/demo_report.py" --prometheus "http://$prom" --out "$out" \
  --train-json "$out/train.json" --inject "$out/inject.txt" --congested-plane wan-a \
  --congested-regions london virginia --congested-mbit "$congestedMbit" --wan-mbit "$wanMbit" \
  --isolate "$out/isolate.txt" --reconnect "$out/reconnect.txt" --isolated-region "$outageRegion"
if command -v gnuplot >/dev/null && [ -f "$out/plot.gp" ]; then
  gnuplot "$out/plot.gp" 2>"$out/gnuplot.log" && say "picture: $out/demo.png" || say "gnuplot failed: $out/gnuplot.log"
fi
# Prometheus's address only where it stays up: kept, or running before the demo.
if [ "$keep" = 1 ] || [ "$startedProm" = 0 ]; then
  where="Prometheus stays up: http://$prom/graph?g0.expr=max(meridian_trainer_world_size)&g0.range_input=5m (graph page)"
else
  where="scraped by Prometheus, stopped with the lab (./scripts/demo.sh --keep leaves both up for a look)"
fi
cat <<EOF

  Metrics:    every rank's /metrics (addresses in $out/lab-up.log), $where
  Dashboards: monitoring/grafana/ (import the JSON, or provision it: monitoring/grafana/README.md)
  Raw:        $out/train.log, $out/train.json, $out/report.json
EOF
