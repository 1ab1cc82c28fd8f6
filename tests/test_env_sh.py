"""launch/env.sh, as a SLURM job's nodes start it: at once, on a fresh clone with no environment
built yet. One process builds the environment; the others wait for it and use the same one."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO

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
