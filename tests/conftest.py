"""Shared test helpers: a tiny generated ImageFolder and runners for the real entry scripts.

Every training test launches the real scripts in subprocesses (plain python, or torchrun with
gloo), exactly as a user would, and reads back what they wrote (JSONL, checkpoints, events).
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

# One compute thread in the test processes themselves too, as in every process they start (see
# script_env): two pytest workers with a thread per core each, beside the runs they start, leave
# OpenMP's threads waiting on each other, and an in-process training test ran 4-10x slower than
# with one thread. Set before torch is imported, so that processes forked from here (mp.spawn,
# loader workers) inherit it; a value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# --strict-skips (launch/test.sh): undeclared skips and requirements that do not import fail
from strict_skips import pytest_addoption, pytest_configure  # noqa: E402,F401
# every test that starts a process is marked slow: checked as it runs
from process_tier import slow_if_it_starts_processes  # noqa: E402,F401
# beside the fork server they serve (tests/forked_ranks.py; the GPU tier's simulation uses
# them too): a port for a group of processes to meet on, the variables a fork cannot set
from forked_ranks import import_time_names, unused_port  # noqa: E402,F401
# RECIPES_CPU_PROFILE=FILE: each test's CPU seconds, a JSON line each (tests/cpu_profile.py)
from cpu_profile import pytest_runtest_protocol  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "train"
# Run with -m (script_command): DDP with local SGD, an experiment; train/ps.py with
# --worker-slowdown, the benchmarks' emulated straggler
LOCAL_SGD = "imagenet_recipes.experiments.local_sgd"
SLOW_PS = "imagenet_recipes.bench.slow_workers.ps"
TESTS = REPO / "tests"

# Small enough for a 2-core CI box: timm's test_resnet (a ResNet with BatchNorm and residual
# blocks, 0.37M parameters) at 32 px. On a CPU a step of torchvision's resnet18 (11.7M) costs
# 0.3 s in fp32 but 4-5 s in float16 (emulated on every CPU) and in bfloat16 where the CPU lacks
# it natively; test_resnet's costs 0.02 s and 0.1-0.2 s. torchvision's ResNets train in the
# tests that name them (RESNET18 below) and in tests/smoke_oldest.sh.
#
# They load in the training process (-j 0): a loader worker is forked from a fork server that
# imports torch and torchvision once per rank, about 4 s of CPU per rank and run, and most tests
# are about something else. The tests of what workers change (signals, restarts, validation
# shards, the showcase run) add LOADER_WORKERS; each sample's augmentation has its own seed, so
# -j does not change a run's numbers.
TINY = ["-a", "timm/test_resnet", "--image-size", "32", "-j", "0", "-p", "1"]
RESNET18 = ["-a", "resnet18", "--image-size", "32", "-j", "0", "-p", "1"]
LOADER_WORKERS = ["-j", "1"]

# A CPU without native bfloat16 (AVX2 only), on any x86 CPU: oneDNN and ATen held to AVX2, as
# RESULTS' AVX2 rows are measured. A test that needs the bf16-emulating case forces it with this.
NO_NATIVE_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _load_make_synthetic():
    # One module object per name: the generator's worker processes pickle its functions by
    # reference, so a second copy under the same name would break test_data_tools.
    if "make_synthetic" in sys.modules:
        return sys.modules["make_synthetic"].make_synthetic_imagefolder
    spec = importlib.util.spec_from_file_location("make_synthetic", REPO / "data" / "make_synthetic.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module.make_synthetic_imagefolder


@pytest.fixture(scope="session")
def tiny_imagefolder(tmp_path_factory) -> Path:
    """4 classes x 16 train images (64 = divisible by 2 ranks x batch 4 x 8 steps) and
    4 x 5 = 20 val images; with batch 6 and 2 ranks the val shards (10 + 10) end in
    partial batches, and with 3 ranks they are uneven (7 + 7 + 6)."""
    root = tmp_path_factory.mktemp("tiny_imagefolder")
    _load_make_synthetic()(root, num_classes=4, train_per_class=16, val_per_class=5,
                           min_size=40, max_size=72, seed=0, workers=1, verbose=False)
    return root


def script_env() -> dict:
    """The environment the tests start runs with."""
    env = dict(os.environ)
    # runs as a user of their own environment starts them, not through launch/env.sh (its own
    # test is in tests/test_env_sh.py)
    env.pop("RECIPES_ENV_SH", None)
    env["OMP_NUM_THREADS"] = "1"  # 2 cores: one compute thread per process
    env["PYTHONWARNINGS"] = "ignore"
    # A run that hangs is stopped with SIGABRT first (see run_script): every Python process of
    # it then prints all its threads' stacks, so the failure says where it hung.
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def run_tool(tool: str, *args, timeout: int = 300,
             env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`python -m imagenet_recipes.bench.<tool> ARGS` from the repository root, as a user runs
    it (the package is installed in the environment: launch/env.sh, or pip install -e .). The
    tool's own process is forked through this process's server (run_forked: its imports made
    already), unless `env` sets a variable read at interpreter start or import (a planted
    module on PYTHONPATH): then a fresh interpreter. The runs the tool starts are its own, real
    processes either way."""
    from forked_ranks import command

    program = ["-m", f"imagenet_recipes.bench.{tool}", *map(str, args)]
    if import_time_names(env):
        cmd, full_env = [sys.executable, *program], {**script_env(), **env}
    else:
        cmd, full_env = command(0, program), forked_env(env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=full_env)


