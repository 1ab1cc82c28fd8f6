#!/usr/bin/env bash
# CPU throughput of the strategies on this machine, for RESULTS.md: nd (all cores, and one core)
# vs DDP on 2 processes x 1 thread (weak scaling: -b per process), fp32 vs bf16, synthetic data
# (compute only) and the generated JPEG dataset (with the input pipeline). Then prints the table
# (imagenet_recipes/bench/summarize.py, from the runs' logs). The last two runs hold oneDNN and ATen to AVX2, which
# is how a CPU without native bf16 (no AVX512-BF16/AMX) runs: where bf16 is emulated, O1 is far
# slower than fp32. To keep the measurement for RESULTS.md:
#   launch/env.sh python -m imagenet_recipes.bench.regenerate --archive runs/bench-cpu-<stamp> cpu
#
#   bash tools/bench_cpu.sh            # ~12 minutes on a 2-core box
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
# O1 bf16: as many steps as fp32 where the CPU has native bf16; 4 where it is emulated (~25x slower)
if [ "$($T python -c 'import torch; print(torch.ops.mkldnn._is_mkldnn_bf16_supported())')" = True ]; then
  bf16_steps=(--steps-per-epoch 25 -p 5); else bf16_steps=(--steps-per-epoch 4 -p 2); fi
OMP_NUM_THREADS=1 run $T torchrun --standalone --nproc_per_node=2 train/ddp_apex.py "${common[@]}" "${synthetic[@]}" "${bf16_steps[@]}" --opt-level O1 --amp-dtype bfloat16 --run-name ddp-2x1thread-O1bf16-synthetic
run $T python train/nd.py "${common[@]}" --steps-per-epoch 25 --run-name nd-2threads-fp32-jpeg "$data"
OMP_NUM_THREADS=1 run $T torchrun --standalone --nproc_per_node=2 train/ddp.py "${common[@]}" --steps-per-epoch 15 --run-name ddp-2x1thread-fp32-jpeg "$data"
avx2=(env ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1)
run "${avx2[@]}" $T torchrun --standalone --nproc_per_node=2 train/ddp.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 25 --run-name ddp-2x1thread-fp32-synthetic-avx2
run "${avx2[@]}" $T torchrun --standalone --nproc_per_node=2 train/ddp_apex.py "${common[@]}" "${synthetic[@]}" --steps-per-epoch 4 -p 2 --opt-level O1 --amp-dtype bfloat16 --run-name ddp-2x1thread-O1bf16-synthetic-avx2
$T python -m imagenet_recipes.bench.summarize "$out"/*
