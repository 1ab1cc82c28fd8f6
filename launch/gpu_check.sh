#!/usr/bin/env bash
# The GPU tier (tests/gpu/) in groups, on a machine with a CUDA GPU, with the Python found there:
# nothing is downloaded, so it works on a machine without internet.
#
#   bash launch/gpu_check.sh --probe                  # what this machine has, what will be skipped
#   bash launch/gpu_check.sh --out DIR entries precision   # some groups; the record into DIR
#   bash launch/gpu_check.sh --out DIR                # every group, one after the other
#   bash launch/gpu_check.sh --cpu --out DIR          # the same checks simulated on the CPU
#
# Groups: entries precision ranks resume layout recipes dali decode nccl (one file each,
# tests/gpu/test_gpu_GROUP.py). Each group is sized for under 6 minutes on one H100 and is stopped
# after GPU_CHECK_GROUP_LIMIT seconds (default 420); a stopped group records the check it was in
# as "stopped" and kills every process it started.
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
out="" device=cuda probe=0 groups=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --cpu) device=cpu; shift ;;
    --probe) probe=1; shift ;;
    --list) printf '%s\n' "${all_groups[@]}"; exit 0 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [[ " ${all_groups[*]} " != *" $1 "* ]]; then
         echo "gpu_check: unknown group $1; groups: ${all_groups[*]}" >&2; exit 2
       fi
       groups+=("$1"); shift ;;
  esac
done
[ ${#groups[@]} -gt 0 ] || groups=("${all_groups[@]}")

# The Python that has torch: $PYTHON, else python3 on PATH (launch/env.sh's environment when run
# through it). Nothing is downloaded: where this clone's package is not installed in that
# Python's environment yet, it is installed from the clone (editable, no dependencies), which
# needs setuptools there, as pip's own.
python="${PYTHON:-python3}"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "gpu_check: $python cannot import torch; set PYTHON=/path/to/python (torch >= 2.11 with" \
       "CUDA, torchvision, tensorboard, pytest)" >&2
  exit 2
fi
installed="$("$python" -c 'import imagenet_recipes, os
print(os.path.dirname(os.path.dirname(imagenet_recipes.__file__)))' 2>/dev/null)"
if [ "$installed" != "$PWD" ]; then
  echo "gpu_check: installing $PWD into $python's environment (pip install -e, no dependencies)"
  if ! "$python" -m pip install --quiet --no-deps --no-build-isolation -e . >&2; then
    echo "gpu_check: could not install the package; run, with that python: pip install" \
         "--no-deps --no-build-isolation -e .  (pip may want --break-system-packages for a" \
         "system Python)" >&2
    exit 2
  fi
fi

"$python" - "$device" <<'EOF'
import importlib.util, sys
import torch
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
if importlib.util.find_spec("pytest") is None:
    sys.exit(2)
EOF
status=$?
[ $status -eq 0 ] || exit $status
[ $probe -eq 0 ] || exit 0

if [ -n "$out" ]; then
  mkdir -p "$out" && out="$(cd "$out" && pwd)"
  export GPU_TIER_OUT="$out"
fi
export GPU_TIER_DEVICE="$device"
limit="${GPU_CHECK_GROUP_LIMIT:-420}"
failed=()
for group in "${groups[@]}"; do
  echo "gpu_check: group $group (at most $limit s)"
  start=$SECONDS
  # timeout sends SIGTERM to pytest, which records the check in flight and kills its runs;
  # SIGKILL follows 20 s later if it has not ended by then.
  timeout --kill-after=20 "$limit" "$python" -m pytest -q -p no:cacheprovider -rs \
    "tests/gpu/test_gpu_$group.py"
  rc=$?
  echo "gpu_check: group $group: exit $rc after $((SECONDS - start)) s"
  # pytest: 0 passed, 5 nothing collected; anything else (a failure, a timeout's 124) fails
  [ $rc -eq 0 ] || [ $rc -eq 5 ] || failed+=("$group")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: FAILED groups: ${failed[*]}${out:+ (see $out/checks.jsonl)}"
  exit 1
fi
echo "gpu_check: every group passed or skipped${out:+; record in $out}"
