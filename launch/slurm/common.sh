# Sourced by the batch scripts in launch/slurm/: what they share. Not a script of its own.
# shellcheck shell=bash
#
# A batch script runs from a copy in SLURM's spool dir, so it finds the repository through
# RECIPES_REPO or the submit dir (submit from the repository root) and sources this file, which
#   * cd's to the repository and fixes the run dir: runs/slurm-$SLURM_JOB_ID (RUN_NAME, LOGDIR),
#     the same after every requeue, so `--resume auto` continues it;
#   * builds the trainer's arguments (train_args) from DATA/ARCH/... and the script's arguments;
#   * runs the training step in the background (run_preemptible) so the batch shell can take
#     SLURM's time-limit warning (USR1) and pass it on; the ranks checkpoint and exit 75;
#   * afterwards requeues the job if the run log says it stopped on that warning (finish).
set -euo pipefail

recipes_repo="${RECIPES_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}"
cd "$recipes_repo"

LOGDIR="${LOGDIR:-runs}"
RUN_NAME="${RUN_NAME:-slurm-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}}"
RUN_DIR="$LOGDIR/$RUN_NAME"
STOP_SIGNAL="${STOP_SIGNAL:-USR1}"  # what the batch shell passes on to the training step
export STOP_GRACE="${STOP_GRACE:-120}"  # torchrun: seconds to checkpoint before SIGKILL

note() { echo "[$(date +%H:%M:%S) slurm job ${SLURM_JOB_ID:-none}] $*"; }

# shellcheck source=launch/processes.sh
source launch/processes.sh  # (cwd is the repository now)

# Processes per node: NPROC, else one per GPU, else one per allocated CPU. Exported, so the
# torchrun wrappers (and srun's tasks on the other nodes: homogeneous nodes assumed) use it too.
NPROC="$(processes_per_node "${SLURM_CPUS_ON_NODE:-$(nproc)}")"
export NPROC
# On a CPU node, split the allocated cores among the processes (1 thread each by default).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( ${SLURM_CPUS_ON_NODE:-$NPROC} / NPROC > 0 ? ${SLURM_CPUS_ON_NODE:-$NPROC} / NPROC : 1 ))}"

hostnames() {  # the job's nodes, one per line (the first one hosts rank 0 / the rendezvous)
  scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}"
}

node_addr() {  # NODE: the address SLURM reaches it at (NodeAddr; usually its name)
  local addr
  addr="$(scontrol show node "$1" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)"
  echo "${addr:-$1}"
}

# TRAIN_ARGS: the trainer's command line. DATA, ARCH, BATCH, EPOCHS, OPT_LEVEL, LOADER_WORKERS
# (environment) come first, then the stable run dir with RESUME_ARGS, then the script's own
# arguments, so an option given there wins (argparse keeps the last one).
RESUME_ARGS=(--resume auto)  # fresh the first time, continues the run dir after a requeue
train_args() {
  TRAIN_ARGS=()
  [ -z "${DATA:-}" ] || TRAIN_ARGS+=("$DATA")
  [ -z "${ARCH:-}" ] || TRAIN_ARGS+=(--arch "$ARCH")
  [ -z "${BATCH:-}" ] || TRAIN_ARGS+=(--batch-size "$BATCH")
  [ -z "${EPOCHS:-}" ] || TRAIN_ARGS+=(--epochs "$EPOCHS")
  [ -z "${OPT_LEVEL:-}" ] || TRAIN_ARGS+=(--opt-level "$OPT_LEVEL")
  [ -z "${LOADER_WORKERS:-}" ] || TRAIN_ARGS+=(--workers "$LOADER_WORKERS")
  TRAIN_ARGS+=(--logdir "$LOGDIR" --run-name "$RUN_NAME" "${RESUME_ARGS[@]}" "$@")
  # the run dir the trainer will use, should the arguments name another one (the last one wins)
  local i arg next
  for ((i = 0; i < ${#TRAIN_ARGS[@]}; i++)); do
    arg="${TRAIN_ARGS[i]}" next="${TRAIN_ARGS[i + 1]:-}"
    case "$arg" in
      --logdir) LOGDIR="$next" ;;
      --logdir=*) LOGDIR="${arg#*=}" ;;
      --run-name) RUN_NAME="$next" ;;
      --run-name=*) RUN_NAME="${arg#*=}" ;;
    esac
  done
  RUN_DIR="$LOGDIR/$RUN_NAME"
}