LAB = REPO / "lab"


def run_lab(study: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python lab/<study>.py ARGS` from the repository root, as its docstring shows it: the
    lab's studies are scripts beside their records, outside the installed package."""
    return subprocess.run([sys.executable, str(LAB / f"{study}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=script_env())


def lab_module(study: str) -> types.SimpleNamespace:
    """lab/<study>.py's names, the script loaded without running its command (runpy: the lab is
    not a package to import)."""
    return types.SimpleNamespace(**runpy.run_path(str(LAB / f"{study}.py")))


def script_command(script: str, args: List, nproc: int = 0,
                   torchrun_args: Sequence[str] = ()) -> List[str]:
    """train/<script> (or a path from the repository root, or a module of the package run with
    -m, e.g. imagenet_recipes.experiments.local_sgd) with plain python (nproc=0) or torchrun
    --nproc_per_node=nproc."""
    program = script_program(script)
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *torchrun_args, *program]
    else:
        cmd = [sys.executable, *program]
    return cmd + [str(a) for a in args]


def script_program(script: str) -> List[str]:
    """What follows `python` for script_command's `script`: a path, or -m and a module."""
    if script.startswith("imagenet_recipes."):
        return ["-m", script]
    return [str(REPO / script if "/" in script else TRAIN / script)]


def traced(script: str, trace_dir: Path, delay_s: float = 0.0) -> Tuple[List[str], dict]:
    """(argv prefix, variables) that run train/<script> under tests/sample_trace.py, which
    writes every training sample index the run is given into files under `trace_dir` (and
    hands each one out `delay_s` late). Prefix the argv with `python` or `torchrun ... `; the
    variables go beside the run's own environment (script_env, or run_forked's `env`)."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    return ([str(TESTS / "sample_trace.py"), str(trace_dir), str(TRAIN / script)],
            {"SAMPLE_TRACE_DELAY_S": str(delay_s)})


def traced_samples(trace_dir: Path, epoch: int = 0) -> List[int]:
    """Every sample index of `epoch` that the traced runs were given (all ranks)."""
    return [int(index) for path in sorted(trace_dir.iterdir())
            for line in path.read_text().splitlines()
            for e, index in [line.split()] if int(e) == epoch]


def start_script(script: str, args: List, nproc: int = 0, torchrun_args: Sequence[str] = (),
                 env: Optional[dict] = None) -> subprocess.Popen:
    """Start a run in the background, stdout and stderr merged into one text pipe."""
    return subprocess.Popen(script_command(script, args, nproc, torchrun_args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**script_env(), **(env or {})}, cwd=REPO)


def start_forked(script: str, args: List, env: Optional[dict] = None) -> subprocess.Popen:
    """start_script's one-process run, forked from the server as run_forked's are (the same
    rules for `env`); a signal sent to the returned process reaches the run."""
    return subprocess.Popen(forked_command(script, args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=forked_env(env), cwd=REPO)


def run_script(script: str, args: List, nproc: int = 0, timeout: int = 600,
               check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run train/<script> to the end (see script_command), with `env` added to its
    environment. A run still going after `timeout` seconds fails the test with the Python
    stacks of all its processes (torchrun's workers and their loader workers included), and
    none of them is left running."""
    return _run_to_end(script_command(script, args, nproc), {**script_env(), **(env or {})},
                       timeout, check)


def run_forked(script: str, args: List, nproc: int = 0, timeout: int = 600,
               check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """run_script's run, its processes forked from an interpreter that has imported torch,
    torchvision, timm and the package already (tests/forked_ranks.py): for the tests of what
    runs compute, where a tiny run's imports cost ten times its training. `env` may hold only
    what a run reads while it runs: a variable read at interpreter start or at import would be
    the server's, not the run's."""
    return _run_to_end(forked_command(script, args, nproc), forked_env(env), timeout, check)


def forked_command(script: str, args: List, nproc: int = 0) -> List[str]:
    """script_command's run through this process's fork server (tests/forked_ranks.py): one
    process, or nproc ranks as torchrun --standalone starts them."""
    from forked_ranks import command

    port = unused_port() if nproc else 0
    return command(nproc, script_program(script) + [str(a) for a in args], port)


def forked_env(env: Optional[dict] = None) -> dict:
    """The environment of a run forked through this process's server (run_forked; a launcher
    such as horovodrun that starts forked_ranks.command(0, ...) as its ranks' command): the
    tests' run environment, `env` and the server's socket."""
    from forked_ranks import server_socket

    refused = import_time_names(env)
    if refused:
        raise ValueError(f"a forked run cannot set {refused}: use run_script")
    return {**script_env(), **(env or {}), "FORKED_RANKS_SOCKET": server_socket(script_env())}


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """mp.spawn(fn, args, nprocs), its ranks forked from a fork server (one per test process,
    torch.multiprocessing's "forkserver" start) that has imported torch and fn's module once: a
    spawned rank starts a fresh interpreter that imports them again, 6-7 CPU-seconds each. The
    ranks inherit nothing else of this process (its threads, its state), as spawned ones."""
    import torch.multiprocessing as mp

    # read when the server starts, the first call's: every caller asks for torch and its module
    mp.get_context("forkserver").set_forkserver_preload(["torch", fn.__module__])
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def _run_to_end(cmd: List[str], env: dict, timeout: int,
                check: bool) -> subprocess.CompletedProcess:
    # Its own process group: the whole tree can be signalled at once.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _dump_stacks_one_by_one(proc.pid)
        time.sleep(2)
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()  # all of the output, from the start
        raise AssertionError(f"{' '.join(cmd)} still running after {timeout} s; its output and "
                             f"stacks:\n{stdout[-3000:]}\n{stderr[-20000:]}") from None
    _kill_group(proc.pid)  # loader workers or servers a finished run may have orphaned
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                             f"{stdout[-3000:]}\n{stderr[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def loaders_for(cfg, shard, device: torch.device):
    """build_loaders as a run of `cfg` on the shard's processes calls it: with the run's loader
    options and its plan."""
    from imagenet_recipes.data import build_loaders
    from imagenet_recipes.options import LoaderOptions, PlanOptions
    from imagenet_recipes.run_plan import plan_run

    return build_loaders(LoaderOptions.of(cfg), shard, device,
                         plan_run(PlanOptions.of(cfg), shard.world_size, device.type))


def proc_stat(pid: int) -> List[str]:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ... (the name,
    in parentheses, may hold spaces, so the split starts after its ")"). OSError when gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def children(pid: int) -> List[int]:
    """The processes `pid` started and that have not ended, from any of its threads (a fork
    server's, torchrun's ranks, a trainer's loader fork server); [] when `pid` is gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone
        return []
    found = []
    for thread in threads:
        try:
            found += map(int, Path(f"/proc/{pid}/task/{thread}/children").read_text().split())
        except OSError:  # a thread that ended since the listing: the others still count
            continue
    return found


def _dump_stacks_one_by_one(pgid: int) -> None:
    """SIGABRT to each process of the group in turn (faulthandler prints its stacks): signalled
    all at once, processes sharing a stderr pipe interleave their stacks character by
    character."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc_stat(int(entry.name))[2]) == pgid:
                os.kill(int(entry.name), signal.SIGABRT)
                time.sleep(0.5)
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is empty: all of it has exited
        pass


def read_jsonl(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def records(run_dir: Path, kind: str) -> List[dict]:
    return [r for r in read_jsonl(run_dir) if r["kind"] == kind]


# --- damaged data, as real ImageNet-style folders contain it ---------------------------------
def jpeg_bytes(mode: str, color) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (60, 50), color).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (60, 50), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def add_damaged_files(class_dir) -> dict:
    """One file of each kind ImageNet-style folders really contain, each sorted right after a
    good image (so, in a folder of 6 or more images, the replacement search never meets two of
    them in a row).
    -> {name: decodable?}"""
    good = sorted(p for p in class_dir.iterdir() if p.suffix == ".JPEG")
    kinds = {
        "cmyk": (jpeg_bytes("CMYK", (0, 255, 255, 0)), True),
        "gray": (jpeg_bytes("L", 128), True),
        "png_named_jpeg": (_png(), True),
        "truncated": (good[0].read_bytes()[:300], False),
        "zero_bytes": (b"", False),
        "not_an_image": (b"<html>404 not found</html>", False),
    }
    made = {}
    for i, (kind, (data, decodable)) in enumerate(kinds.items()):
        neighbour = good[i % len(good)]
        path = class_dir / f"{neighbour.stem}_{kind}.JPEG"
        path.write_bytes(data)
        made[path.name] = decodable
    return made


def first_conv_weight(model_state: dict) -> torch.Tensor:
    """The stem's first convolution weight of a model's state_dict (any ResNet's naming)."""
    return next(v for k, v in model_state.items() if k.endswith("weight") and v.dim() == 4)


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pth", map_location="cpu", weights_only=True)


def assert_resume_is_exact(launch, args: List, data: Path, logdir: Path) -> dict:
    """2 epochs straight == its first epoch's checkpoint (kept by --save-every 1) resumed with
    `--resume auto` in a run dir of its own for the second: the checkpoints hold bit-identical
    weights (O2: the fp32 masters) and loss-scaler state. `launch(argv)` runs one training
    command. Returns the straight run's checkpoint. (A run cut short by --epochs and continued
    with a larger one: test_compile.py's first test.)"""
    common = [*args, "--lr-steps", "1", "--logdir", logdir, "--epochs", "2"]
    launch(common + ["--save-every", "1", "--run-name", "straight", data])
    (logdir / "cut").mkdir()
    kept = logdir / "straight" / "checkpoint-epoch0.pth"
    shutil.copyfile(kept, logdir / "cut" / "checkpoint.pth")
    launch(common + ["--run-name", "cut", "--resume", "auto", data])
    straight, resumed = weights(logdir / "straight"), weights(logdir / "cut")
    assert straight["model"].keys() == resumed["model"].keys()
    for name, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    assert straight["precision"] == resumed["precision"]
    assert [e["epoch"] for e in records(logdir / "cut", "train_epoch")] == [1]
    return straight
