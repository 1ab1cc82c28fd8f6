# Sourced by the torchrun wrappers and launch/slurm/common.sh: how many processes one node runs.
# shellcheck shell=bash

visible_gpus() {  # what CUDA will see: CUDA_VISIBLE_DEVICES if set, else every GPU of nvidia-smi
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -cE '^([0-9]+|GPU-.*|MIG-.*)$' || true
  else
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  fi
}

processes_per_node() {  # NPROC, else one per visible GPU, else $1 (a CPU count)
  local gpus
  if [ -n "${NPROC:-}" ]; then echo "$NPROC"; return; fi
  gpus="$(visible_gpus)"
  if [ "$gpus" -gt 0 ]; then echo "$gpus"; else echo "$1"; fi
}
