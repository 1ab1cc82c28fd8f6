"""launch/env.sh, as a SLURM job's nodes start it: at once, on a fresh clone with no environment
built yet. One process builds the environment; the others wait for it and use the same one."""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

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


def _offline(*command: str, env: dict = None, inherit: bool = True
             ) -> subprocess.CompletedProcess:
    """`command` in a network namespace of its own (no interface but loopback), with pip pointed
    at nothing: no configuration file (a machine's may name local wheel folders or mirrors), no
    extra index or links, its index a closed port. `env`: added to this process's environment,
    or (inherit=False) the whole of it."""
    merged = {**(os.environ if inherit else {}), **(env or {})}
    offline = {k: v for k, v in merged.items()
               if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL")}
    offline.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL="http://127.0.0.1:9/simple")
    return subprocess.run(["unshare", "-rn", "bash", "-c",
                           "ip link set lo up 2>/dev/null; exec \"$@\"", "offline", *command],
                          capture_output=True, text=True, cwd=REPO, timeout=1200, env=offline)


def test_the_test_command_runs_offline_once_its_environments_are_cached():
    """The README's test command, with the environments and Horovod's files and wheel cached
    (as launch/test.sh's own phases leave them), asks no registry anything: its install phases
    and real tests (the unit tests, a two-process torchrun run) pass with the network gone. (The environment of the oldest stack,
    smoke_oldest.sh's, likewise.) Where the caches are not there yet (a machine that never ran
    launch/test.sh), it skips and says so; launch/test.sh --strict-skips makes that a failure."""
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare -rn)")
    if subprocess.run(["launch/env.sh", "python", "-c", "import horovod.torch"], cwd=REPO,
                      capture_output=True).returncode != 0:
        pytest.skip("Horovod is not installed in the environment yet: run bash launch/test.sh "
                    "once (its horovod phase builds and caches it)")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "imagenet-recipes"
    oldest = hashlib.sha256((REPO / "requirements-oldest.txt").read_bytes()).hexdigest()[:16]
    if not (cache / f"venv-{oldest}" / ".complete").exists():
        pytest.skip("the oldest stack's environment is not built yet: launch/test.sh's "
                    "smoke-oldest phase builds it before the suite")
    if shutil.which("sbatch") is None and os.geteuid() == 0:
        pytest.skip("SLURM is not installed yet: launch/test.sh's slurm phase installs it (from "
                    "Debian, with the network) before the suite")
    # the network really is gone in there: the registry's host is not reached (the same
    # connection, made out here, is: without it this check could not fail)
    reach = ["python3", "-c", "import socket; socket.create_connection(('pypi.org', 443), 10)"]
    if subprocess.run(reach, capture_output=True, timeout=60).returncode != 0:
        pytest.skip("pypi.org cannot be reached from this machine: the network namespace's "
                    "isolation cannot be told from the machine's own")
    # with this clone in it, as smoke-oldest leaves it: the environments are shared by the
    # machine's clones, and another clone's last command may have installed that clone there
    # (offline, pip cannot make the editable install there: the setuptools that venv gave it,
    # 65.5 on Python 3.11, has no bdist_wheel without the wheel package)
    oldest_env = {**os.environ, "RECIPES_REQUIREMENTS": "requirements-oldest.txt"}
    own = subprocess.run(["bash", "launch/env.sh", "true"], cwd=REPO, env=oldest_env,
                         capture_output=True, text=True, timeout=600)
    assert own.returncode == 0, own.stderr[-3000:]
    cut = _offline(*reach)
    assert cut.returncode != 0 and "error" in cut.stderr.lower(), cut.stderr[-1000:]
    # real tests, the phases before them included: the unit tests and a two-process run
    # (torchrun, gloo over loopback); the unit tests' loader-worker starts (2-3 minutes on a busy
    # machine, and no different offline: the main suite runs them) left out
    suite = _offline("bash", "launch/test.sh", "-p", "no:cacheprovider", "tests/test_units.py",
                     "tests/test_training.py::test_ddp_apex_on_two_cpu_processes_runs_bf16_and_"
                     "logs_jsonl_and_tensorboard", "-k", "not loader_workers")
    out = suite.stdout + suite.stderr
    assert suite.returncode == 0, out[-4000:]
    for phase in ("environment", "horovod", "slurm", "suite"):
        assert f"launch/test.sh: == {phase}:" in out or f"== {phase} ==" in out, out[-4000:]
    ran = re.search(r"(\d+) passed", out)
    assert ran and int(ran[1]) > 20 and " failed" not in out, out[-4000:]
    oldest = _offline("bash", "launch/env.sh", "python", "-c", "import torch",
                      env={"RECIPES_REQUIREMENTS": "requirements-oldest.txt"})
    assert oldest.returncode == 0, (oldest.stdout + oldest.stderr)[-3000:]


def test_an_activated_environment_with_torch_is_used_as_it_is(tmp_path):
    """A user's activated environment (VIRTUAL_ENV, as sbatch passes it to a job) that has
    torch runs the command: the clone installed into it, nothing built and nothing asked of a
    registry (pip pointed at nothing, no network), one line saying so; the project's own
    environment is not made."""
    from fresh_python import bare_python

    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare -rn)")
    venv = tmp_path / "users-env"
    env = bare_python(venv, with_packages=True)  # torch reachable, not this package
    cache = tmp_path / "cache"
    env.update(VIRTUAL_ENV=str(venv), XDG_CACHE_HOME=str(cache))
    show = ["python", "-c", "import sys, imagenet_recipes; print(sys.prefix); "
                            "print(imagenet_recipes.__file__)"]
    first = _offline("bash", "launch/env.sh", *show, env=env, inherit=False)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    prefix, package = first.stdout.split()
    assert prefix == str(venv) and package.startswith(str(REPO))
    told = [line for line in first.stderr.splitlines() if line.startswith("launch/env.sh:")]
    assert told == [f"launch/env.sh: the active environment {venv} (its torch; nothing "
                    "built)"], first.stderr
    assert not cache.exists() or not list(cache.glob("imagenet-recipes/venv-*"))
    # a command it starts runs launch/env.sh again (quickstart does): the same, said once
    nested = _offline("bash", "launch/env.sh", "bash", "launch/env.sh", *show, env=env,
                      inherit=False)
    assert nested.returncode == 0 and nested.stdout.split()[0] == str(venv)
    assert nested.stderr.count("the active environment") == 1, nested.stderr
