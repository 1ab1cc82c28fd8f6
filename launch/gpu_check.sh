#!/usr/bin/env bash
# GPU acceptance in one command, on a machine with at least one CUDA GPU: every entry script for
# a few real steps, each opt level in float16 and bfloat16, 2 ranks sharing the GPU (validation,
# SyncBatchNorm, preemption and resume), DALI GPU and CPU loaders against the pytorch one, O2
# resume bit for bit, channels_last, --compile, then ResNet-50 throughput (the engine against a
# bare loop, and from JPEGs through DALI and through DataLoader workers).
#
#   bash launch/gpu_check.sh                  # everything; one PASS/FAIL/SKIP line per check
#   bash launch/gpu_check.sh --list           # the checks, by group
#   bash launch/gpu_check.sh --only entries,precision
#   bash launch/gpu_check.sh --record         # also results/gpu/ and RESULTS.md's block
#
# Exit 0: nothing failed; 1: a check failed; 2: no CUDA GPU here, or bad arguments.
# It runs in the project's environment (launch/env.sh creates it on first use); on a machine
# whose python already holds torch, torchvision and tensorboard, RECIPES_VENV=system uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec launch/env.sh python -m bench.gpu_check "$@"
