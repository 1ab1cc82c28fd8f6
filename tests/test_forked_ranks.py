"""tests/forked_ranks.py, the runs forked from a pre-imported interpreter (conftest.run_forked):
each is the script's own process, as `python SCRIPT` is, with its environment, argv, folder,
output and exit status; several are torchrun's ranks; a signal for the run reaches it, a run
whose requester dies goes with it, and the helper processes multiprocessing starts for a run are
forked as well."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, children, run_forked, script_env

pytestmark = pytest.mark.slow

SCRIPT = """
import os, signal, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "script dir first", sys.path[0], flush=True)
print("rank", os.environ.get("RANK"), "of", os.environ.get("WORLD_SIZE"),
      "at", os.environ.get("MASTER_PORT"), "asked", os.environ.get("ASKED"), "pid", os.getpid())
print("to stderr", file=sys.stderr)
if "--burn" in sys.argv:  # 0.3 CPU-seconds
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
if "--wait" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), sys.exit(7)))
    open(sys.argv[-1], "w").write(str(os.getpid()))
    time.sleep(120)
sys.exit(int(os.environ.get("RANK", "3")) + 3)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def test_a_forked_run_is_the_scripts_own_process(script):
    """... and its CPU seconds are the server's to tell (tests/cpu_profile.py counts them)."""
    from forked_ranks import forked_cpu

    before = forked_cpu()
    proc = run_forked(str(script), ["a", "--burn"], env={"ASKED": "yes"}, check=False)
    assert proc.returncode == 6, proc.stderr  # sys.exit's code (RANK unset: 3 + 3)
    assert forked_cpu() - before >= 0.25
    assert f"argv ['a', '--burn'] cwd {REPO} script dir first {script.parent}" in proc.stdout
    assert "rank None of None at None asked yes" in proc.stdout
    assert proc.stderr.strip() == "to stderr"
    pid = int(proc.stdout.split("pid ")[1].split()[0])
    assert pid != os.getpid()


def test_ranks_get_torchruns_variables_and_the_first_failure_is_the_status(script):
    proc = run_forked(str(script), [], nproc=2, check=False)
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank"))
    assert [line.split(" pid")[0].rsplit(" at ", 1)[0] for line in lines] == [
        "rank 0 of 2", "rank 1 of 2"], proc.stdout
    assert len({line.split(" at ")[1].split()[0] for line in lines}) == 1  # one store port
    assert proc.returncode in (3, 4)  # rank 0 exits 3, rank 1 exits 4: whichever came first


def test_a_signal_reaches_the_run_and_a_dead_requester_takes_the_run_with_it(script, tmp_path):
    from forked_ranks import command, server_socket

    env = {**script_env(), "FORKED_RANKS_SOCKET": server_socket(script_env())}
    for ending in ("SIGTERM", "SIGKILL"):
        marker = tmp_path / f"pid-{ending}"
        proc = subprocess.Popen(command(0, [str(script), "--wait", str(marker)]), env=env,
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (marker.is_file() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        run = int(marker.read_text())
        proc.send_signal(getattr(signal, ending))
        stdout, _ = proc.communicate(timeout=60)
        if ending == "SIGTERM":  # forwarded: the run's handler exits 7
            assert "got SIGTERM" in stdout and proc.returncode == 7, stdout
        else:  # the requester cannot forward SIGKILL: the run notices it is gone and ends
            assert proc.returncode == -signal.SIGKILL
            while os.path.exists(f"/proc/{run}") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not os.path.exists(f"/proc/{run}"), "the run outlived its requester"


ENDINGS = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
case = sys.argv[1]
if case == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
elif case == "message":
    sys.exit("bye")
elif case == "error":
    raise ValueError("boom")
elif case == "interrupt":
    raise KeyboardInterrupt
sys.stdout.write("unflushed")
"""


@pytest.mark.parametrize("case", ["thread", "message", "error", "interrupt"])
def test_a_forked_run_ends_as_the_interpreter_ends_a_script(case, tmp_path):
    """Its threads joined, atexit handlers run, output flushed, an uncaught exception or
    sys.exit's message printed, the same exit status: as `python SCRIPT` (the forked run skips
    only the teardown of the modules, which are the server's)."""
    path = tmp_path / "endings.py"
    path.write_text(ENDINGS)
    real = subprocess.run([sys.executable, str(path), case], capture_output=True, text=True,
                          env=script_env(), timeout=60)
    forked = run_forked(str(path), [case], check=False, timeout=60)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout), forked.stderr
    assert forked.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:]
    assert "atexit ran" in real.stdout and real.returncode == {
        "thread": 0, "message": 1, "error": 1, "interrupt": -signal.SIGINT}[case]


HELPERS = """
import multiprocessing, os, sys

def report(queue):
    queue.put(("torch" in sys.modules, os.environ.get("ASKED")))

if __name__ == "__main__":
    for method in ("forkserver", "spawn"):
        context = multiprocessing.get_context(method)
        queue = context.Queue()
        child = context.Process(target=report, args=(queue,))
        child.start()
        print(method, *queue.get(timeout=60), flush=True)
        child.join()
        print(method, "exit", child.exitcode, flush=True)
"""


def test_a_runs_multiprocessing_helpers_are_forked_too_and_end_with_it(tmp_path):
    """multiprocessing's fork server and spawned processes (the loader workers' server) are new
    interpreters in a real run; in a forked one they come from the server as well (torch
    already imported: none of its 5-6 CPU-s of imports), with the run's environment and the
    pipes multiprocessing gave them, and they end with their run: the server has no child
    left."""
    import forked_ranks

    path = tmp_path / "helpers.py"
    path.write_text(HELPERS)
    proc = run_forked(str(path), [], env={"ASKED": "yes"}, timeout=120)
    assert proc.stdout.splitlines() == ["forkserver True yes", "forkserver exit 0",
                                        "spawn True yes", "spawn exit 0"], proc.stderr
    server = forked_ranks._server[0].pid
    deadline = time.monotonic() + 30
    while children(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children(server) == []
    os.kill(server, 0)  # the server is still there: its children ended, not the server
