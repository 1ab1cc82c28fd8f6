"""`pytest --strict-skips` (what `bash launch/test.sh`, the README's test command and CI, runs):
a skip is a failure unless EXPECTED_SKIPS below declares it, and a dependency that
requirements.txt names must import before any test runs.

Without it, a component that failed to install turns its tests into skips and the run stays
green (DALI, Horovod, TorchCodec, nvImageCodec and SLURM each gate tests that way). With it:

  * at the start, every requirement of requirements.txt that applies to this machine (its
    environment markers evaluated) is imported; one that cannot be stops the run (exit 4, as
    pytest's usage errors) naming it, its import name and the error;
  * at the end, every skip that no entry of EXPECTED_SKIPS covers is listed with its reason,
    and the run fails (exit 1) even where every test that ran passed.

As PyTorch's CI treats a test that skips where it should run: the list of what may skip, and
why, is explicit; anything else is a missing piece.
"""
from __future__ import annotations

import fnmatch
import importlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _slurm_cannot_run() -> bool:
    """The local cluster of tests/test_slurm.py needs root, and launch/test.sh installs SLURM
    only as root: without root, its tests skip by design."""
    return os.geteuid() != 0 and shutil.which("sbatch") is None


@dataclass(frozen=True)
class ExpectedSkip:
    """Tests (node ids matching `tests`, fnmatch) that may skip with a reason matching `reason`
    (a regular expression), where `applies()` holds on this machine; `why` says why."""
    tests: str
    reason: str
    applies: Callable[[], bool]
    why: str


EXPECTED_SKIPS: Tuple[ExpectedSkip, ...] = (
    ExpectedSkip("tests/gpu/*", r"no CUDA GPU is visible", lambda: _no_cuda(),
                 "the GPU tier runs where a GPU is (bash launch/gpu_check.sh); the CPU suite "
                 "simulates it through gpu_check.sh --cpu"),
    ExpectedSkip("tests/*", r"needs a machine without a GPU|a CUDA GPU is visible",
                 lambda: not _no_cuda(),
                 "what a run does where no GPU is visible, checked where none is"),
    ExpectedSkip("tests/test_slurm.py::*", r"needs root|SLURM not installed",
                 lambda: _slurm_cannot_run(),
                 "a local SLURM cluster needs root; CI runs as root and installs it"),
)

# Import names of requirements whose distribution name differs
IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml", "pytest-xdist": "xdist",
                "nvidia-dali-cuda130": "nvidia.dali",
                "nvidia-nvimgcodec-cu13": "nvidia.nvimgcodec"}
# Requirements that install a program rather than a module: checked beside this Python
PROGRAMS = {"py-spy"}


def requirements(path: Path = REPO / "requirements.txt") -> List[Tuple[str, str]]:
    """(distribution, import name) of each requirement of `path` that applies here."""
    from packaging.requirements import Requirement

    found = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = requirement.name.lower()
        found.append((requirement.name, IMPORT_NAMES.get(name, name.replace("-", "_"))))
    return found


def missing_requirements(path: Path = REPO / "requirements.txt") -> List[str]:
    """One line per requirement of `path` that does not import here."""
    missing = []
    for distribution, module in requirements(path):
        if distribution.lower() in PROGRAMS:
            if not (Path(sys.executable).with_name(distribution).exists()
                    or shutil.which(distribution)):
                missing.append(f"{distribution}: no program {distribution} beside "
                               f"{sys.executable} or on the PATH")
            continue
        try:
            importlib.import_module(module)
        except Exception as err:  # ImportError, or a library that fails to load
            missing.append(f"{distribution} (import {module}): {type(err).__name__}: {err}")
    return missing


def expected(nodeid: str, reason: str) -> bool:
    return any(fnmatch.fnmatch(nodeid, rule.tests) and re.search(rule.reason, reason)
               and rule.applies() for rule in EXPECTED_SKIPS)


def pytest_addoption(parser) -> None:
    parser.addoption("--strict-skips", action="store_true",
                     help="fail on a skip that tests/strict_skips.py does not declare, and on a "
                          "requirement of requirements.txt that does not import")


def pytest_configure(config) -> None:
    if not config.getoption("--strict-skips") or hasattr(config, "workerinput"):
        return  # the controller checks, once; xdist's workers send it their reports
    missing = missing_requirements()
    if missing:
        raise pytest.UsageError(
            "--strict-skips: requirements.txt names what does not import here:\n  "
            + "\n  ".join(missing)
            + "\n(install them: launch/env.sh builds the environment from requirements.txt)")
    config.pluginmanager.register(SkipCheck(), "strict-skips-check")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipCheck:
    """Collects the skips no EXPECTED_SKIPS entry covers; fails the run at its end."""

    def __init__(self):
        self.unexpected: List[Tuple[str, str]] = []

    def _look_at(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = skip_reason(report)
            if not expected(report.nodeid, reason):
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report) -> None:  # a test or its fixture skipped
        self._look_at(report)

    def pytest_collectreport(self, report) -> None:  # a module skipped (importorskip at the top)
        self._look_at(report)

    def pytest_sessionfinish(self, session) -> None:
        if self.unexpected and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.unexpected:
            return
        terminalreporter.section("skips that --strict-skips does not expect", sep="=",
                                 red=True)
        for nodeid, reason in self.unexpected:
            terminalreporter.write_line(f"UNEXPECTED SKIP {nodeid}: {reason}")
        terminalreporter.write_line(
            f"{len(self.unexpected)} skip(s) where the test should run here: a missing piece "
            "(install it), or a skip to declare, with why, in tests/strict_skips.py's "
            "EXPECTED_SKIPS")
