"""What the GPU tier's checks share: the device they run on, the entry scripts run as users run
them, and where their output goes.

    GPU_TIER_DEVICE  cuda (default) or cpu: cpu runs every check on the CPU (gloo, bfloat16 and
                     emulated float16), a simulation of the tier that CI runs
    GPU_TIER_OUT     a folder for the record: checks.jsonl (one line per finished check, written
                     when it finishes), output.log (every run's output) and runs.jsonl (every
                     run's log records). Without it nothing is kept.

Each run starts in a process group of its own but in the tier's session, and whatever is left of
a run (torchrun's ranks, which it starts in sessions of their own, and their loader workers
included) is killed when the run ends, and when the tier ends, is interrupted or is stopped by
a time limit: nothing it started outlives it.

In the simulation the runs are forked, where gpu_check.sh --cpu has started a fork server and
named its socket in FORKED_RANKS_SOCKET (`python tests/gpu/gpu_tier.py serve SOCKET`;
tests/forked_ranks.py): one interpreter that has imported torch, torchvision, timm and the
package, of which each group's pytest, each run (`python SCRIPT`) and each of its ranks (as
`torchrun --standalone` starts them) is a fork. A rank's imports cost 6-7 CPU-seconds on a
CPU, its tiny run a fraction of one. A check that acts on torchrun's own processes (its ranks'
pids, its exit summary) starts torchrun itself (Run's `torchrun=True`), as every run does on a
GPU, and so does a run whose environment sets what an interpreter reads at its start. A forked
run ends with the process that asked for it, so the kills above reach it too.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "train"

DEVICE = os.environ.get("GPU_TIER_DEVICE", "cuda")
SIMULATED = DEVICE == "cpu"
OUT = Path(os.environ["GPU_TIER_OUT"]) if os.environ.get("GPU_TIER_OUT") else None
FIRST_OF_EACH = os.environ.get("GPU_TIER_FIRST_OF_EACH") == "1"  # gpu_check.sh --first-of-each

# Small runs: on a GPU, torchvision's resnet18 at 64 px is enough to exercise every kernel
# family of ResNet; on a CPU the simulation shrinks the images and the steps, and trains timm's
# test_resnet (0.37M parameters): its float16 steps, emulated on a CPU, cost 0.1 s where
# resnet18's cost 4-5 s, and the simulation checks the tier's checks, not the kernels.
ARCH = "timm/test_resnet" if SIMULATED else "resnet18"
IMAGE = "32" if SIMULATED else "64"
BATCH = "8" if SIMULATED else "16"
STEPS = "3" if SIMULATED else "6"
# Loader workers on a GPU, as users run it; the simulation loads in the trainer, which spares
# each rank a fork server that imports torch and torchvision (the CPU tests of loader workers
# are in tests/test_fault_tolerance.py and tests/test_training.py).
WORKERS = "0" if SIMULATED else "2"
SMALL = ["-a", ARCH, "--image-size", IMAGE, "-b", BATCH, "-j", WORKERS, "-p", "1",
         "--epochs", "1", "--steps-per-epoch", STEPS, "--device", DEVICE]
# Two ranks on the tier's one device: on a GPU, --share-gpus (gloo carries the CUDA tensors,
# since NCCL refuses two ranks on one GPU); on the CPU it changes nothing.
SHARED = ["--share-gpus"]
# What each rank's environment holds beyond the caller's: one compute thread per rank on the
# CPU (the simulation runs on small machines), deterministic cuBLAS for the exactness checks.
RUN_ENV = {"OMP_NUM_THREADS": "1" if SIMULATED else os.environ.get("OMP_NUM_THREADS", "4"),
           "PYTHONWARNINGS": "ignore", "PYTHONFAULTHANDLER": "1"}

# The fork server of the simulation's runs (gpu_check.sh --cpu starts it)
FORKED = SIMULATED and bool(os.environ.get("FORKED_RANKS_SOCKET"))
FORKED_RANKS = REPO / "tests" / "forked_ranks.py"

_live_groups: Dict[int, str] = {}  # pid (= its group's id) -> run name, of runs not yet ended


# --- the record ----------------------------------------------------------------------------------
def append(name: str, record: dict) -> None:
    """One JSON line onto OUT/name, flushed at once (a run stopped at its time limit keeps every
    line written before)."""
    if OUT is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / name, "a") as f:
        f.write(json.dumps(record) + "\n")


def keep_output(run: str, cmd: Sequence[str], text: str, limit: int = 200) -> None:
    """A run's output onto OUT/output.log, its last `limit` lines (the useful end: a traceback or
    the final records)."""
    if OUT is None:
        return
    lines = text.splitlines()
    cut = f"[... {len(lines) - limit} lines ...]\n" if len(lines) > limit else ""
    with open(OUT / "output.log", "a") as f:
        f.write(f"===== {run}: {' '.join(map(str, cmd))}\n{cut}"
                + "\n".join(lines[-limit:]) + "\n")


def keep_run_log(run: str, run_dir: Path) -> None:
    """A run's log records onto OUT/runs.jsonl, each with the run's name (no checkpoints)."""
    log = run_dir / "log.jsonl"
    if OUT is None or not log.is_file():
        return
    with open(OUT / "runs.jsonl", "a") as f:
        for line in log.read_text().splitlines():
            try:
                f.write(json.dumps({"run": run, **json.loads(line)}) + "\n")
            except json.JSONDecodeError:  # a run killed mid-write leaves a partial last line
                continue


# --- the processes -------------------------------------------------------------------------------
def kill_tree(pid: int) -> None:
    """SIGKILL a run's process and everything below it. A group kill is not enough: torchrun
    starts each rank in a session of its own, and its loader workers (and their fork server) in
    that rank's group, so each group met on the way down is killed."""
    found, stack = [pid], [pid]
    while stack:  # first the whole tree: a killed parent's children move to init
        below = children(stack.pop())
        found += below
        stack += below
    groups = set()
    for p in found:
        try:
            groups.add(os.getpgid(p))
        except ProcessLookupError:
            pass
    for target in groups:
        try:
            os.killpg(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in found:  # in a group of someone else's (never ours: none of them shares it)
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_live_groups() -> None:
    for pid in list(_live_groups):
        kill_tree(pid)
        _live_groups.pop(pid, None)


atexit.register(kill_live_groups)


def command(script: str, args: Sequence, nproc: int = 0, own: bool = False) -> List[str]:
    """`python SCRIPT ARGS`, or torchrun's `nproc` ranks of it; forked from the simulation's
    server where it runs one, unless `own` asks for the run's own processes."""
    program = [str(TRAIN / script)] + [str(a) for a in args]
    if FORKED and not own:
        forked = forked_ranks()
        return forked.command(nproc, program, forked.unused_port() if nproc else 0)
    # torchrun passes SIGUSR1 (the preemption warning) on to the ranks, as
    # launch/torchrun_single.sh has it do
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={nproc}",
                 "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
                if nproc else [sys.executable])
    return launcher + program


