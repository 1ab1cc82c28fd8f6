#!/usr/bin/env bash
# CPU throughput of the strategies on this machine, for RESULTS.md: nd (all cores, and one core)
# vs DDP on 2 processes x 1 thread (weak scaling: -b per process), fp32 vs bf16, synthetic data
# (compute only) and the generated JPEG dataset (with the input pipeline). Then prints the table
# (bench/summarize.py, from the runs' logs).
#
#   bash launch/bench_cpu.sh            # ~10 minutes on a 2-core box
set -euo pipefail
cd "$(dirname "$0")/.."
out="${LOGDIR:-runs/bench-cpu-$(date +%Y%m%d-%H%M%S)}"  # fresh per invocation
data="${DATA:-data/synthetic}"
common=(-a resnet18 --image-size 64 -b 32 --epochs 1 -p 5 --logdir "$out" -j 1)
synthetic=(--dummy --synthetic-classes 10 --synthetic-val-size 64)
run() { echo "== $*" >&2; "$@" > /dev/null; }

launch/env.sh python data/make_synthetic.py "$data" --classes 10 --train-per-class 100 \
  --val-per-class 20 > /dev/null
T="launch/env.sh"
run $T python train/nd.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 25 --run-name nd-2threads-fp32-synthetic
OMP_NUM_THREADS=1 run $T python train/nd.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 25 --run-name nd-1thread-fp32-synthetic
OMP_NUM_THREADS=1 run $T torchrun --standalone --nproc_per_node=2 train/ddp.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 25 --run-name ddp-2x1thread-fp32-synthetic
OMP_NUM_THREADS=1 run $T torchrun --standalone --nproc_per_node=2 train/ddp_apex.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 4 -p 2 --run-name ddp-2x1thread-O1bf16-synthetic
run $T python train/nd.py "${common[@]}" --steps-per-epoch 25 --run-name nd-2threads-fp32-jpeg "$data"
OMP_NUM_THREADS=1 run $T torchrun --standalone --nproc_per_node=2 train/ddp.py "${common[@]}" --steps-per-epoch 15 --run-name ddp-2x1thread-fp32-jpeg "$data"
$T python -m bench.summarize "$out"/*
