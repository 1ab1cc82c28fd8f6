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
set -euo pipefail
cd "$(dirname "$0")/.."
launch/env.sh bash launch/install_horovod.sh
if ! command -v sbatch >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge
  else
    echo "launch/test.sh: SLURM is not installed and this is not root: tests/test_slurm.py will skip" >&2
  fi
fi
exec launch/env.sh python -m pytest -q "$@"
