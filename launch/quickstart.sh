#!/usr/bin/env bash
# The main job on built-in defaults, end to end, on whatever this machine has:
#   1. generate a small ImageNet-like dataset of real JPEGs (10 classes) under data/synthetic,
#   2. train ResNet-18 with DDP (train/ddp_apex.py) on every GPU, or on 2 CPU processes,
#   3. leave TensorBoard events, the JSONL log and checkpoints under runs/.
# Mixed precision is on (O1) wherever it is fast: on GPUs (fp16), and on CPUs with native
# bfloat16. On CPUs without it (no AVX512-BF16/AMX) bf16 is emulated and ~25x slower than fp32
# (see RESULTS.md), so there the job runs O0. Extra arguments are passed to the trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
data="${DATA:-data/synthetic}"

launch/env.sh python data/make_synthetic.py "$data" --classes 10 --train-per-class 100 \
  --val-per-class 20

read -r gpus fast_bf16 < <(launch/env.sh python -c \
  "import torch; print(torch.cuda.device_count(), int(torch.ops.mkldnn._is_mkldnn_bf16_supported()))")
if [ "$gpus" -gt 0 ]; then
  nproc=$gpus; opt=O1; size=128
else
  nproc=2; size=64
  if [ "$fast_bf16" = 1 ]; then opt=O1; else opt=O0; fi
fi
echo "quickstart: $nproc process(es), opt level $opt, ${size}px (GPUs: $gpus)"

OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} launch/env.sh torchrun --standalone --nproc_per_node="$nproc" \
  train/ddp_apex.py -a resnet18 --image-size "$size" -b 32 --epochs 5 --lr 0.4 \
  --warmup-epochs 1 --lr-schedule cosine --opt-level "$opt" --run-name "quickstart-$(date +%Y%m%d-%H%M%S)" \
  "$@" "$data"
echo "quickstart: done. See: tensorboard --logdir runs"