# The step is started in the background: bash runs a trap only between commands, and `wait` is
# the one command a trapped signal interrupts. The stop signal is passed on once: torchrun treats
# a second one as "give up waiting for the ranks".
forward_stop_signal() {  # default: signal the step's process (torchrun, or srun which relays it)
  kill -s "$STOP_SIGNAL" "$STEP_PID" 2>/dev/null || true
}

_on_stop_signal() {
  if [ -n "${STOP_FORWARDED:-}" ]; then
    note "SIG$1 again: already passed on; waiting for the checkpoint"
    return
  fi
  STOP_FORWARDED=1
  note "SIG$1 received: passing SIG$STOP_SIGNAL on to the training, which checkpoints and exits"
  forward_stop_signal
}

run_preemptible() {  # CMD [ARGS...]
  LOG_LINES_BEFORE="$( (wc -l < "$RUN_DIR/log.jsonl") 2>/dev/null || echo 0)"
  note "restart ${SLURM_RESTART_COUNT:-0}; nodes: $(hostnames | paste -sd, -); $NPROC process(es) per node; run dir $RUN_DIR"
  note "running: $*"
  trap '_on_stop_signal USR1' USR1
  # SIGTERM (scancel, the time limit, preemption by SLURM) reaches the training processes from
  # SLURM directly; the shell only notes it and waits for them to checkpoint and stop.
  GOT_SIGTERM=""
  trap 'GOT_SIGTERM=1; note "SIGTERM received; waiting for the training to checkpoint and stop"' TERM
  "$@" &
  STEP_PID=$!
  while true; do
    STEP_RC=0
    wait "$STEP_PID" || STEP_RC=$?
    kill -0 "$STEP_PID" 2>/dev/null || break  # gone: STEP_RC is its status; else a trap ran
  done
  trap - USR1 TERM
  note "training step ended with status $STEP_RC"
}

_end_reason() {  # reason of the last `end` record this job step wrote, or nothing
  [ -f "$RUN_DIR/log.jsonl" ] || return 0
  tail -n "+$((LOG_LINES_BEFORE + 1))" "$RUN_DIR/log.jsonl" | python3 -c '
import json, sys
reason = ""
for line in sys.stdin:
    try:
        record = json.loads(line)
    except ValueError:  # e.g. a line cut short by a crash
        continue
    if record.get("kind") == "end":
        reason = record.get("reason", "")
print(reason)'
}

# Requeue if this step's run stopped on our warning signal (its last end record says "preempted
# by SIGUSR1"); the requeued job starts this script again and --resume auto continues the run.
# Not after SIGTERM: that is SLURM ending the job (scancel, the time limit, preemption, which
# requeues by itself if so configured), and a requeue would undo a cancel. The ranks checkpoint
# on SIGTERM too, so such a run can still be continued by hand.
finish() {
  local reason
  reason="$(_end_reason)"
  if [ "$reason" = "preempted by SIG$STOP_SIGNAL" ] && [ -z "$GOT_SIGTERM" ]; then
    note "run $reason; checkpoint in $RUN_DIR; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" || {
      note "scontrol requeue failed (submitted with --no-requeue?): resubmit with RUN_NAME=$RUN_NAME to continue"
      exit 75
    }
    exit 0
  fi
  case "$reason" in
    preempted*)
      note "run $reason, stopped by SLURM: not requeued. Its checkpoint is in $RUN_DIR; to" \
           "continue: scontrol requeue $SLURM_JOB_ID, or resubmit with RUN_NAME=$RUN_NAME" ;;
    "") note "no end record from this run (status $STEP_RC): see the messages above" ;;
    *) note "run ended: $reason" ;;
  esac
  exit "$STEP_RC"
}
