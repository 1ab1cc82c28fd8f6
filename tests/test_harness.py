"""The test helpers' own promise: a training run that hangs fails its test with every
process's Python stacks, and leaves nothing running behind it."""
import sys
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
