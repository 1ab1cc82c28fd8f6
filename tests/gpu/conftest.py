"""The GPU tier: checks of the CUDA paths, in groups (one file each, tests/gpu/test_gpu_GROUP.py),
run by `bash launch/gpu_check.sh` on a machine with a GPU. Without one every check is skipped
with the reason, unless GPU_TIER_DEVICE=cpu asks for the CPU simulation (see gpu_tier.py).

Each finished check is one JSON line in GPU_TIER_OUT/checks.jsonl, written the moment it
finishes: group, check, status (passed / failed / skipped / stopped), seconds, and what it saw
or why it failed or skipped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from imagenet_recipes.bench.common import installed

from . import gpu_tier

HERE = Path(__file__).resolve().parent
_SESSION_PID = None  # the pytest process (set at session start)
_current = {}  # the check running now: its nodeid and start (for a line when the tier is stopped)


def _in_tier(item) -> bool:
    return HERE in Path(str(item.fspath)).resolve().parents


def group_of(item) -> str:
    return Path(str(item.fspath)).stem.removeprefix("test_gpu_")


def no_gpu_reason() -> str:
    return (f"no CUDA GPU is visible (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}; torch.cuda.is_available() is False): the GPU tier runs on "
            "a GPU machine with `bash launch/gpu_check.sh`; `bash launch/gpu_check.sh --cpu` "
            "simulates it on the CPU")


def pytest_collection_modifyitems(config, items):
    # Every check starts runs or drives a device's decoder (DataLoader workers at least):
    # the tier belongs to the integration tier, never to `-m "not slow"` (docs/testing.md).
    for item in items:
        if _in_tier(item):
            item.add_marker(pytest.mark.slow)
    if gpu_tier.FIRST_OF_EACH:
        _keep_first_of_each(config, items)
    if gpu_tier.SIMULATED or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=no_gpu_reason())
    for item in items:
        if _in_tier(item):
            item.add_marker(skip)


def _keep_first_of_each(config, items):
    """gpu_check.sh --first-of-each: of each parametrized check, its first parameter set that
    this device runs (one marked to be skipped here is passed over)."""
    families = {}
    for item in items:
        if _in_tier(item):
            families.setdefault((str(item.fspath), item.originalname), []).append(item)
    dropped = set()
    for members in families.values():
        runnable = [m for m in members if not _skipped_here(m)] or members
        dropped.update(id(m) for m in members if m is not runnable[0])
    if dropped:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in dropped])
        items[:] = [i for i in items if id(i) not in dropped]


def _skipped_here(item) -> bool:
    return any(mark.name == "skip" or (mark.name == "skipif" and mark.args and mark.args[0])
               for mark in item.iter_markers())


# --- the record ----------------------------------------------------------------------------------
def missing_packages() -> dict:
    """The optional packages a check needs and this Python lacks -> what to do about it."""
    wanted = {"nvidia.dali": "DALI (pip install nvidia-dali-cuda130; checks of the dali group)",
              "torchcodec": "TorchCodec (pip install torchcodec; checks of the decode group)",
              "horovod": "Horovod (launch/install_horovod.sh; the hvd entry check)"}
    return {name: why for name, why in wanted.items() if not installed(name)}


def environment() -> dict:
    env = {"kind": "environment", "device": gpu_tier.DEVICE, "python": sys.version.split()[0],
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cpu_cores": os.cpu_count(), "missing": missing_packages()}
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                   cudnn=torch.backends.cudnn.version(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        env["driver"] = (smi.stdout.strip().splitlines() or [None])[0]
    env.update(installed_versions())
    return env


def installed_versions() -> dict:
    """torchvision's, DALI's, Horovod's and timm's versions (None: not installed), from their
    metadata: importing timm or torchvision to ask would cost each group's session seconds
    (they import torch._dynamo)."""
    from importlib import metadata

    wanted = {"torchvision": "torchvision", "nvidia.dali": "nvidia-dali", "horovod": "horovod",
              "timm": "timm"}
    versions = dict.fromkeys(wanted)
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        for module, project in wanted.items():
            # DALI's project is named for its CUDA major: nvidia-dali-cuda130
            if name == project or (module == "nvidia.dali" and name.startswith(project + "-")):
                versions[module] = dist.version
    return versions


def pytest_sessionstart(session):
    global _SESSION_PID
    _SESSION_PID = os.getpid()
    if gpu_tier.OUT is not None:
        gpu_tier.append("checks.jsonl", environment())
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stopped)


def _stopped(signum, frame):
    """The tier was stopped (a time limit's SIGTERM): record the check in flight, kill every run
    still alive, and end. Once, and in the pytest process only: GNU timeout signals pytest and
    then its whole process group, where a process forked from pytest has this handler too
    (a check was seen recorded twice)."""
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    if os.getpid() != _SESSION_PID:
        os._exit(128 + signum)
    if _current:
        gpu_tier.append("checks.jsonl", {
            "kind": "check", "check": _current["check"], "group": _current["group"],
            "status": "stopped", "seconds": round(time.perf_counter() - _current["start"], 1),
            "detail": f"stopped by {signal.Signals(signum).name} before it finished"})
    gpu_tier.kill_live_groups()
    os._exit(128 + signum)


def pytest_runtest_logstart(nodeid, location):
    _current.update(check=nodeid.split("::", 1)[-1],
                    group=Path(location[0]).stem.removeprefix("test_gpu_"),
                    start=time.perf_counter())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not _in_tier(item):
        return
    done = (report.when == "call" or (report.when == "setup" and not report.passed))
    if not done:
        return
    if report.skipped:
        status, detail = "skipped", str(report.longrepr[2]) if isinstance(
            report.longrepr, tuple) else str(report.longrepr)
        detail = detail.removeprefix("Skipped: ")
    elif report.failed:
        status = "failed"
        message = getattr(call.excinfo, "value", None)
        detail = f"{type(message).__name__}: {message}" if message is not None else "failed"
    else:
        status = "passed"
        detail = "; ".join(text for key, text in item.user_properties if key == "saw")
    gpu_tier.append("checks.jsonl", {
        "kind": "check", "check": item.nodeid.split("::", 1)[-1], "group": group_of(item),
        # milliseconds: a check on a GPU (or simulated on small data) can take a few
        "status": status, "seconds": round(time.perf_counter() - _current.get(
            "start", time.perf_counter()), 3), "detail": detail[:2000],
        "numbers": dict(v for k, v in item.user_properties if k == "number")})


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture
def saw(request):
    """saw("what the check saw"): the check's line in checks.jsonl says it."""
    return lambda text: request.node.user_properties.append(("saw", text))


@pytest.fixture
def number(request):
    """number(name, value): a measured value, kept in the check's line."""
    return lambda name, value: request.node.user_properties.append(("number", (name, value)))


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Path:
    """Where the checks' runs write (checkpoints included): a temporary folder, never the
    record, so that only small logs come back from a GPU machine."""
    return tmp_path_factory.mktemp("gpu-tier-runs")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> Path:
    """8 classes x 48 train / 8 val JPEGs of 80-160 px: a 16-image batch at 64 px takes a few
    milliseconds on a GPU, and one epoch holds 24 steps of one rank, 12 of two."""
    from imagenet_recipes.bench.jobs import dataset_command, make_dataset

    root = tmp_path_factory.mktemp("gpu-tier-images")
    make_dataset(dataset_command(root, classes=8, train=48, val=8, min_size=80, max_size=160,
                                 workers=os.cpu_count()))
    return root

