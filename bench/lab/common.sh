# Sourced by the lab benchmarks (lab_compare.sh, train_bench.sh, train_lab_tta.sh).
#
# lab_set_wan_rate: every inter-region link of a lab at one rate per plane. The lab's
# emulator is one thread sharing the cores with the ranks and moves about 600 Mbit/s in all,
# so with the topologies' 200-400 Mbit/s WAN links every contender would measure the
# emulator, not the WAN; at 40 Mbit/s per plane the WAN is the bottleneck, as between real
# regions.
#
# mpi_lab_*: one OpenMPI rank per lab node. mpirun runs inside the first node's namespace (so its out-of-band address is
# reachable from every node) with a hostfile of node names and plm_rsh_agent set to a tiny
# script that runs the daemon's command line in the named node's namespace
# (`ip netns exec <lab>-<node> sh -c`) instead of ssh; plm_rsh_no_tree_spawn keeps every
# launch on mpirun's side. The TCP BTL and the out-of-band channel are limited to
# 198.18.0.0/16, so MPI stripes over every plane as it would over several NICs, and its
# default algorithm choice stands (what a user gets). The ranks oversubscribe the machine's
# cores, which OpenMPI cannot see through the namespaces (one slot per "host"), so
# mpi_yield_when_idle is set as it would set it itself: its ranks otherwise spin and starve
# the lab's emulator thread.

# mpi_lab_nodes LAB_NAME LAB_COMMAND...: the lab's node names in rank order (the rows of
# `status` whose namespace is <lab>-<node>), one per line.
mpi_lab_nodes() {
  local name=$1
  shift
  "$@" status | awk -v p="$name-" 'index($3, p) == 1 {print $1}'
}

# mpi_lab_prepare LAB_NAME DIR NODE...: writes DIR/mpi-hosts and DIR/netns-rsh and sets
# MPI_LAB_ARGS to the mpirun command line (append the program and its arguments), to be run
# with `meridian-lab run NODE1 -- "${MPI_LAB_ARGS[@]}" PROGRAM ...`.
mpi_lab_prepare() {
  local name=$1 dir=$2
  shift 2
  printf '%s slots=1\n' "$@" > "$dir/mpi-hosts"
  cat > "$dir/netns-rsh" <<RSH
#!/bin/sh
# plm_rsh_agent for mpirun: "HOST CMD..." runs CMD in the lab namespace of node HOST.
host=\$1
shift
exec ip netns exec "$name-\$host" /bin/sh -c "\$*"
RSH
  chmod +x "$dir/netns-rsh"
  MPI_LAB_ARGS=(mpirun --allow-run-as-root -np "$#" --hostfile "$dir/mpi-hosts"
                --mca plm_rsh_agent "$dir/netns-rsh" --mca plm_rsh_no_tree_spawn 1 --bind-to none
                --mca mpi_yield_when_idle 1 --mca pml ob1 --mca btl tcp,self
                --mca btl_tcp_if_include 198.18.0.0/16 --mca oob_tcp_if_include 198.18.0.0/16)
}

# mpi_lab_launch LOG READY LAUNCH_S RUN_S CMD...: runs CMD (mpirun through `meridian-lab run`)
# with its output in LOG, for at most RUN_S seconds, and returns its status. OpenMPI's launch
# through the namespaces hangs now and then before any rank is up (lab_compare.sh: no output
# for the whole timeout; train_bench.sh, 2026-12-04: mpirun alone for 12 minutes, no daemon
# started), which is not what the benchmarks measure. READY is a command (a function name,
# called with LOG) that succeeds once the ranks are up; if it has not after LAUNCH_S seconds,
# the launch is killed and started once more, and MPI_LAB_RELAUNCHED is set to 1 (0 otherwise);
# MPI_LAB_STARTED is the time (date +%s.%N) the launch that ran began.
mpi_lab_launch() {
  local log=$1 ready=$2 launchS=$3 runS=$4 attempt pid waited rc=0
  shift 4
  MPI_LAB_RELAUNCHED=0
  for attempt in 1 2; do
    MPI_LAB_STARTED=$(date +%s.%N)
    timeout --kill-after=10 "$runS" "$@" > "$log" 2>&1 &
    pid=$!
    waited=0
    while kill -0 "$pid" 2>/dev/null && ! "$ready" "$log" && [ "$waited" -lt "$launchS" ]; do
      sleep 1
      waited=$((waited + 1))
    done
    if [ "$attempt" -eq 1 ] && kill -0 "$pid" 2>/dev/null && ! "$ready" "$log"; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      echo "== launch hung: no rank up after ${launchS} s; killed and started again: $*" >&2
      MPI_LAB_RELAUNCHED=1
      continue
    fi
    wait "$pid" || rc=$?
    return "$rc"
  done
}

# lab_set_wan_rate LAB_NAME TOPOLOGY_FILE MBIT LAB_COMMAND...: sets every link between two
# different regions of the topology, on every plane, to MBIT Mbit/s with 100 ms of queue.
lab_set_wan_rate() {
  local name=$1 topo=$2 mbit=$3
  shift 3
  local queue="$((mbit * 100000 / 8 / 1000))KB" regions planes p a b
  regions=$(python3 -c "import yaml,sys; print(' '.join(r['name'] for r in yaml.safe_load(open(sys.argv[1]))['regions']))" "$topo")
  planes=$(python3 -c "import yaml,sys; print(' '.join(p['name'] for p in yaml.safe_load(open(sys.argv[1]))['planes']))" "$topo")
  for p in $planes; do
    for a in $regions; do
      for b in $regions; do
        if [[ "$a" < "$b" ]]; then "$@" set "$p" "$a" "$b" --rate "${mbit}Mbit" --queue "$queue" >/dev/null; fi
      done
    done
  done
}
