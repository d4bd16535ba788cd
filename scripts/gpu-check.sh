#!/usr/bin/env bash
# GPU checks, run on the device machine (../shared/device/README.md): runs the CUDA backend's
# parity test against the CPU backend (log in kernels_parity.log), builds the NCCL net
# plugin and nccl-allreduce-check, then runs real NCCL with two ranks on the one GPU, each
# with its own NCCL_HOSTID so NCCL takes them for two hosts and all traffic goes through
# the plugin (NCCL_NET=Meridian makes a plugin that fails to load an error, not a fallback).
# Also times meridian-train on the GPU (train-gpu-*.json / .log).
# Logs and the busbw table go to $OUT (default ./gpu-out).
# Usage: scripts/gpu-check.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DMERIDIAN_WERROR=OFF >"$out/configure.log" 2>&1
cmake --build "$build" -j "$(nproc)" --target nccl-net-meridian meridian-nccl-check nccl-allreduce-check \
  kernels_backend_parity_test meridian-train >"$out/build.log" 2>&1
nvidia-smi -L | tee "$out/gpu.txt"
echo "== CUDA backend vs CPU backend:"
"$build/tests/kernels/kernels_backend_parity_test" >"$out/kernels_parity.log" 2>&1 || true
tail -n 3 "$out/kernels_parity.log"
# A timed training run on the GPU (the default model, 2 epochs): one rank, then two ranks
# sharing the GPU with DDP over loopback (gradients staged through pinned host memory).
echo "== meridian-train on the GPU:"
# The data set: Debian's package, or its copy in the sysroot of ../shared/device/fetch-debs.sh
# (fetch-debs.sh DEST dataset-fashion-mnist).
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || data=/tmp/sysroot/usr/share/datasets/fashion-mnist
for n in 1 2; do
  MERIDIAN_SECRET=gpu-check "$build/trainer/meridian-train" --ranks "$n" --device cuda --epochs 2 --data-dir "$data" \
    --json "$out/train-gpu-$n.json" >"$out/train-gpu-$n.log" 2>&1 || echo "meridian-train --ranks $n failed"
  tail -n 9 "$out/train-gpu-$n.log"
done
# The small CNN (im2col, col2im and pooling kernels in training), one rank.
MERIDIAN_SECRET=gpu-check "$build/trainer/meridian-train" --ranks 1 --device cuda --model 784-c16-c32-128-10 --epochs 1 \
  --data-dir "$data" --json "$out/train-gpu-cnn.json" >"$out/train-gpu-cnn.log" 2>&1 || echo "meridian-train (cnn) failed"
tail -n 9 "$out/train-gpu-cnn.log"
export LD_LIBRARY_PATH="$build/nccl_plugin:${LD_LIBRARY_PATH:-}"
export NCCL_NET_PLUGIN=meridian NCCL_NET=Meridian NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
export MERIDIAN_SECRET=gpu-check MERIDIAN_PATHS=127.0.0.1,127.0.0.2
id="$out/nccl-id"
rm -f "$id"
NCCL_HOSTID=meridian-a "$build/bench/nccl-allreduce-check" --rank 0 --id-file "$id" >"$out/rank0.log" 2>&1 &
pid=$!
NCCL_HOSTID=meridian-b "$build/bench/nccl-allreduce-check" --rank 1 --id-file "$id" >"$out/rank1.log" 2>&1
wait "$pid"
echo "== NCCL chose:"; grep -E "NET/Meridian|Using network|NET/Plugin" "$out/rank0.log" | head -20
echo "== allreduce through the plugin (rank 0):"; grep -E "^#|^ " "$out/rank0.log"
