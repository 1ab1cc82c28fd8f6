#!/usr/bin/env bash
# The GPU tier (tests/gpu/) in groups, on a machine with a CUDA GPU, with the Python found there:
# nothing is downloaded, so it works on a machine without internet.
#
#   bash launch/gpu_check.sh --probe                  # what this machine has, what will be skipped,
#                                                     # each GPU decoder decoding a known JPEG
#   bash launch/gpu_check.sh --out DIR entries precision   # some groups; the record into DIR
#   bash launch/gpu_check.sh --out DIR                # every group, 3 side by side
#   bash launch/gpu_check.sh --jobs 1 --out DIR       # every group, one after the other
#   bash launch/gpu_check.sh --cpu --out DIR          # the same checks simulated on the CPU
#   bash launch/gpu_check.sh --first-of-each ...     # one parameter set of each check only
#
# Groups: entries precision ranks resume layout recipes dali decode nccl (one file each,
# tests/gpu/test_gpu_GROUP.py). Each group is sized for under 6 minutes on one H100 and is stopped
# after GPU_CHECK_GROUP_LIMIT seconds (default 420); a stopped group records the check it was in
# as "stopped" and kills every process it started. --jobs N (GPU_CHECK_JOBS) runs N groups side
# by side, each group's output printed when it ends (default: 3 on a GPU, 1 with --cpu).
# --probe also has each GPU decoder decode a batch of a known JPEG on the device the checks
# measure on (cuda:0; the CPU with --cpu), as a run would (--batch-size N, default 256, the
# hardware decoder's batch path), each in a process of its own under a time limit on loading,
# building and decoding (GPU_CHECK_PROBE_LIMIT seconds, default 60; Python's start and torch's
# import, a minute on a busy machine, get GPU_CHECK_START_LIMIT more, default 120): torchcodec,
# nvimgcodec (each sample's region) and nvimgcodec-whole (whole images: nvImageCodec's way round
# where its regions fail). A line for
# each: "decoder NAME OK: where the pixels ended up", "MISSING: the module is not installed" or
# "BROKEN: the cause" (a refusal's message, "crashed: killed by SIGSEGV (exit 139)", "hung: no
# answer within 60 s"; imagenet_recipes.data.decoder_check). A decoder that does not work leaves
# the exit status as it is (gpu_session.sh skips what needs it).
# With --cpu, each group's pytest and the checks' runs are forked from one interpreter that has
# imported torch (a check that acts on torchrun's own processes still starts torchrun): the
# whole tier at --first-of-each took 129 CPU-s against 274 on 2 cores. GPU_CHECK_FORKED=0
# starts each as its own interpreter, as on a GPU.
# --first-of-each runs only the first parameter set of a parametrized check (the first opt level,
# the first entry script, ...): every check's code once (the CPU simulation of all groups took
# 112 s against 176; not yet timed on a GPU). The CPU suite simulates the tier that way, since it
# tests each parameter's feature on its own.
#
# DIR receives checks.jsonl (a line describing the machine, then one line per finished check,
# written as each finishes), output.log (the runs' output) and runs.jsonl (their log records); no
# checkpoints. `launch/env.sh python -m imagenet_recipes.bench.regenerate --archive DIR gpu-tier`,
# back on the development machine, keeps checks.jsonl in results/gpu-tier/ and writes RESULTS.md's
# block. Exit status: 0 when no check failed, 1 when one did, 2 on bad arguments or when no CUDA
# GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/.."

all_groups=(entries precision ranks resume layout recipes dali decode nccl)
out="" device=cuda probe=0 jobs="${GPU_CHECK_JOBS:-}" first_of_each=0 groups=() batch=256
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --cpu) device=cpu; shift ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    --jobs=*) jobs="${1#--jobs=}"; shift ;;
    --probe) probe=1; shift ;;
    --batch-size) batch="${2:?--batch-size needs a number}"; shift 2 ;;
    --first-of-each) first_of_each=1; shift ;;
    --list) printf '%s\n' "${all_groups[@]}"; exit 0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
               exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [[ " ${all_groups[*]} " != *" $1 "* ]]; then
         echo "gpu_check: unknown group $1; groups: ${all_groups[*]}" >&2; exit 2
       fi
       groups+=("$1"); shift ;;
  esac
