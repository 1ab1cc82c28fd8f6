#!/usr/bin/env bash
# The whole test suite, on CPU, as CI runs it:
#
#   bash launch/test.sh            # everything
#   bash launch/test.sh -k resume  # extra arguments go to pytest
#
# It runs in phases and prints the time of each as it ends, and all of them at the end:
#   environment   the Python environment of requirements.txt (launch/env.sh: built on first use,
#                 then cached by the file's hash)
#   horovod       Horovod, built for the installed torch as a machine without a registry builds
#                 it: its files fetched first (launch/horovod_files.sh), then
#                 launch/install_horovod.sh --find-links with pip kept off the registry (6-10
#                 minutes once, a cached wheel afterwards)
#   slurm         when run as root without SLURM: slurm-wlm + munge from Debian, for
#                 tests/test_slurm.py (it starts its own local cluster); without root those tests
#                 skip and say why
#   smoke-oldest  run with no arguments (as CI does): tests/smoke_oldest.sh, a few minutes of
#                 unit tests and short training runs on the oldest supported torch/torchvision,
#                 in that stack's own virtualenv (requirements-oldest.txt). RECIPES_SMOKE_OLDEST=0
#                 skips it
#   suite         pytest over the whole suite
# The phases that install come first: if one fails, the script stops there with a message that
# names the phase and its log, before the budget goes to tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every pip of every phase: a registry that does not answer fails within minutes (seconds per
# request, retries), where the caller set none. Once the environments and Horovod's files and
# wheel are cached, no phase asks a registry anything (tests/test_env_sh.py runs them offline).
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" PIP_RETRIES="${PIP_RETRIES:-5}"

phases=()   # "name seconds" of each phase that ended
start_all=$SECONDS

summary() {
  local line
  echo "launch/test.sh: phase times (s):"
  for line in "${phases[@]}"; do
    printf 'launch/test.sh:   %-13s %6s\n' ${line}
  done
  printf 'launch/test.sh:   %-13s %6s\n' total $((SECONDS - start_all))
}

# phase NAME WHAT-FAILED-MEANS COMMAND...: run COMMAND, record its time; on failure print why
# and stop with its exit status.
phase() {
  local name=$1 advice=$2 began=$SECONDS status=0
  shift 2
  echo "launch/test.sh: == $name =="
  "$@" || status=$?
  phases+=("$name $((SECONDS - began))")
  echo "launch/test.sh: == $name: $((SECONDS - began)) s"
  if [ "$status" != 0 ]; then
    echo "launch/test.sh: FAILED in phase '$name' (exit $status): $advice" >&2
    summary >&2
    exit "$status"
  fi
}

install_slurm() {
  if command -v sbatch >/dev/null; then
    echo "SLURM is installed ($(command -v sbatch))"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge
  else
    echo "launch/test.sh: SLURM is not installed and this is not root: tests/test_slurm.py will skip" >&2
  fi
}

phase environment "the Python environment could not be built from requirements.txt (pip's \
output above); nothing was tested" launch/env.sh python -c "import torch, torchvision; \
print(f'torch {torch.__version__}, torchvision {torchvision.__version__}')"
horovod_offline() {
  local files="${XDG_CACHE_HOME:-$HOME/.cache}/imagenet-recipes/horovod-files"
  bash launch/horovod_files.sh "$files" >/dev/null
  launch/env.sh bash launch/install_horovod.sh --find-links "$files"
}
phase horovod "the Horovod build failed (launch/install_horovod.sh; its build log is named \
above); nothing was tested" horovod_offline
phase slurm "slurm-wlm and munge could not be installed from Debian; nothing was tested" \
  install_slurm
if [ $# = 0 ] && [ "${RECIPES_SMOKE_OLDEST:-1}" != 0 ]; then
  phase smoke-oldest "the oldest supported stack (requirements-oldest.txt) failed its smoke \
test (above); the suite did not run" bash tests/smoke_oldest.sh
fi
# Two workers (pytest-xdist): most tests start process groups that wait on each other, on
# sockets and on timers more than they compute, so a second worker fills the idle CPU.
# loadgroup keeps the SLURM tests (one shared local cluster) on one worker.
status=0
began=$SECONDS
echo "launch/test.sh: == suite =="
# --strict-skips: a skip that tests/strict_skips.py does not declare (a component that did not
# install, a test that stopped running) fails the run, as does a requirement that does not import
launch/env.sh python -m pytest -q --durations=30 -n 2 --dist loadgroup --strict-skips "$@" \
  || status=$?
phases+=("suite $((SECONDS - began))")
summary
exit "$status"
