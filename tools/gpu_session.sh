#!/usr/bin/env bash
# A GPU slot's measurements and checks in one command, within a time budget, with what it
# recorded packed into one archive at the end. Each step gets what is left of the budget and,
# cut short, keeps what it finished (every tool writes its record as it goes); the archive is
# written whatever happened. Nothing is downloaded: for a machine without a package registry
# (Horovod is left out: it needs a build, launch/install_horovod.sh); this clone is installed
# into the Python that runs it where that Python does not import it yet (install_clone.sh).
#
#   bash tools/gpu_session.sh --wheels gpu-kit/wheels --archive $OUT/gpu-run.tar.gz
#                                                      # the GPU run: within 8 minutes
#   bash tools/gpu_session.sh --cpu --archive run.tar.gz      # the same steps, tiny, on a CPU
#   bash tools/gpu_session.sh --out DIR --steps tier,peers --peers PEERS   # other steps
#
# The default steps, in this order (--steps picks steps and runs them in the order it names):
#   step         what (records in DIR)                                              H200, s
#   (JPEG set)   53,760 generated JPEGs at 314-493 px in --data, 16 cores, in the    (40)
#                background from the start (beside the probe); the first step
#                that reads it waits for it (none when --data holds it already)
#   (start)      --wheels (at most 90 s), install_clone.sh, gpu_check.sh --probe:     35
#                each GPU decoder decodes a batch of -b copies of a known JPEG on
#                the GPU in a process of its own, at most 45 s each: torchcodec,
#                nvimgcodec (regions), nvimgcodec-whole (DIR/probe.txt)
#   decode       bench.gpu --group decode: nd-synthetic (train/nd.py --dummy, the     75
#                reference), then each input pipeline alone, batches ready on the
#                GPU: decode-pytorch (default -j), decode-gpu-torchcodec,
#                decode-gpu-nvimgcodec, decode-dali-gpu/-cpu (gpu_decode.json)
#   scripts      bench.gpu: train/nd.py on the JPEG set with the default loader     120
#                (pytorch-loader), --data-backend gpu with each --gpu-decoder
#                (gpu-decode, gpu-decode-nvimgcodec) and dali-gpu (where DALI
#                imports), each against nd-synthetic (gpu_scripts.json)
#   tier-decode  gpu_check.sh decode: the GPU tier's decode checks, every          105
#                parameter set (DIR/tier-decode/; on the CPU: --cpu --first-of-each);
#                before the compile: these checks failed on the last GPU run
#   compile      bench.gpu: the same with nvImageCodec and --compile                105
#                (gpu-decode-nvimgcodec-compile; target >= 6,000 img/s on an H200):
#                75 s as the other loader rows, 30 s more for validation's own
#                compiled graph (an estimate: not yet timed) (gpu_compile.json)
#   smi          train/nd.py with -j 8 on the JPEG set; at its first logged          25
#                intervals, nvidia-smi --query-compute-apps=pid,process_name,
#                used_memory beside the trainer's pid and its workers' (bench.gpu.
#                processes: gpu_processes.json; "missing" without nvidia-smi)
#   (targets)    the run's three targets, met or not (bench.gpu.targets: printed,      2
#                DIR/targets.json)
#   (archive)    DIR's records packed into --archive                                  2
#   total                                                                          469
# The seconds are estimates from the H100 and H200 records (each train/nd.py run costs about 22
# s of start-up and end; nd-synthetic 29 s, the pytorch loader 40 s, TorchCodec 61 s on 84,480
# JPEGs; the JPEG set 58 s for 84,480 on 16 cores); the probe's and the compile's are not yet
# timed on a GPU. To fit, the loader rows count over 6 log intervals (bench.gpu
# --loader-window 6, not 10: the JPEG set shrinks in proportion), nd-synthetic is measured once
# and reused by the later steps (--reuse), and the decode group's pytorch row runs at the
# default -j only. The budget (default 540 s) counts from the start, the probe included; a step
# gets what is left of it and is killed 20 s after its end: the whole command ends within 10
# minutes however a step or a decoder behaves, within 8 by the estimates.
# The probe's verdicts decide what runs (each skip or change says why in session.log):
#   torchcodec BROKEN or MISSING    its rows of decode and scripts skipped
#   nvimgcodec BROKEN, nvimgcodec-whole OK
#                                   nvImageCodec's rows of decode, scripts and compile decode
#                                   whole images (bench.gpu --nvimgcodec-whole: their config
#                                   and note say so), so the hardware decoder is still measured
#   both nvImageCodec modes BROKEN  its rows and the compile step skipped
#   tier-decode                     the broken decoders' checks skipped, saying why
#                                   (GPU_TIER_BROKEN_DECODERS); the step skipped when no
#                                   decoder works
#
# Other steps (not run by default): tier (gpu_check.sh --first-of-each: one parameter set of
# each check, 133 s on an H200, DIR/tier/; the decode group left out where tier-decode ran
# with this --out, every parameter set of it), peers (bench.gpu --group peers against timm's
# train.py in --peers, on the JPEG set), causes (bench.gpu --group causes and ddp-1rank; timm's
# benchmark.py from --peers when there), loop (bench.gpu --group loop,compile).
#
# --out DIR: the records (default: a new folder in $TMPDIR or /tmp). The same command again
# with the same --out goes on where the last one stopped: a step that finished (exit 0) is not
# run again. --data DIR: the JPEG set, made there once and reused (default:
# $TMPDIR/imagenet_recipes-jpegs/gpu, or /cpu with --cpu), never inside DIR.
# --wheels DIR: wheel files installed first (pip install --no-index --no-deps DIR/*.whl): the
# GPU decoders a machine without a registry lacks (tools/gpu_kit.sh DIR fetches them into
# DIR/wheels: TorchCodec, nvImageCodec, nvJPEG and py-spy, 41.7 MB for Python 3.12).
# --archive PATH: at the end, DIR's records as one .tar.gz (session.log, probe.txt, targets.json,
# commit.txt, gpu_*.json, tier*/ and bench/*/ with the runs' logs and console output; no JPEGs,
# no checkpoints, no file over 5 MB: those are named in archive-left-out.txt), whatever
# happened, bad arguments included. --budget SECONDS: from the start to the last step's end
# (default: 540; with --cpu 840: at tiny sizes the default steps took 270 s on 2 cores from a
# fresh clone, for an archive of 31 kB). --peers PEERS: a folder with timm's benchmark.py and
# train.py. --commit TEXT: the commit measured, for a copy of the tree without .git (default:
# git's; else the file `commit` in --wheels, which tools/gpu_kit.sh writes; else
# "unknown"), in DIR/commit.txt and every record.
# Back on the development machine: `launch/env.sh python -m imagenet_recipes.bench.regenerate
# --archive DIR/tier gpu-tier`, and the gpu_*.json files into results/gpu/ (then
# bench.regenerate).
# Exit status: 0 when every step that ran exited 0, 1 when one did not, 2 on bad arguments or
# when gpu_check.sh --probe finds no GPU (or no torch, no pytest, or cannot install the clone).
# Rehearsed on a CPU with a planted decoder (tests/plants/nvimgcodec: crash, hang, region
# refusal; tests/tools/test_gpu_session_faults.py).
set -uo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."

