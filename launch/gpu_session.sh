#!/usr/bin/env bash
# A GPU slot's checks and measurements in one command, within a time budget: the GPU tier (one
# parameter set of each check), then bench.gpu's groups. Each step gets what is left of the
# budget and, cut short, keeps what it finished (both tools write their records as they go).
# The same command again with the same --out goes on where the last one stopped: a step that
# finished (exit 0) is not run again. Nothing is downloaded: for a machine without a package
# registry; this clone is installed into the Python that runs it where that Python does not
# import it yet (launch/install_clone.sh).
#
#   bash launch/gpu_session.sh --out DIR --peers PEERS       # within 540 s; again: the rest
#   bash launch/gpu_session.sh --out DIR --steps causes,loop  # some steps, in this order
#   bash launch/gpu_session.sh --cpu --out DIR               # the same steps, tiny, on the CPU
#                                                            # (within 1500 s)
#
# Steps, in this order (--steps picks some and runs them in the order it names them):
#   tier     bash launch/gpu_check.sh --first-of-each        -> DIR/tier/
#   scripts  bench.gpu --group scripts: nd.py on synthetic data and on generated JPEGs (the
#            default loader, --data-backend gpu and dali-gpu where installed), ddp.py on one rank
#   decode   bench.gpu --group decode: each data backend's input pipeline alone (no model), a
#            batch ready on the GPU, against the synthetic training rate: the decode capacity
#   peers    bench.gpu --group peers: nd.py (the default command) end to end against timm's
#            train.py, one run each in turns, on the scripts' JPEG set (84,480 images at the GPU
#            sizes: three epochs take several times the runs' start-up) (skipped without
#            timm's train.py in --peers)
#   causes   bench.gpu --group causes: where DDP's cost on one GPU and the gap to timm's
#            compiled benchmark go (timm's benchmark.py from PEERS when it is there)
#   loop     bench.gpu --group loop,compile: the engine's step against a bare loop
# The JPEG set that scripts, decode and peers read is made once, beside the tier (CPU work while the
# tier's checks use the GPU), in DIR/jpegs/.
# Sized from one H200's times (tier 133 s, scripts 110 s without the set, a peers run's start-up
# and first step 22-26 s; decode estimated at 1.5 min): tier, scripts and decode fit the default
# budget and peers starts in what is left; a second call of the same command runs the rest
# (peers, causes, loop and compile).
# --peers PEERS: a folder with timm's benchmark.py and train.py (from its repository's root);
# bench.gpu --group peers --torchvision compares with torchvision's reference too (longer: its
# runs take 1.5-1.9x ours).
#
# DIR receives tier/ (gpu_check.sh's record), gpu_STEP.json (bench.gpu's records), bench/STEP/
# (their runs' output) and session.log (each step's command, exit status and seconds). Back on the
# development machine: `launch/env.sh python -m imagenet_recipes.bench.regenerate --archive
# DIR/tier gpu-tier`, and the gpu_*.json files into results/gpu/ (then bench.regenerate).
# Exit status: 0 when every step that ran exited 0, 1 when one did not, 2 on bad arguments or
# when gpu_check.sh --probe finds no GPU (or no torch, no pytest, or cannot install the clone).
set -uo pipefail
cd "$(dirname "$0")/.."

all_steps=(tier scripts decode peers causes loop)
out="" budget="" peers="" cpu=0 steps=()
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
# The default budget: a GPU slot's 540 s; on the CPU, where the tier alone simulates every check
# on 2 cores (3-6 minutes), 1500 s
[ -n "$budget" ] || { [ $cpu -eq 1 ] && budget=1500 || budget=540; }
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
jpegs="$out/jpegs"

command_of() {  # command_of STEP: the step's command, one word per line; none: skipped
  # each bench.gpu call its own --out: run names (nd-synthetic, ...) recur between groups
  local bench=("${bench[@]}" --out "$out/bench/$1")
  case "$1" in
    tier) printf '%s\n' bash launch/gpu_check.sh --first-of-each "${tier[@]}" --out "$out/tier" ;;
    scripts) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group scripts \
               --data "$jpegs" --json "$out/gpu_scripts.json" ;;
    decode) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group decode \
              --data "$jpegs" --json "$out/gpu_decode.json" ;;
    loop) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" \
            --group loop,compile --json "$out/gpu_loop.json" ;;
    causes) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group causes \
              ${timm_benchmark:+--timm-benchmark "$timm_benchmark"} --json "$out/gpu_causes.json" ;;
    peers) [ -n "$timm_train" ] || return 0
           printf '%s\n' "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --group peers \
             --timm "$timm_train" --peers-data "$jpegs" --peers-only "nd fast" \
             --peers-repeats 1 --json "$out/gpu_peers.json" ;;
  esac
}

note() { echo "gpu_session: $*" | tee -a "$log"; }
finished() {  # finished STEP: an earlier call with this --out ran STEP to its end
  grep -q "^gpu_session: $1: exit 0 after" "$log" 2>/dev/null
}
deadline=$((SECONDS + budget)) failed=()
note "budget $budget s; steps ${steps[*]}; records in $out"
# What the machine has (and this clone's package installed into that Python where it is not
# yet); no GPU, no torch or no pytest: nothing to do here.
bash launch/gpu_check.sh --probe "${tier[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { note "the machine check stopped the session (exit $rc)"; exit 2; }

# The JPEG set of scripts, decode and peers, made in the background from here (beside the tier),
# within the budget; the first step that reads it waits for it.
jpegs_pid=""
for step in "${steps[@]}"; do
  if [[ $step =~ ^(scripts|decode|peers)$ ]] && ! finished "$step" && [ -z "$jpegs_pid" ]; then
    timeout "$budget" "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --prepare-data \
      --data "$jpegs" > "$out/jpegs.log" 2>&1 &
    jpegs_pid=$!
    trap 'kill $jpegs_pid 2>/dev/null' EXIT
  fi
done
jpegs_ready() {
  [ -n "$jpegs_pid" ] || return 0
  wait "$jpegs_pid"
  local rc=$?
  jpegs_pid=""
  [ $rc -eq 0 ] && note "JPEG set ready: $(tail -n 1 "$out/jpegs.log")" && return 0
  note "the JPEG set could not be made (exit $rc; $out/jpegs.log)"
  jpegs_failed=1
}
jpegs_failed=0

for step in "${steps[@]}"; do
  if finished "$step"; then
    note "$step: finished in an earlier call with this --out"; continue
  fi
  mapfile -t cmd < <(command_of "$step")
  left=$((deadline - SECONDS))
  if [ ${#cmd[@]} -eq 0 ]; then
    note "$step: skipped (no peer script in --peers)"; continue
  fi
  if [[ $step =~ ^(scripts|decode|peers)$ ]]; then
    jpegs_ready
    [ $jpegs_failed -eq 0 ] || { failed+=("$step"); continue; }
    left=$((deadline - SECONDS))
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
