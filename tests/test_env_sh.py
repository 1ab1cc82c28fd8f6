"""launch/env.sh, as a SLURM job's nodes start it: at once, on a fresh clone with no environment
built yet. One process builds the environment; the others wait for it and use the same one."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from conftest import REPO, TINY

pytestmark = pytest.mark.slow  # every test here starts real processes


def test_processes_started_at_once_build_one_environment(tmp_path):
    # A requirements file of its own (nothing to install beyond pip itself), so the test builds
    # a real virtualenv in seconds and never touches the project's.
    requirements = tmp_path / "requirements-empty.txt"
    requirements.write_text("# nothing beyond pip\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "RECIPES_REQUIREMENTS": str(requirements)}
    env.pop("RECIPES_VENV", None)
    show_prefix = ["python", "-c", "import sys; print(sys.prefix)"]
    procs = [subprocess.Popen(["bash", "launch/env.sh", *show_prefix], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, results
    prefixes = {out.strip() for out, _ in results}
    assert len(prefixes) == 1 and str(tmp_path / "cache") in prefixes.pop()
    creating = sum(err.count("launch/env.sh: creating") for _, err in results)
    assert creating == 1, [err for _, err in results]


def test_the_command_a_run_prints_runs_as_printed_in_a_plain_shell(tmp_path):
    """Started through launch/env.sh, a run's "evaluate it:" command starts with launch/env.sh,
    and typed into a shell whose PATH has no python of the environment (nor perhaps any
    `python` or `torchrun`), it runs: the project's environment, the package in it."""
    common = ["--dummy", "--synthetic-train-size", "16", "--synthetic-val-size", "8",
              "--synthetic-classes", "2", "-b", "8", "--epochs", "1", "--logdir", tmp_path]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RECIPES_ENV_SH", None)
    trained = subprocess.run(["launch/env.sh", "python", "train/nd.py", *TINY, *map(str, common),
                              "--run-name", "trained"], capture_output=True, text=True,
                             cwd=REPO, env=env, timeout=300)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    printed = next(line for line in trained.stdout.splitlines() if "=> evaluate it: " in line)
    command = printed.split("=> evaluate it: ", 1)[1]
    assert command.startswith("launch/env.sh python train/nd.py -e --resume "), command
    plain_shell = {**env, "PATH": "/usr/bin:/bin"}
    evaluated = subprocess.run(["bash", "-c", command + " " + shlex.join(
        ["--logdir", str(tmp_path), "--run-name", "evaluated"])], capture_output=True, text=True,
        cwd=REPO, env=plain_shell, timeout=300)
    assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    assert "=> evaluating" in evaluated.stdout or "Val epoch" in evaluated.stdout, \
        evaluated.stdout[-2000:]
