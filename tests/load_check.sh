#!/usr/bin/env bash
# The tests that start processes (the suite's slow tier; the lab's studies stay out, as in the
# suite) with busy loops beside them, as on a loaded 2-core CI machine, each failure reported at
# the end: a test that passes alone and fails here depends on how fast the machine is.
#
#   bash tests/load_check.sh              # the slow tier, 2 pytest workers, 2 busy loops
#   bash tests/load_check.sh -k resume    # extra arguments go to pytest
#
# LOAD_CHECK_LOOPS=N: busy loops (default 2, one per core of a 2-core machine). The loops stop
# with the script, however it ends. Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."

loops=()
stop_loops() {
  local pid
  for pid in "${loops[@]}"; do
    kill "$pid" 2>/dev/null
  done
}
trap stop_loops EXIT
for ((i = 0; i < ${LOAD_CHECK_LOOPS:-2}; i++)); do
  sh -c 'while :; do :; done' &
  loops+=($!)
done
echo "load_check: ${#loops[@]} busy loops beside the slow tier (pids ${loops[*]})"
launch/env.sh python -m pytest -q -m "slow and not study" -n 2 --dist loadgroup -rfE -p no:cacheprovider \
  --durations=20 "$@"
