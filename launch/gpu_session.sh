#!/usr/bin/env bash
# A GPU slot's checks and measurements in one command, within a time budget: the GPU tier (one
# parameter set of each check), then bench.gpu's groups, the open questions first. Each step gets
# what is left of the budget and, cut short, keeps what it finished (both tools write their
# records as they go). Nothing is downloaded: for a machine without a package registry.
#
#   bash launch/gpu_session.sh --out DIR                     # every step, within 540 s
#   bash launch/gpu_session.sh --out DIR --budget 1500 --peers PEERS
#   bash launch/gpu_session.sh --out DIR --steps scripts,causes
#   bash launch/gpu_session.sh --cpu --out DIR               # the same steps, tiny, on the CPU
#
# Steps, in this order (--steps picks some and runs them in the order it names them):
#   tier     bash launch/gpu_check.sh --first-of-each        -> DIR/tier/
#   scripts  bench.gpu --group scripts: nd.py on synthetic data and on generated JPEGs (the
#            default loader, --data-backend gpu and dali-gpu where installed), ddp.py on one rank
#   causes   bench.gpu --group causes: where DDP's cost on one GPU and the gap to timm's
#            compiled benchmark go (timm's benchmark.py from PEERS when it is there)
#   loop     bench.gpu --group loop,compile: the engine's step against a bare loop
#   peers    bench.gpu --group peers: end to end against timm's and torchvision's train.py
#            (skipped without --peers)
# --peers PEERS: a folder with timm's benchmark.py and train.py (from its repository's root) and
# torchvision's reference at vision/references/classification/train.py (a clone of
# pytorch/vision); whatever of these is there is used.
#
# DIR receives tier/ (gpu_check.sh's record), gpu_STEP.json (bench.gpu's records), bench/STEP/
# (their runs' output) and session.log (each step's command, exit status and seconds). Back on the
# development machine: `launch/env.sh python -m imagenet_recipes.bench.regenerate --archive
# DIR/tier gpu-tier`, and the gpu_*.json files into results/gpu/ (then bench.regenerate).
# Exit status: 0 when every step that ran exited 0, 1 when one did not, 2 on bad arguments or
# when gpu_check.sh --probe finds no GPU (or no torch, no pytest).
set -uo pipefail
cd "$(dirname "$0")/.."

all_steps=(tier scripts causes loop peers)
out="" budget=540 peers="" cpu=0 steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --budget) budget="${2:?--budget needs seconds}"; shift 2 ;;
    --peers) peers="${2:?--peers needs a folder}"; shift 2 ;;
    --steps) IFS=, read -ra steps <<< "${2:?--steps needs a list}"; shift 2 ;;
    --cpu) cpu=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
               exit 0 ;;
    *) echo "gpu_session: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_session: --out DIR is required" >&2; exit 2; }
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "gpu_session: --budget takes whole seconds" >&2; exit 2; }
for step in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $step "* ]] || {
    echo "gpu_session: unknown step $step; steps: ${all_steps[*]}" >&2; exit 2; }
done
[ ${#steps[@]} -gt 0 ] || steps=("${all_steps[@]}")
[ -z "$peers" ] || [ -d "$peers" ] || { echo "gpu_session: --peers $peers is not a folder" >&2
                                         exit 2; }
mkdir -p "$out" && out="$(cd "$out" && pwd)"
[ -z "$peers" ] || peers="$(cd "$peers" && pwd)"
python="${PYTHON:-python3}"
log="$out/session.log"

# bench.gpu's sizes: ResNet-50 as bench.gpu defaults on a GPU; a check of the composition on
# the CPU (the tools' own CPU tests measure each unit there).
if [ $cpu -eq 1 ]; then
  bench=(--device cpu -a timm/test_resnet --image-size 32 -b 4 --steps 2 --warmup 1 --repeats 2
         --amp-dtype float16 -j 1)
  tier=(--cpu)
else
  bench=() tier=()
fi

peer_file() {  # peer_file PATH: PEERS/PATH when it is there
  [ -n "$peers" ] && [ -f "$peers/$1" ] && echo "$peers/$1"
}
timm_benchmark="$(peer_file benchmark.py)" timm_train="$(peer_file train.py)"
torchvision="$(peer_file vision/references/classification/train.py)"

command_of() {  # command_of STEP: the step's command, one word per line; none: skipped
  # each bench.gpu call its own --out: run names (nd-synthetic, ...) recur between groups
  local bench=("${bench[@]}" --out "$out/bench/$1")
  case "$1" in
    tier) printf '%s\n' bash launch/gpu_check.sh --first-of-each "${tier[@]}" --out "$out/tier" ;;
    scripts|loop) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" \
                    --group "$([ "$1" = loop ] && echo loop,compile || echo scripts)" \
                    --json "$out/gpu_$1.json" ;;
    causes) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group causes \
              ${timm_benchmark:+--timm-benchmark "$timm_benchmark"} --json "$out/gpu_causes.json" ;;
    peers) [ -n "$timm_train$torchvision" ] || return 0
           printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group peers \
             ${timm_train:+--timm "$timm_train"} ${torchvision:+--torchvision "$torchvision"} \
             --json "$out/gpu_peers.json" ;;
  esac
}

note() { echo "gpu_session: $*" | tee -a "$log"; }
deadline=$((SECONDS + budget)) failed=()
note "budget $budget s; steps ${steps[*]}; records in $out"
# What the machine has (and this clone's package installed into that Python where it is not
# yet); no GPU, no torch or no pytest: nothing to do here.
bash launch/gpu_check.sh --probe "${tier[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { note "the machine check stopped the session (exit $rc)"; exit 2; }
for step in "${steps[@]}"; do
  mapfile -t cmd < <(command_of "$step")
  left=$((deadline - SECONDS))
  if [ ${#cmd[@]} -eq 0 ]; then
    note "$step: skipped (no peer script in --peers)"; continue
  fi
  if [ $left -le 10 ]; then
    note "$step: not run, the budget is spent"; continue
  fi
  note "$step: ${cmd[*]} (at most $left s)"
  start=$SECONDS
  # The tier's groups stop themselves at their own limit, kept within what is left; timeout
  # signals the step's whole process group (pytest, bench.gpu and what they started).
  group_limit=${GPU_CHECK_GROUP_LIMIT:-420}
  [ "$left" -ge "$group_limit" ] || group_limit=$left
  GPU_CHECK_GROUP_LIMIT=$group_limit timeout --kill-after=20 "$left" "${cmd[@]}"
  rc=$?
  cut=$([ $rc -eq 124 ] && echo ", cut at the budget")
  note "$step: exit $rc after $((SECONDS - start)) s$cut"
  [ $rc -eq 0 ] || failed+=("$step")
done
if [ ${#failed[@]} -gt 0 ]; then
  note "steps that did not exit 0: ${failed[*]}"
  exit 1
fi
note "done"