def forked_ranks():
    """tests/forked_ranks.py (tests/ is on sys.path under pytest: its conftest is there)."""
    import forked_ranks as module

    return module


def serve(socket_path: str) -> None:
    """The simulation's fork server (gpu_check.sh --cpu): tests/forked_ranks.py's, started
    with RUN_ENV, which holds variables read at an interpreter's start or import, so they are
    the server's (and its forks'). It ends when its stdin closes."""
    os.environ.update(RUN_ENV)
    os.execv(sys.executable, [sys.executable, str(FORKED_RANKS), "server", socket_path])


class Run:
    """An entry script started in the background: `python train/X.py` or torchrun."""

    def __init__(self, runs: Path, name: str, script: str, args: Sequence, nproc: int = 0,
                 env: Optional[dict] = None, torchrun: bool = False):
        self.name, self.dir = name, runs / name
        # its own processes where it acts on torchrun's or sets what a fork would not get
        own = torchrun or (FORKED and bool(forked_ranks().import_time_names(env)))
        self.cmd = command(script, [*args, "--logdir", runs, "--run-name", name], nproc, own)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=REPO, process_group=0,
                                     env={**os.environ, **RUN_ENV, **(env or {})})
        _live_groups[self.proc.pid] = name
        self.output: List[str] = []

    def lines(self):
        """The run's output, line by line, as it comes (kept for output.log)."""
        for line in self.proc.stdout:
            self.output.append(line)
            yield line

    def finish(self, timeout: float, expect: Optional[int] = 0) -> str:
        """Wait for the end (`expect`: its exit status, None for any) -> its whole output."""
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._end()
            raise AssertionError(f"{self.name}: still running after {timeout:.0f} s") from None
        finally:
            self._end()
        text = "".join(self.output) + (rest or "")
        self.output = []
        keep_output(self.name, self.cmd, text)
        keep_run_log(self.name, self.dir)
        if expect is not None and self.proc.returncode != expect:
            last = [line for line in text.splitlines() if line.strip()][-3:] or ["(no output)"]
            raise AssertionError(f"{self.name}: exit {self.proc.returncode} (expected {expect}): "
                                 + " | ".join(line[:300] for line in last))
        return text

    def _end(self) -> None:
        """Kill whatever of the run is left (loader workers a finished run orphaned too)."""
        kill_tree(self.proc.pid)
        self.proc.wait()
        _live_groups.pop(self.proc.pid, None)


