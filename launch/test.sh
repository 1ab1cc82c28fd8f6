#!/usr/bin/env bash
# The whole test suite, on CPU, as CI runs it:
#
#   bash launch/test.sh            # everything
#   bash launch/test.sh -k resume  # extra arguments go to pytest
#
# It first installs what the tests need beyond requirements.txt: Horovod, built for the installed
# torch (launch/install_horovod.sh; a cached wheel after the first build), and when run as root
# without SLURM, slurm-wlm + munge from Debian for tests/test_slurm.py (it starts its own local
# cluster). Without root the SLURM tests skip and say why.
#
# Run with no arguments (as CI does), it first runs launch/smoke_oldest.sh: a few minutes of unit
# tests and short training runs on the oldest supported torch/torchvision, in that stack's own
# virtualenv (requirements-oldest.txt). It runs before the suite so that pytest's summary stays
# the last line; its failure fails this script. RECIPES_SMOKE_OLDEST=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# = 0 ] && [ "${RECIPES_SMOKE_OLDEST:-1}" != 0 ]; then
  bash launch/smoke_oldest.sh
fi
launch/env.sh bash launch/install_horovod.sh
if ! command -v sbatch >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge
  else
    echo "launch/test.sh: SLURM is not installed and this is not root: tests/test_slurm.py will skip" >&2
  fi
fi
# Two workers (pytest-xdist): most tests start process groups that wait on each other, on
# sockets and on timers more than they compute, so a second worker fills the idle CPU.
# loadgroup keeps the SLURM tests (one shared local cluster) on one worker.
exec launch/env.sh python -m pytest -q --durations=30 -n 2 --dist loadgroup "$@"
