"""The test helpers' own promise: a training run that hangs fails its test with every
process's Python stacks, and leaves nothing running behind it; a run several tests share is
made once, on one xdist worker (launch/test.sh's `-n 2 --dist loadgroup`); and a test that
starts a process without the slow mark fails (tests/process_tier.py)."""
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest

pytestmark = pytest.mark.slow  # every test here starts real processes


def test_a_hung_run_fails_with_its_stacks_and_leaves_no_process(monkeypatch, tmp_path):
    pid_file = tmp_path / "child.pid"
    # A parent that starts a child (as torchrun starts its workers) and both wait forever.
    hang = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('started', flush=True)\n"
            "def wait_forever():\n"
            "    time.sleep(600)\n"
            "wait_forever()\n")
    monkeypatch.setattr(conftest, "script_command",
                        lambda script, args, nproc=0: [sys.executable, "-c", hang])
    with pytest.raises(AssertionError) as failure:
        conftest.run_script("nd.py", [], timeout=5)
    message = str(failure.value)
    assert "still running after 5 s" in message
    assert "started" in message  # the output before the stop
    assert "in wait_forever" in message  # the parent's stack, from faulthandler
    status = Path(f"/proc/{int(pid_file.read_text())}/status")
    # gone, or a zombie its new parent has not reaped yet
    assert not status.exists() or "\nState:\tZ" in status.read_text()


def test_an_xdist_group_runs_on_one_worker_so_its_shared_run_is_made_once(tmp_path):
    """The suite's shared runs (session fixtures: the parity runs, the one-server PS run, ...)
    are made once only because their tests share an xdist_group; pytest 9.2 silently broke that
    grouping (pytest-dev/pytest-xdist#1386) and every shared run was made on both workers."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""\
        import os, time
        import pytest

        @pytest.fixture(scope="session")
        def shared_run(tmp_path_factory):
            # one file per build, in the folder every worker's temp dirs share
            built = tmp_path_factory.getbasetemp().parent / "builds"
            built.mkdir(exist_ok=True)
            (built / os.environ["PYTEST_XDIST_WORKER"]).touch()

        GROUP = pytest.mark.xdist_group("shared")

        @GROUP
        @pytest.mark.parametrize("i", range(3))
        def test_uses_the_shared_run(shared_run, i):
            time.sleep(0.2)

        @pytest.mark.parametrize("i", range(6))
        def test_other(i):
            time.sleep(0.2)
        """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "2", "--dist", "loadgroup", "--basetemp", tmp_path / "base",
                          "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(list((tmp_path / "base" / "builds").iterdir())) == 1, run.stdout


PLANTED_TIERS = '''
import subprocess, sys
import pytest
from process_tier import slow_if_it_starts_processes  # as tests/conftest.py has it

def test_starts_python_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_starts_python_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_asks_git():
    subprocess.run(["git", "--version"], capture_output=True, check=True)

def test_a_library_lists_the_fonts():  # matplotlib's first run on a machine
    try:
        subprocess.run(["fc-list", "--version"], capture_output=True)
    except FileNotFoundError:
        pass

def test_in_process():
    assert sum(range(4)) == 6
'''


def test_a_test_that_starts_a_process_without_the_slow_mark_fails(tmp_path):
    """tests/process_tier.py, the tiers' rule as every test runs: on a planted file, the test
    that starts Python without @pytest.mark.slow errs, naming what it started, and the run
    fails; the marked one, the one that only asks git, the one where a library lists the fonts
    and the in-process one pass."""
    (tmp_path / "test_planted.py").write_text(PLANTED_TIERS)
    shutil.copy(conftest.TESTS / "process_tier.py", tmp_path)  # `python -m`: the cwd imports
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: starts processes\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rE", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    # the test itself passed; its teardown, where the rule is checked, errs
    assert "5 passed, 1 error" in proc.stdout, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "test_starts_python_unmarked" in errors[0], errors
    assert f"the first: {sys.executable} -c pass) but is not marked @pytest.mark.slow" in \
        proc.stdout