all_steps=(decode scripts compile tier-decode smi tier peers causes loop)
default_steps=(decode scripts tier-decode compile smi)
out="" budget="" peers="" cpu=0 steps=() archive="" data="" wheels="" commit=""
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
log="" early=""  # session.log once DIR is known; why the session stopped before it was

# The archive: every file of DIR but JPEGs, checkpoints and files over 5 MB (named in
# archive-left-out.txt), written at the end whatever happened before
jpegs_pid=""
write_archive() {
  [ -n "$archive" ] || return 0
  if [ -z "$out" ] || [ ! -d "$out" ]; then  # stopped before DIR was made
    out="$(mktemp -d "${TMPDIR:-/tmp}/gpu-session.XXXXXX")"
  fi
  [ -z "$early" ] || echo "gpu_session: stopped before any step: $early" >> "$out/session.log"
  local inside="" list
  case "$archive" in "$out"/*) inside="./${archive#"$out"/}" ;; esac
  list="$(mktemp)"
  (cd "$out" && find . -type f \( -iname '*.jpg' -o -iname '*.jpeg' -o -name '*.pth' \
      -o -name '*.pt' -o -size +5M \) ! -path "$inside" -printf '%s\t%p\n' | sort -k2 \
      > archive-left-out.txt
   find . -type f ! -iname '*.jpg' ! -iname '*.jpeg' ! -name '*.pth' ! -name '*.pt' \
      ! -size +5M ! -path "$inside" ! -path "$inside.partial" -print0 | sort -z) > "$list"
  mkdir -p "$(dirname "$archive")"
  if tar -czf "$archive.partial" -C "$out" --null -T "$list" && mv "$archive.partial" "$archive"
  then
    echo "gpu_session: archive $archive ($(stat -c %s "$archive") bytes, $(tr -cd '\0' \
      < "$list" | wc -c) files; left out: $(wc -l < "$out/archive-left-out.txt"))"
  else
    echo "gpu_session: the archive $archive could not be written" >&2
  fi
  rm -f "$list"
}
step_pid=""
at_exit() {
  [ -z "$jpegs_pid" ] || kill "$jpegs_pid" 2>/dev/null
  if [ -n "$step_pid" ]; then  # stopped from outside: the step's group ends (timeout passes
    kill -TERM "$step_pid" 2>/dev/null  # the signal on, and kills it 20 s later)
    wait "$step_pid"
  fi
  write_archive
}
# From here on, every exit writes the archive: a bad argument after --archive too
for ((i = 1; i < $#; i++)); do
  [ "${!i}" = --archive ] && { j=$((i + 1)); archive="$(absolute "${!j}")"; }
done
trap at_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
bad_argument() { early="$*"; echo "gpu_session: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$(absolute "${2:?--out needs a folder}")"; shift 2 ;;
    --archive) archive="$(absolute "${2:?--archive needs a path}")"; shift 2 ;;
    --data) data="$(absolute "${2:?--data needs a folder}")"; shift 2 ;;
    --wheels) wheels="$(absolute "${2:?--wheels needs a folder}")"; shift 2 ;;
    --budget) budget="${2:?--budget needs seconds}"; shift 2 ;;
    --peers) peers="$(absolute "${2:?--peers needs a folder}")"; shift 2 ;;
    --steps) IFS=, read -ra steps <<< "${2:?--steps needs a list}"; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --commit) commit="${2:?--commit needs a text}"; shift 2 ;;
    -h|--help) archive=""
               awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
               exit 0 ;;
    *) bad_argument "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$out" ] || [ -n "$archive" ] || bad_argument "--out DIR or --archive PATH is required"
# The default budget: 465 s of steps, the archive after, within 8 minutes on a GPU; 840 s on
# the CPU (2 cores)
[ -n "$budget" ] || { [ $cpu -eq 1 ] && budget=840 || budget=540; }
[[ "$budget" =~ ^[0-9]+$ ]] || bad_argument "--budget takes whole seconds"
for step in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $step "* ]] ||
    bad_argument "unknown step $step; steps: ${all_steps[*]}"
done
[ ${#steps[@]} -gt 0 ] || steps=("${default_steps[@]}")
[ -z "$peers" ] || [ -d "$peers" ] || bad_argument "--peers $peers is not a folder"
[ -z "$wheels" ] || compgen -G "$wheels/*.whl" > /dev/null ||
  bad_argument "--wheels $wheels holds no .whl file"
case "$archive" in ""|*.tar.gz|*.tgz) ;; *)
  archive_given="$archive"; archive=""
  bad_argument "--archive $archive_given: a .tar.gz path" ;; esac
tmp="${TMPDIR:-/tmp}"
[ -n "$out" ] || out="$(mktemp -d "$tmp/gpu-session.XXXXXX")"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
[ -n "$data" ] || data="$tmp/imagenet_recipes-jpegs/$([ $cpu -eq 1 ] && echo cpu || echo gpu)"
case "$data/" in "$out"/*)
  bad_argument "--data $data is inside --out: the JPEG set stays outside the records" ;; esac
python="${PYTHON:-python3}"
log="$out/session.log"

# bench.gpu's sizes: ResNet-50 as bench.gpu defaults on a GPU, its loader rows over 6 log
# intervals (--help: to fit); a check of the composition on the CPU (the tools' own CPU tests
# measure each unit there).
if [ $cpu -eq 1 ]; then
  sizes=(--device cpu -a timm/test_resnet --image-size 32 -b 4 --amp-dtype float16)
  bench=("${sizes[@]}" --steps 2 --warmup 1 --repeats 2 -j 1 --loader-window 6)
  tier=(--cpu)
  tier_decode=(--cpu --first-of-each)
else
  sizes=() bench=(--loader-window 6) tier=() tier_decode=()
fi

peer_file() {  # peer_file PATH: PEERS/PATH when it is there
  [ -n "$peers" ] && [ -f "$peers/$1" ] && echo "$peers/$1"
}
timm_benchmark="$(peer_file benchmark.py)" timm_train="$(peer_file train.py)"
jpegs="$data"

# The GPU decoders as the probe found them: "OK: ...", "MISSING: ...", "BROKEN: ..."
declare -A decoder=()
decoder_ok() { [[ "${decoder[$1]:-}" == OK* ]]; }
skip_broken=()  # bench.gpu's rows that decode with a broken decoder: skipped, saying why
whole=()  # nvImageCodec's rows on whole images where its regions fail (bench.gpu --nvimgcodec-whole)
why_skipped() {  # why_skipped STEP: why the step cannot run here (nothing: it can)
  case "$1" in
    compile) decoder_ok nvimgcodec || decoder_ok nvimgcodec-whole ||
               echo "nvimgcodec ${decoder[nvimgcodec]:-not probed}" ;;
    tier-decode) decoder_ok torchcodec || decoder_ok nvimgcodec ||
                   echo "no GPU decoder works here (torchcodec ${decoder[torchcodec]:-?};" \
                        "nvimgcodec ${decoder[nvimgcodec]:-?})" ;;
    peers) [ -n "$timm_train" ] || echo "no peer script in --peers" ;;
  esac
}

tier_groups() {  # the tier's groups; decode left out where tier-decode ran it in this --out
  finished tier-decode || return 0  # nothing named: gpu_check.sh runs every group
  bash launch/gpu_check.sh --list | grep -vx decode
}

command_of() {  # command_of STEP: the step's command, one word per line
  # each bench.gpu call its own --out: run names (nd-synthetic, ...) recur between groups;
  # nd-synthetic, the reference, measured once (decode) and reused by the later steps
  local gpu=("$python" -m imagenet_recipes.bench.gpu "${bench[@]}" "${commit_flag[@]}"
             --out "$out/bench/$1")
  local reuse=(--reuse "$out/gpu_decode.json" --reuse "$out/gpu_scripts.json")
  case "$1" in
    decode) printf '%s\n' "${gpu[@]}" --group decode --decode-workers default \
              "${skip_broken[@]}" "${whole[@]}" --data "$jpegs" --json "$out/gpu_decode.json" ;;
    scripts) printf '%s\n' "${gpu[@]}" \
               --only pytorch-loader,gpu-decode,gpu-decode-nvimgcodec,dali-gpu "${reuse[@]}" \
               "${skip_broken[@]}" "${whole[@]}" --data "$jpegs" \
               --json "$out/gpu_scripts.json" ;;
    compile) printf '%s\n' "${gpu[@]}" --only gpu-decode-nvimgcodec-compile "${reuse[@]}" \
               "${whole[@]}" --data "$jpegs" --json "$out/gpu_compile.json" ;;
    tier-decode) printf '%s\n' bash launch/gpu_check.sh "${tier_decode[@]}" \
                   --out "$out/tier-decode" decode ;;
    smi) printf '%s\n' "$python" -m imagenet_recipes.bench.gpu.processes "${sizes[@]}" -j 8 \
           --data "$jpegs" --out "$out/bench/smi" --json "$out/gpu_processes.json" ;;
    tier) printf '%s\n' bash launch/gpu_check.sh --first-of-each "${tier[@]}" --out "$out/tier" \
            $(tier_groups) ;;
    loop) printf '%s\n' "${gpu[@]}" --group loop,compile --json "$out/gpu_loop.json" ;;
    causes) printf '%s\n' "${gpu[@]}" --group causes --only ddp-1rank "${reuse[@]}" \
              ${timm_benchmark:+--timm-benchmark "$timm_benchmark"} --json "$out/gpu_causes.json" ;;
    peers) printf '%s\n' "${gpu[@]}" --group peers --timm "$timm_train" --peers-data "$jpegs" \
             --peers-only "nd fast" --peers-repeats 1 --json "$out/gpu_peers.json" ;;
  esac
}

note() { echo "gpu_session: $*" | tee -a "$log"; }
finished() {  # finished STEP: an earlier call with this --out ran STEP to its end
  grep -q "^gpu_session: $1: exit 0 after" "$log" 2>/dev/null
}

deadline=$((SECONDS + budget)) failed=()
note "budget $budget s; steps ${steps[*]}; records in $out; JPEG set in $jpegs"
# The commit measured: git's; for a copy of the tree without .git, --commit or the kit's note
commit_flag=()  # bench.gpu asks git itself where there is one
if [ -n "$commit" ]; then
  commit_flag=(--commit "$commit")
elif commit="$(git rev-parse --short HEAD 2>/dev/null)"; then
  # as bench.gpu's records say it: a tree that differs from its commit was not that commit
  git diff --quiet HEAD 2>/dev/null || commit+=" (plus uncommitted changes)"
else
  commit="$(cat "${wheels:-/nonexistent}/commit" 2>/dev/null)" || commit="unknown"
  commit_flag=(--commit "$commit")
fi
echo "$commit" > "$out/commit.txt"
note "commit $commit"

# The JPEG set, made in the background from the start (beside the probe), within the budget;
# the first step that reads it waits for it.
for step in "${steps[@]}"; do
  if [[ $step =~ ^(scripts|decode|compile|smi|peers)$ ]] && ! finished "$step" &&
     [ -z "$jpegs_pid" ]; then
    timeout "$budget" "$python" -m imagenet_recipes.bench.gpu "${bench[@]}" --prepare-data \
      --data "$jpegs" > "$out/jpegs.log" 2>&1 &
    jpegs_pid=$!
  fi
done
jpegs_failed=0
jpegs_ready() {
  [ -n "$jpegs_pid" ] || return 0
  wait "$jpegs_pid"
  local rc=$?
  jpegs_pid=""
  [ $rc -eq 0 ] && note "JPEG set ready: $(tail -n 1 "$out/jpegs.log")" && return 0
  note "the JPEG set could not be made (exit $rc; $out/jpegs.log)"
  jpegs_failed=1
}

# probe: what the machine has (and this clone's package installed into that Python where it
# is not yet), each GPU decoder decoding a batch of a known JPEG in a process of its own; no
# GPU, no torch or no pytest: nothing to do. -> decoder[], whole, skip_broken and the tier's
# GPU_TIER_BROKEN_DECODERS.
probe() {
  command -v nvidia-smi > /dev/null && timeout 30 nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  if [ -n "$wheels" ]; then  # the decoders' wheels, from files only (a system Python: PEP 668)
    note "installing $(cd "$wheels" && echo *.whl) (pip install --no-index --no-deps)"
    pip_wheels() { timeout 90 "$python" -m pip install --quiet --disable-pip-version-check \
                     --no-index --no-deps "$@" "$wheels"/*.whl; }
    pip_wheels 2>"$out/wheels.log" || pip_wheels --break-system-packages 2>>"$out/wheels.log" ||
      note "the wheels could not be installed ($out/wheels.log); the probe says what is missing"
  fi
  local probe_limit=${GPU_CHECK_PROBE_LIMIT:-45}
  local batch=$([ $cpu -eq 1 ] && echo 4 || echo 256)  # bench.gpu's -b, the decoder's batch
  local start_limit=${GPU_CHECK_START_LIMIT:-120}  # Python's start, torch's import, per decoder
  GPU_CHECK_PROBE_LIMIT=$probe_limit GPU_CHECK_START_LIMIT=$start_limit \
    timeout --kill-after=10 $((3 * (start_limit + probe_limit + 10) + 120)) \
    bash launch/gpu_check.sh --probe --batch-size "$batch" "${tier[@]}" 2>&1 |
    tee "$out/probe.txt" | tee -a "$log"
  local rc=${PIPESTATUS[0]} name state
  [ "$rc" -eq 0 ] || { note "the machine check stopped the session (exit $rc)"; exit 2; }
  while read -r name state; do
    decoder[$name]="$state"
  done < <(sed -n 's/^gpu_check: decoder \([a-z-]*\) *\(.*\)$/\1 \2/p' "$out/probe.txt")
  broken_decoders=""  # the tier's decode checks skip these (GPU_TIER_BROKEN_DECODERS)
  for name in torchcodec nvimgcodec; do
    state="${decoder[$name]:-}"
    [[ "$state" == BROKEN* ]] || continue
    broken_decoders+="$name=${state#BROKEN: }"$'\n'
    if [ "$name" = nvimgcodec ] && decoder_ok nvimgcodec-whole; then
      whole=(--nvimgcodec-whole "regions ${state}")
      note "nvimgcodec: regions ${state}: its rows decode whole images instead" \
           "(--gpu-decoder nvimgcodec-whole), so its hardware decoder is still measured"
    else
      skip_broken+=(--skip-decoder "$name=${state#BROKEN: }")
    fi
  done
  export GPU_TIER_BROKEN_DECODERS="$broken_decoders"
}

# Not where an earlier call with this --out finished every step asked for: the probe (15-20 s
# of a GPU slot) would decide nothing.
pending=0
for step in "${steps[@]}"; do
  finished "$step" || pending=$((pending + 1))
done
if [ $pending -eq 0 ]; then
  note "no probe: an earlier call with this --out ran every step asked for"
else
  probe
fi

for step in "${steps[@]}"; do
  if finished "$step"; then
    note "$step: finished in an earlier call with this --out"; continue
  fi
  why="$(why_skipped "$step")"
  if [ -n "$why" ]; then
    note "$step: skipped ($why)"; continue
  fi
  mapfile -t cmd < <(command_of "$step")
  if [[ $step =~ ^(scripts|decode|compile|smi|peers)$ ]]; then
    jpegs_ready
    [ $jpegs_failed -eq 0 ] || { note "$step: not run, no JPEG set"; failed+=("$step"); continue; }
  fi
  left=$((deadline - SECONDS))
  if [ $left -le 10 ]; then
    note "$step: not run, the budget is spent"; continue
  fi
  [ "$step" != tier ] || ! finished tier-decode ||
    note "tier: the decode group left out: tier-decode checked it in this --out"
  note "$step: ${cmd[*]} (at most $left s)"
  start=$SECONDS
  # The tier's groups stop themselves at their own limit, kept within what is left; timeout
  # signals the step's whole process group (pytest, bench.gpu and what they started).
  group_limit=${GPU_CHECK_GROUP_LIMIT:-420}
  [ "$left" -ge "$group_limit" ] || group_limit=$left
  # In the background and waited for, so that a TERM or INT to the session is handled at once:
  # the step stopped, the archive written.
  GPU_CHECK_GROUP_LIMIT=$group_limit timeout --kill-after=20 "$left" "${cmd[@]}" &
  step_pid=$!
  wait "$step_pid"
  rc=$?
  step_pid=""
  cut=$([ $rc -eq 124 ] && echo ", cut at the budget")
  note "$step: exit $rc after $((SECONDS - start)) s$cut"
  [ $rc -eq 0 ] || failed+=("$step")
done
# The run's targets, met or not, from the records it wrote
timeout 60 "$python" -m imagenet_recipes.bench.gpu.targets "$out" 2>&1 | tee -a "$log"
if [ ${#failed[@]} -gt 0 ]; then
  note "steps that did not exit 0: ${failed[*]}"
  exit 1
fi
note "done in $SECONDS s"
