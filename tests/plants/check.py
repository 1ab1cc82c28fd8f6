"""Each planted defect against the test that must catch it: the test is run with the defect
planted (its folder here on PYTHONPATH, its name in the folder's variable) and must fail on an
assertion, not on the plant itself. A reviewer's check that those tests still see what they
claim to; not part of the suite (each plant costs a test's runs: about 12 minutes in all on 2
cores).

    launch/env.sh python tests/plants/check.py            # every plant
    launch/env.sh python tests/plants/check.py shards-in-blocks ddp-never-reduces

Prints one line per plant: caught (with the test's first failed assertion) or MISSED.
Exit status: 0 when every plant run was caught, 1 otherwise.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the clone: pytest runs there

ACCUMULATION = "tests/test_accumulation.py::test_{}_accumulates_as_nd"
# (folder in tests/plants, its variable, the defect, the test that must fail)
PLANTS = [
    ("compile", "RECIPES_PLANT_COMPILE", "eager-training",
     "tests/test_compile.py::test_compiled_run_trains_and_resumes_as_the_eager_one"),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "ddp-reduces-every-micro-batch",
     ACCUMULATION.format("ddp")),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "ddp-never-reduces",
     ACCUMULATION.format("ddp")),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "fsdp-reduces-every-micro-batch",
     ACCUMULATION.format("fsdp")),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "horovod-one-pass-per-step",
     ACCUMULATION.format("horovod")),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "shards-in-blocks",
     ACCUMULATION.format("ddp")),
    ("accumulation", "RECIPES_PLANT_ACCUMULATION", "resume-forgets-accumulation",
     "tests/test_fault_tolerance.py::"
     "test_preemption_signal_checkpoints_mid_epoch_and_resume_is_exact[pytorch-2]"),
]


def caught(folder: str, variable: str, defect: str, test: str) -> tuple:
    """(whether `test` failed on an assertion with the defect planted, what it said)."""
    env = {**os.environ, "PYTHONPATH": str(HERE / folder), variable: defect}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-x", test], cwd=ROOT, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    if "Error in sitecustomize" in output:
        return False, "the plant itself failed: " + output[-1500:]
    if proc.returncode == 0 or not re.search(r"^\d+ failed", output.splitlines()[-1]):
        return False, output.splitlines()[-1] if output else f"exit {proc.returncode}"
    said = next((line for line in output.splitlines() if line.startswith("E ")), "")
    return True, said.strip()


def main(names) -> int:
    chosen = [p for p in PLANTS if not names or p[2] in names]
    unknown = set(names) - {p[2] for p in PLANTS}
    if unknown:
        print(f"unknown plants: {', '.join(sorted(unknown))}; known: "
              f"{', '.join(p[2] for p in PLANTS)}", file=sys.stderr)
        return 2
    missed = 0
    for folder, variable, defect, test in chosen:
        ok, said = caught(folder, variable, defect, test)
        missed += not ok
        print(f"{'caught' if ok else 'MISSED':6}  {defect:32} {test.split('::')[-1]}: {said}",
              flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
