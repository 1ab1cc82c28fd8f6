#!/usr/bin/env bash
# torchrun on one node: one process per GPU, or NPROC processes on a CPU-only machine.
#
#   launch/torchrun_single.sh train/ddp_apex.py --config nvidia_rn50_amp /data/imagenet
#   NPROC=2 launch/torchrun_single.sh train/ddp.py -a resnet18 --image-size 64 data/synthetic
#
#   NPROC        processes (default: the GPUs visible through CUDA_VISIBLE_DEVICES or nvidia-smi;
#                without GPUs: SLURM_CPUS_ON_NODE inside a SLURM job, else 2)
#   STOP_GRACE   seconds the ranks get to checkpoint after a stop signal before torchrun kills
#                them (default 120; torchrun's own default is 30)
#   TORCHRUN_ARGS  extra torchrun options, e.g. "--max-restarts=3"
#
# Runs in the project's Python environment (launch/env.sh). Besides SIGTERM, torchrun here also
# passes SIGUSR1 (SLURM's time-limit warning) on to the ranks, which then finish their step,
# write a checkpoint and exit 75; `--resume auto` continues the run (README, When things go wrong).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { sed -n '2,15p' "$0" >&2; exit 2; }

# shellcheck source=launch/processes.sh
source "$here/processes.sh"

nproc="$(processes_per_node "${SLURM_CPUS_ON_NODE:-2}")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one compute thread per process, as torchrun does

# shellcheck disable=SC2086  # TORCHRUN_ARGS is a list of options
exec "$here/env.sh" torchrun --standalone --nproc-per-node="$nproc" \
  --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
  --shutdown-timeout="${STOP_GRACE:-120}" ${TORCHRUN_ARGS:-} "$@"
