#!/usr/bin/env bash
# torchrun on one of several nodes: run the same command on every node (by hand, pdsh, or srun as
# launch/slurm/ddp_amp_multi_node.sbatch does). The c10d rendezvous on HEAD:PORT numbers the nodes,
# so no --node-rank is needed and the nodes may start in any order.
#
#   launch/torchrun_multi.sh NNODES HEAD[:PORT] SCRIPT [ARGS...]
#   launch/torchrun_multi.sh 2 node01:29500 train/ddp_apex.py --config nvidia_rn50_amp /data/imagenet
#
#   NNODES       number of nodes (or MIN:MAX for an elastic range)
#   HEAD[:PORT]  a host all nodes can reach (e.g. the first node); it hosts the rendezvous store
#                (PORT default 29500)
#   NPROC        processes per node (default: the node's visible GPUs; without GPUs
#                SLURM_CPUS_ON_NODE inside a SLURM job, else 2)
#   RDZV_ID      rendezvous id, the same on every node (default: $SLURM_JOB_ID, else "recipes")
#   STOP_GRACE   seconds the ranks get to checkpoint after SIGTERM/SIGUSR1 (default 120)
#   TORCHRUN_ARGS  extra torchrun options, e.g. "--max-restarts=3 --rdzv-conf join_timeout=900"
#
# Checkpoints and --resume assume a filesystem shared by the nodes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 3 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
nnodes="$1" endpoint="$2"
shift 2
case "$endpoint" in *:*) ;; *) endpoint="$endpoint:29500" ;; esac

# shellcheck source=launch/processes.sh
source "$here/processes.sh"

nproc="$(processes_per_node "${SLURM_CPUS_ON_NODE:-2}")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# shellcheck disable=SC2086  # TORCHRUN_ARGS is a list of options
exec "$here/env.sh" torchrun --nnodes="$nnodes" --nproc-per-node="$nproc" \
  --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id="${RDZV_ID:-${SLURM_JOB_ID:-recipes}}" \
  --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
  --shutdown-timeout="${STOP_GRACE:-120}" ${TORCHRUN_ARGS:-} "$@"
