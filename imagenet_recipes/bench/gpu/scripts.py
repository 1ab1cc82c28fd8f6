"""The processes bench.gpu starts, and the entry scripts' rows: each script run as a user runs it
(train/nd.py, train/ddp.py under torchrun with one process), timed from its own interval log
lines, its peak memory read through bench.gpu_entry.

Every process started here leads a process group of its own, ended when its run ends or times out
(--row-timeout) and when the tool exits or gets SIGTERM, SIGINT or SIGHUP; the trainers also die
with their parent (imagenet_recipes/bench/gpu_entry.py)."""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from imagenet_recipes.bench.common import REPO
from imagenet_recipes.bench.gpu.units import Failure, Unit, new_row, reference_of, workload
from imagenet_recipes.registry import ENTRIES


# --- child processes ----------------------------------------------------------------------------
class Children:
    """The processes this tool started, each the leader of a process group of its own, so that
    one signal reaches everything it started (torchrun, the trainer, its loader workers). Every
    group is ended when its run ends, on a timeout, and when the tool itself ends or is told
    to stop (SIGTERM, SIGINT, SIGHUP): none outlives the tool."""

    def __init__(self) -> None:
        self.live: set = set()

    def run(self, cmd: List[str], timeout: float, **kwargs) -> int:
        proc = subprocess.Popen(cmd, start_new_session=False, process_group=0, **kwargs)
        self.live.add(proc)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"still running after {timeout:.0f} s (--row-timeout): stopped")
        finally:
            self.stop(proc)

    def stop(self, proc: subprocess.Popen, grace: float = 10.0) -> None:
        """SIGTERM to the group (torchrun passes it on to its ranks and waits for them), then
        SIGKILL to whatever is left of it; also after a clean exit, for stragglers."""
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal(proc, signal.SIGKILL)
        proc.wait()
        self.live.discard(proc)

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        for proc in list(self.live):
            self.stop(proc, grace=5.0)


CHILDREN = Children()


def stop_on_signal(signum, frame) -> None:
    """The tool's handler of SIGTERM, SIGINT and SIGHUP: its children first, then exit 128+N."""
    CHILDREN.stop_all()
    raise SystemExit(128 + signum)


# --- the entry scripts --------------------------------------------------------------------------
class Context:
    """A run of the tool: its arguments, its output folder and the runs' log folder in it."""

    def __init__(self, args: argparse.Namespace, out: Path):
        self.args, self.out = args, out
        self.runs = out / "runs"


def run_logged(ctx: Context, name: str, what: str, cmd: List[str], timeout: float,
               env: Dict[str, str]) -> None:
    """`cmd` from the repository root, its output into <out>/<name>.console.txt; a non-zero
    exit fails the unit with the output's last lines."""
    console = ctx.out / f"{name}.console.txt"
    ctx.out.mkdir(parents=True, exist_ok=True)
    print(f"$ {' '.join(cmd)}", flush=True)
    with open(console, "w") as output:
        code = CHILDREN.run(cmd, timeout, cwd=REPO, env=env, stdout=output,
                            stderr=subprocess.STDOUT)
    if code != 0:
        tail = [line for line in console.read_text(errors="replace").splitlines()
                if line.strip()][-3:]
        raise Failure(f"{what} exit {code}: {' / '.join(tail)[-400:]} (console: {console})")


def run_entry(ctx: Context, name: str, entry: str, flags: List[str],
              launcher: Optional[str] = None) -> tuple:
    """An entry script run as a user runs it (torchrun with one process for DDP; `launcher`
    overrides the registry's), through bench.gpu_entry for its peak memory. -> (its log
    records by kind, peak bytes or None)."""
    from imagenet_recipes.bench.common import read_log, registry

    e = registry().ENTRIES[entry]
    wrapped = ["-m", "imagenet_recipes.bench.gpu_entry", str(REPO / e.script)]
    if (launcher or e.launcher) == "python":
        cmd = [sys.executable, *wrapped]
    else:  # torchrun: the launcher the registry names for ddp
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=1", *wrapped]
    cmd += [*flags, "--logdir", str(ctx.runs), "--run-name", name]
    peak_file = ctx.out / f"{name}.peak"
    run_logged(ctx, name, e.script, cmd, ctx.args.row_timeout,
               {**os.environ, "BENCH_GPU_PEAK": str(peak_file)})
    peak_path = Path(f"{peak_file}.0")
    peak = json.loads(peak_path.read_text())["peak_bytes"] if peak_path.is_file() else None
    return read_log(ctx.runs / name), peak


def intervals(log: dict) -> List[dict]:
    """The logged training intervals: steps, images, seconds and img/s of each."""
    found, last = [], 0
    for r in log.get("train", []):
        steps = r["epoch_step"] - last
        last = r["epoch_step"]
        seconds = r["step_time"] * steps
        found.append({"steps": steps, "images": r["count"], "seconds": seconds,
                      "img_s": r["count"] / seconds})
    return found


def common_flags(args: argparse.Namespace) -> List[str]:
    return ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
            "--opt-level", "O1", "--amp-dtype", args.amp_dtype, "--channels-last",
            "--device", args.device, "--epochs", "1"]


def measure_synthetic(ctx: Context, unit: Unit, entry: str,
                      launcher: Optional[str] = None) -> List[dict]:
    """nd.py or DDP on one process, --dummy: the median img/s of --repeats log intervals of
    --steps steps, after the warm-up interval(s) (start-up, cuDNN's autotuning). `launcher`
    "torchrun": nd.py started as DDP is, without DDP."""
    args = ctx.args
    warm = max(1, math.ceil(args.warmup / args.steps))
    flags = [*common_flags(args), "--dummy", "-p", str(args.steps),
             "--synthetic-train-size", str(args.batch_size * args.steps * (warm + args.repeats)),
             "--synthetic-val-size", str(args.batch_size)]
    log, peak = run_entry(ctx, unit.name, entry, flags, launcher)
    window = intervals(log)[warm:]
    if len(window) < args.repeats:
        raise Failure(f"{len(window)} timed intervals logged, expected {args.repeats}")
    run = log["run"][0]
    backend = f", {run['backend']}" if run.get("backend") else ""
    torchrun = (launcher or ENTRIES[entry].launcher) == "torchrun"
    launched = ("torchrun --nproc_per_node=1 " if torchrun else "") + f"train/{entry}.py"
    return [new_row(unit.rows[0], unit.name,
                    f"{launched} --dummy: {workload(args, 'O1', args.amp_dtype)}, "
                    f"{run['world_size']} process{backend}",
                    statistics.median(i["img_s"] for i in window),
                    [i["img_s"] for i in window], reference=reference_of(unit.rows[0]),
                    peak_bytes=peak, backend=run.get("backend"),
                    warmup_steps=warm * args.steps)]
