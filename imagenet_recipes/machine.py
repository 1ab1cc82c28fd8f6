"""This machine, as the run logs and the benchmark tools describe it (no torch import)."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Optional

REPOSITORY = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'AMD EPYC 9554 64-Core Processor'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """The cores this process may run on (a container or taskset may allow fewer than the
    machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_per_process(local_world: int, cores: Optional[int] = None) -> int:
    """This process's share of the cores (`cores`, else those it may run on) when
    `local_world` processes run on the machine."""
    return max(1, (cores or cpu_cores()) // max(local_world, 1))


def git_commit() -> str:
    """The repository's short commit, marked when tracked files differ from it ('unknown'
    outside a git checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPOSITORY, text=True, capture_output=True,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} (plus uncommitted changes)" if dirty else commit