def train(runs: Path, name: str, script: str, args: Sequence, nproc: int = 0,
          timeout: float = 300, env: Optional[dict] = None, expect: Optional[int] = 0) -> dict:
    """Run an entry script to its end -> its log records by kind."""
    Run(runs, name, script, args, nproc, env).finish(timeout, expect)
    return read_log(runs / name)


def one_process_loaders(cfg, device):
    """-> (train, val, classes): the loaders of a one-process run of `cfg` on `device`, built
    as its entry script builds them."""
    from imagenet_recipes.data import build_loaders
    from imagenet_recipes.options import LoaderOptions, PlanOptions
    from imagenet_recipes.run_plan import plan_run
    from imagenet_recipes.strategies import Strategy

    return build_loaders(LoaderOptions.of(cfg), Strategy().data_shard(), device,
                         plan_run(PlanOptions.of(cfg), 1, device.type))


def read_log(run_dir: Path) -> Dict[str, List[dict]]:
    from imagenet_recipes.bench.common import read_log as read

    return read(run_dir)


# --- what the checks assert ----------------------------------------------------------------------
def finite_losses(log: dict) -> List[float]:
    losses = [r["loss"] for r in log.get("train", [])]
    assert losses, "no training step was logged"
    assert all(math.isfinite(x) for x in losses), f"non-finite loss: {losses}"
    return losses


def on_device(log: dict) -> str:
    device = log["run"][0].get("device", "")
    assert device.startswith(DEVICE), f"ran on {device!r}, not {DEVICE}"
    return device


def expected_backend() -> str:
    return "gloo" if SIMULATED else "nccl"


def wait_for_step(run: Run, step: int, epoch: int = 0) -> None:
    """Read the run's output until its progress line for `step` of `epoch` has passed."""
    marker = f"Epoch [{epoch}]["
    for line in run.lines():
        if marker in line and line.split(marker)[1].split("/")[0].strip() == str(step):
            return
    raise AssertionError(f"{run.name}: ended before step {step}")


def children(pid: int) -> List[int]:
    """The direct children of a process (from /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(p) for p in path.read_text().split()]
    except OSError:
        return []


def rank_of(pid: int) -> Optional[int]:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def elapsed(since: float) -> float:
    return time.perf_counter() - since


def need(module: str, why: str) -> None:
    """Skip the check, saying what to install, when an optional package is missing."""
    import pytest

    from imagenet_recipes.bench.common import installed

    if not installed(module):
        pytest.skip(f"{module} is not installed: {why}")


def broken_decoders() -> dict:
    """The GPU decoders that tools/gpu_session.sh's probe found broken here, with the cause:
    GPU_TIER_BROKEN_DECODERS, one NAME=CAUSE a line."""
    lines = os.environ.get("GPU_TIER_BROKEN_DECODERS", "").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def need_decoder(name: str, module: str, why: str) -> None:
    """Skip the check when the GPU decoder `name` is not installed, or was found broken by the
    probe (a crash or a hang there would cost the whole group its time)."""
    import pytest

    need(module, why)
    cause = broken_decoders().get(name)
    if cause is not None:
        pytest.skip(f"the probe found --gpu-decoder {name} broken here: {cause}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/gpu/gpu_tier.py serve SOCKET")
    serve(sys.argv[2])
