"""The tiers' rule, checked on every test: a test that starts a process (an entry script,
torchrun, a tool, a shell script, DataLoader workers, mp.spawn) is marked slow, so that
`pytest -m "not slow"` stays in-process and about a minute (docs/testing.md, "Tiers"). A test
without the mark that starts one fails, naming what it started. `git`, which the product asks
for the commit it records, does not count: it is no part of what a test runs; nor do the
programs a library runs once per machine to learn about it (ALLOWED)."""
from __future__ import annotations

import multiprocessing.process
import subprocess
from pathlib import Path

import pytest

# Programs a fast test may start: git, which the product asks for the commit it records, and
# those a library runs once per machine to learn about it (matplotlib's font list, fc-list;
# ctypes.util.find_library's compiler and loader lookups). The latter run only where their
# answer is not cached yet, a fresh machine's first run (CI's), so counting them would fail a
# test there alone.
ALLOWED = {"git", "fc-list", "ldconfig", "gcc", "cc", "objdump", "ld", "ld.bfd", "uname"}


def _program(args) -> str:
    first = args if isinstance(args, (str, bytes)) else args[0]
    text = first.decode() if isinstance(first, bytes) else str(first)
    return Path(text.split()[0]).name if text.strip() else text


@pytest.fixture(autouse=True)
def slow_if_it_starts_processes(request, monkeypatch):
    if request.node.get_closest_marker("slow"):
        yield
        return
    started = []
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def popen(self, args, *more, **kwargs):
        if _program(args) not in ALLOWED:
            started.append(" ".join(map(str, args if isinstance(args, (list, tuple))
                                        else [args]))[:160])
        return popen_init(self, args, *more, **kwargs)

    def start(self):
        started.append(f"a {type(self).__name__} (multiprocessing)")
        return process_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    if started:
        pytest.fail(f"this test starts processes ({len(started)}; the first: {started[0]}) "
                    "but is not marked @pytest.mark.slow (docs/testing.md, \"Tiers\")",
                    pytrace=False)