done
[ ${#groups[@]} -gt 0 ] || groups=("${all_groups[@]}")
[[ "$batch" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: --batch-size takes a positive number" >&2
                                     exit 2; }

# The Python that has torch: $PYTHON, else python3 on PATH (launch/env.sh's environment when run
# through it). Nothing is downloaded: where that Python does not import this clone's package
# from outside the clone, the clone is installed into its environment (launch/install_clone.sh).
python="${PYTHON:-python3}"

# One Python start for the whole look at the machine (each start costs seconds: it imports
# torch): torch, the GPUs and the optional modules. Exit 2: no torch, no pytest or no GPU.
"$python" - "$device" <<'EOF'
import importlib.util, sys
try:
    import torch
except ImportError:
    print(f"gpu_check: {sys.executable} cannot import torch; set PYTHON=/path/to/python "
          "(torch >= 2.11 with CUDA, torchvision, tensorboard, pytest)", file=sys.stderr)
    sys.exit(2)
device = sys.argv[1]
print(f"gpu_check: python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}"
      f" (CUDA {torch.version.cuda})")
if torch.cuda.is_available():
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    print(f"gpu_check: {torch.cuda.device_count()} GPU(s): {names}")
for module, what in (("nvidia.dali", "DALI: the dali group's checks"),
                     ("torchcodec", "TorchCodec: the decode group's checks"),
                     ("horovod", "Horovod: the hvd entry check"),
                     ("pytest", "pytest: every check")):
    found = importlib.util.find_spec(module.split(".")[0]) is not None and \
        importlib.util.find_spec(module) is not None
    print(f"gpu_check: {module:12} {'found' if found else 'MISSING, skipped: ' + what}")
if device == "cuda" and not torch.cuda.is_available():
    print("gpu_check: no CUDA GPU is visible (torch.cuda.is_available() is False): nothing to "
          "check here; --cpu simulates the tier on the CPU", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if importlib.util.find_spec("pytest") else 2)
EOF
[ $? -eq 0 ] || exit 2
# The entry scripts the checks start import the package as installed, not from this folder
bash launch/install_clone.sh "$python" || exit 2

# probe_decoder NAME: a line with its verdict, from a process of its own under a time limit: a
# crash or a hang is named from the exit status and never stops the probe of the others.
# The decode's limit is the process's own (decoder_check --limit: SIGALRM, exit 142), counted
# once torch has loaded; `timeout` only ends a process that never got that far.
probe_decoder() {
  local name=$1 limit="${GPU_CHECK_PROBE_LIMIT:-60}" said rc began=$SECONDS verdict signal
  local whole=$((${GPU_CHECK_START_LIMIT:-120} + limit))
  said="$(timeout --kill-after=5 "$whole" "$python" -m imagenet_recipes.data.decoder_check \
          "$name" --device "$device" --batch-size "$batch" --limit "$limit" 2>&1)"
  rc=$?
  verdict="$(printf '%s\n' "$said" | grep -E '^(OK|BROKEN|MISSING): ' | tail -n 1)"
  if [ $rc -eq 142 ]; then
    verdict="BROKEN: hung: no answer within $limit s decoding a batch of $batch (killed)"
  elif [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $((SECONDS - began)) -ge "$whole" ]; }; then
    verdict="BROKEN: hung: no answer within $whole s of its start (killed)"
  elif [ $rc -gt 128 ]; then
    signal="$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
    verdict="BROKEN: crashed: killed by SIG$signal (exit $rc) decoding a batch of $batch"
  elif [ -z "$verdict" ]; then
    verdict="BROKEN: exit $rc without a verdict: $(printf '%s\n' "$said" | tail -n 1 | cut -c1-200)"
  fi
  printf 'gpu_check: decoder %-16s %s\n' "$name" "$verdict"
  if [ $rc -gt 128 ] || [ $rc -eq 124 ] && [ -n "$said" ]; then  # its last words
    printf '%s\n' "$said" | tail -n 3 | sed 's/^/gpu_check:     | /'
  fi
}
if [ $probe -eq 1 ]; then
  for name in torchcodec nvimgcodec nvimgcodec-whole; do
    probe_decoder "$name"
  done
  exit 0
fi

if [ -n "$out" ]; then
  mkdir -p "$out" && out="$(cd "$out" && pwd)"
  export GPU_TIER_OUT="$out"
fi
export GPU_TIER_DEVICE="$device"
[ $first_of_each -eq 0 ] || export GPU_TIER_FIRST_OF_EACH=1
limit="${GPU_CHECK_GROUP_LIMIT:-420}"
# Side by side: the groups are small and independent (each run is a few ranks on the one GPU),
# and GPU time often comes in short slots. On the CPU, one after the other.
[ -n "$jobs" ] || { [ "$device" = cuda ] && jobs=3 || jobs=1; }
failed=()
logs="$(mktemp -d)"
forked="" forked_dir=""  # the simulation's fork server: the fd of its stdin, its folder
trap 'stop_fork_server; rm -rf "$logs"' EXIT

# start_fork_server: with --cpu, the checks' runs are forked from one interpreter that has
# imported torch and the package (tests/gpu/gpu_tier.py says how; a new interpreter per rank
# costs 6-7 CPU-seconds of imports, its tiny run a fraction of one). The server reads nothing
# but its stdin, a pipe that only this script holds: it ends when this script does, however
# that ends. A server that does not start leaves every run a new interpreter, saying so.
start_fork_server() {
  local deadline=$((SECONDS + ${GPU_CHECK_START_LIMIT:-120})) server
  forked_dir="$(mktemp -d /tmp/gpu-check-XXXXXX)"  # a socket's path holds 107 bytes at most
  exec {forked}> >(exec "$python" tests/gpu/gpu_tier.py serve "$forked_dir/socket" \
                     > "$forked_dir/server.log" 2>&1)
  server=$!
  until grep -qx ready "$forked_dir/server.log" 2>/dev/null; do
    if ! kill -0 "$server" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      echo "gpu_check: the fork server did not start, each run starts its own interpreter:" \
           "$(tail -n 1 "$forked_dir/server.log" 2>/dev/null | cut -c1-200)"
      stop_fork_server
      return
    fi
    sleep 0.2
  done
  export FORKED_RANKS_SOCKET="$forked_dir/socket"
  echo "gpu_check: runs forked from one interpreter (tests/forked_ranks.py);" \
       "GPU_CHECK_FORKED=0 starts each as its own"
}

stop_fork_server() {
  if [ -n "$forked" ]; then exec {forked}>&-; fi
  [ -z "$forked_dir" ] || rm -rf "$forked_dir"
  forked="" forked_dir=""
  unset FORKED_RANKS_SOCKET
}

# run_group GROUP: its checks under the time limit; timeout sends SIGTERM to pytest, which
# records the check in flight and kills its runs; SIGKILL follows 20 s later if it has not
# ended by then. With the fork server, pytest is forked from it too (its client passes the
# signals on); the server's pipe is closed in there: only this script holds it.
run_group() {
  local python_of_group=("$python") quiet=()
  if [ -n "$forked" ]; then
    python_of_group=("$python" tests/forked_ranks.py run --)
    # the server imported anyio before pytest could mark its plugin for assertion rewriting
    quiet=(-W "ignore::pytest.PytestAssertRewriteWarning")
  fi
  (
    if [ -n "$forked" ]; then exec {forked}>&-; fi
    timeout --kill-after=20 "$limit" "${python_of_group[@]}" -m pytest -q -p no:cacheprovider \
      -rs "${quiet[@]}" "tests/gpu/test_gpu_$1.py"
  )
}

if [ "$device" = cpu ] && [ "${GPU_CHECK_FORKED:-1}" = 1 ]; then
  start_fork_server
fi

# finish GROUP RC SECONDS: report a group's end; pytest: 0 passed, 5 nothing collected;
# anything else (a failure, a timeout's 124) fails.
finish() {
  echo "gpu_check: group $1: exit $2 after $3 s"
  [ "$2" -eq 0 ] || [ "$2" -eq 5 ] || failed+=("$1")
}

if [ "$jobs" -le 1 ]; then
  for group in "${groups[@]}"; do
    echo "gpu_check: group $group (at most $limit s)"
    start=$SECONDS
    run_group "$group"
    finish "$group" $? $((SECONDS - start))
  done
else
  echo "gpu_check: groups ${groups[*]}, $jobs side by side (each at most $limit s)"
  declare -A started=()
  pending=("${groups[@]}")
  while [ ${#pending[@]} -gt 0 ] || [ ${#started[@]} -gt 0 ]; do
    while [ ${#pending[@]} -gt 0 ] && [ ${#started[@]} -lt "$jobs" ]; do
      group="${pending[0]}"; pending=("${pending[@]:1}")
      ( run_group "$group" > "$logs/$group.log" 2>&1; echo $? > "$logs/$group.rc" ) &
      started[$group]=$SECONDS
    done
    wait -n
    for group in "${!started[@]}"; do
      [ -f "$logs/$group.rc" ] || continue
      echo "gpu_check: ----- group $group"
      cat "$logs/$group.log"
      finish "$group" "$(cat "$logs/$group.rc")" $((SECONDS - started[$group]))
      unset "started[$group]"
    done
  done
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: FAILED groups: ${failed[*]}${out:+ (see $out/checks.jsonl)}"
  exit 1
fi
echo "gpu_check: every group passed or skipped${out:+; record in $out}"
