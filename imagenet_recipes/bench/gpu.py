"""GPU throughput as a benchmark, not a test: ResNet-50 at 224 px, batch 256, channels_last.

    launch/env.sh python -m imagenet_recipes.bench.gpu --list                     # the units, their rows, groups
    launch/env.sh python -m imagenet_recipes.bench.gpu --group loop    --json runs/bench_gpu/loop.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group compile --json runs/bench_gpu/compile.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group scripts --json runs/bench_gpu/scripts.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group peers --timm train.py \\
        --torchvision vision/references/classification/train.py --json runs/bench_gpu/peers.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --group causes --timm-benchmark benchmark.py \\
        --json runs/bench_gpu/causes.json
    launch/env.sh python -m imagenet_recipes.bench.gpu --device cpu -a resnet18 --image-size 32 -b 4 --steps 2 \\
        --warmup 1 --repeats 2 --amp-dtype bfloat16 --only O1-bf16,ddp-1rank   # the tool, on a CPU

Each group is meant to fit one 10-minute call on one H100 (a GPU machine's limit per command):
loop 1.6 and compile 1.1 minutes as timed on an H100 (scripts, peers and causes by estimate
about 3, 6 and 4 minutes, not yet timed on one); together they measure every row. A unit is one
measurement and gives one or more rows; --only names units (--group and --only together: both
sets), and a unit whose targets or ratios compare with another unit's rows brings that unit
along, so every target of a record is judged within it.

  loop     (bench.bare_loop, in this process) the engine's train step against a hand-written
           PyTorch loop with the same model, precision and optimizer, on the same batches
           already on the GPU, in alternating rounds: O1 and O2, in float16 and bfloat16. The engine is set up
           with the entry scripts' own flags (--dummy --opt-level ... --channels-last).
  compile  the same pair with torch.compile on both sides (--amp-dtype's half type, O1).
  scripts  the entry scripts as users start them, timed from their own interval log lines:
           train/nd.py --dummy (synthetic, the reference of the others); train/ddp.py under
           torchrun with one process (NCCL on a GPU, gloo on a CPU); train/nd.py on generated
           JPEGs with the pytorch loader; the same with --data-backend gpu (TorchCodec's
           nvJPEG, when torchcodec is installed) and with dali-gpu (when nvidia.dali is).
  decode   (bench.decode, in this process) each backend's input pipeline alone, no model: the
           pytorch loader at -j from a few to every core but one (its row: the best), the gpu
           backend with each --gpu-decoder, dali-gpu and dali-cpu, each a batch ready on the
           device, over the loader rows' JPEG set; against the synthetic training rate (target:
           1.5x, room beside the step). CPU cores busy and the JPEG engines' use in the detail.
  peers    this project against timm's train.py and torchvision's reference train.py, end to
           end on the same generated JPEGs, GPU, model, batch, loader workers and epochs, in
           turns: bench.e2e's contenders nd fast (O1 float16, channels_last, the default
           loader), nd gpu decode and nd dali-gpu (where installed), timm fast (--amp
           --channels-last) and torchvision reference (--amp). The peers' scripts are
           fetched by you (--timm, --torchvision; bench.e2e's --help says from where); a
           peer not given is not run. img/s: the steady state (epochs 2 and later); the
           targets compare whole runs, start to exit.
  causes   where a gap between two loops goes (bench.step_variants, in this process): the
           hand-written step with one thing changed, in turns, eager and compiled (no loss
           scaler; timm's benchmark work: no loss scaler and no weight decay; DDP in a world of
           one with torch's defaults, with gradient_as_bucket_view, without the buffer
           broadcast); train/nd.py under torchrun (the launcher without DDP); and timm's own
           benchmark.py --bench train --amp --channels-last, eager and --torchcompile (fetched
           by you: --timm-benchmark), beside the step doing the same work.

img/s: pairs, the median of --repeats rounds of --steps steps after --warmup steps; nd and DDP,
the median of --repeats log intervals of --steps steps after the warm-up interval(s); loaders,
images over seconds across a window of 10 intervals of (workers x prefetch_factor) batches after
the warm-up, so the batches the workers had ready before the clock started are a tenth of the
window at most. Peak memory is torch.cuda.max_memory_allocated (for pairs: each side as if it ran
alone, see imagenet_recipes/bench/bare_loop.py); none on a CPU.

Targets (ResNet-50, one H100): engine O1 float16 >= 3,000 img/s; engine / bare >= 0.97 (each
pair); O2 >= O1 (engine, same half type); DALI GPU >= 0.85 x synthetic (within 15 %); each of
our peers rows end to end >= 1.10x timm's train.py and torchvision's reference (their wall time
over ours, median of the repeats). A missed
target is marked in the output and the record; --strict makes it exit 1.

The record (--json) is rewritten after every unit, so a run killed at a time limit keeps the
rows it finished. bench.regenerate renders RESULTS.md's `gpu` block from the records kept in
results/gpu/*.json (a row measured in several records: the latest).

The processes it starts (torchrun, the trainers and their loader workers) run in process groups
of their own, ended when their run ends or times out (--row-timeout) and when the tool exits or
gets SIGTERM, SIGINT or SIGHUP; the trainers also die with their parent (imagenet_recipes/bench/gpu_entry.py).

Exit status: 0; 1 when a unit failed, or with --strict when a target was missed; 2 on bad
arguments, or with --device cuda where no CUDA GPU is visible.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench import step_variants
from imagenet_recipes.bench.common import (REPO, device_environment, installed, shown_command,
                                           shown_commit)
from imagenet_recipes.bench.render import render

# The targets, by name (--target NAME=VALUE replaces one: the tests make one impossible).
TARGETS = {"img_s": 3000.0, "engine_bare": 0.97, "o2_o1": 1.0, "dali_synthetic": 0.85,
           "gpu_decode_synthetic": 0.98, "vs_timm": 1.10, "vs_torchvision": 1.10,
           "decode_capacity": 1.5, "compiled_img_s": 6000.0}
TARGET_TEXT = {"img_s": "img/s >= {:,.0f}", "engine_bare": "engine/bare >= {:g}",
               "o2_o1": "O2/O1 >= {:g}", "dali_synthetic": "DALI/synthetic >= {:g}",
               "gpu_decode_synthetic": "gpu backend/synthetic >= {:g}",
               "vs_timm": "timm's time/ours end to end >= {:g}",
               "vs_torchvision": "torchvision reference's time/ours end to end >= {:g}",
               "decode_capacity": "decode-only img/s / training img/s (synthetic) >= {:g}",
               "compiled_img_s": "img/s >= {:,.0f} (an H200's target)"}
# The peers unit's rows: bench.e2e's contender -> row
PEER_ROWS = {"nd fast": "peers-nd-fast", "nd gpu decode": "peers-nd-gpu-decode",
             "nd dali-gpu": "peers-nd-dali-gpu", "timm fast": "peers-timm",
             "torchvision reference": "peers-torchvision"}
# timm's benchmark.py rows -> the hand-written step doing the same work
TIMM_BENCHMARK_REFERENCE = {"timm-benchmark": "step-timm-work",
                            "timm-benchmark-compiled": "step-compiled-timm-work"}
# The decode group's rows: bench.decode's row -> row (the pytorch row: its best -j)
DECODE_ROWS = {"pytorch": "decode-pytorch", "gpu torchcodec": "decode-gpu-torchcodec",
               "gpu nvimgcodec": "decode-gpu-nvimgcodec", "dali-gpu": "decode-dali-gpu",
               "dali-cpu": "decode-dali-cpu"}
# The loader rows count over this many intervals of (workers x prefetch_factor) batches.
LOADER_WINDOW = 10
SHORT = {"float16": "fp16", "bfloat16": "bf16"}
DTYPE = {v: k for k, v in SHORT.items()}
RECORD_TOOL = "bench.gpu"


@dataclass(frozen=True)
class Unit:
    name: str
    group: str
    rows: tuple
    what: str
    needs: tuple = ()  # units whose rows this one's ratios and targets refer to


def _units() -> Dict[str, Unit]:
    units = []
    for dtype in ("float16", "bfloat16"):
        for level in ("O1", "O2"):
            name = f"{level}-{SHORT[dtype]}"
            units.append(Unit(name, "loop", (f"bare-{name}", f"engine-{name}"),
                              f"engine vs bare loop, {level} {dtype}",
                              needs=(f"O1-{SHORT[dtype]}",) if level == "O2" else ()))
    units += [
        Unit("compile", "compile", ("bare-compile", "engine-compile"),
             "engine vs bare loop, O1 --amp-dtype, both torch.compile'd"),
        Unit("nd-synthetic", "scripts", ("nd-synthetic",), "train/nd.py --dummy"),
        Unit("ddp-1rank", "scripts", ("ddp-1rank",),
             "torchrun --nproc_per_node=1 train/ddp.py --dummy (NCCL; gloo on a CPU)",
             needs=("nd-synthetic",)),
        Unit("pytorch-loader", "scripts", ("pytorch-loader",),
             "train/nd.py on generated JPEGs, --data-backend pytorch", needs=("nd-synthetic",)),
        Unit("gpu-decode", "scripts", ("gpu-decode",),
             "train/nd.py on generated JPEGs, --data-backend gpu (when torchcodec is installed)",
             needs=("nd-synthetic",)),
        Unit("gpu-decode-nvimgcodec", "scripts", ("gpu-decode-nvimgcodec",),
             "train/nd.py on generated JPEGs, --data-backend gpu --gpu-decoder nvimgcodec",
             needs=("nd-synthetic",)),
        Unit("gpu-decode-nvimgcodec-compile", "scripts", ("gpu-decode-nvimgcodec-compile",),
             "the same with --compile", needs=("nd-synthetic",)),
        Unit("dali-gpu", "scripts", ("dali-gpu",),
             "train/nd.py on generated JPEGs, --data-backend dali-gpu (when installed)",
             needs=("nd-synthetic",)),
        Unit("decode-only", "decode", tuple(DECODE_ROWS.values()),
             "bench.decode: each backend's input pipeline alone, a batch ready on the device, "
             "against the synthetic training rate", needs=("nd-synthetic",)),
        Unit("peers", "peers", tuple(PEER_ROWS.values()),
             "bench.e2e: train/nd.py against timm's and torchvision's train.py on the same "
             "generated JPEGs"),
        Unit("step-eager", "causes", tuple(v.name for v in step_variants.EAGER),
             "the hand-written step with one thing changed, in turns: no loss scaler, "
             "timm's benchmark work, DDP in a world of one and its options"),
        Unit("step-compiled", "causes", tuple(v.name for v in step_variants.COMPILED),
             "the same, torch.compile'd: no loss scaler, timm's benchmark work"),
        Unit("nd-torchrun", "causes", ("nd-torchrun",),
             "torchrun --nproc_per_node=1 train/nd.py --dummy: the launcher, no DDP",
             needs=("nd-synthetic",)),
        Unit("timm-benchmark", "causes", ("timm-benchmark", "timm-benchmark-compiled"),
             "timm's benchmark.py --bench train --amp --channels-last, eager and "
             "--torchcompile (--timm-benchmark)", needs=("step-eager", "step-compiled")),
    ]
    return {u.name: u for u in units}


UNITS = _units()
GROUPS = list(dict.fromkeys(u.group for u in UNITS.values()))
ROW_ORDER = [row for u in UNITS.values() for row in u.rows]


class Failure(Exception):
    """A unit could not measure (its message says why)."""


class Skip(Exception):
    """A unit cannot run here (DALI missing, a GPU loader on a CPU)."""


# --- the command line ---------------------------------------------------------------------------
def parse_cli(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m imagenet_recipes.bench.gpu", description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a check of the tool itself with a tiny configuration "
                        "(default: %(default)s)")
    p.add_argument("-a", "--arch", default="resnet50", help="(default: %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="(default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=256, help="(default: %(default)s)")
    p.add_argument("--steps", type=int, default=20,
                   help="steps per round (pairs) and per log interval (nd, DDP) "
                        "(default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed steps first (scripts: rounded up to whole intervals, at least "
                        "one) (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds / intervals; img/s is their median "
                        "(default: %(default)s)")
    p.add_argument("--amp-dtype", default="float16", choices=("float16", "bfloat16"),
                   help="half type of the compile pair and of the entry scripts' rows "
                        "(default: %(default)s)")
    p.add_argument("-j", "--workers", type=int, default=None,
                   help="loader workers (DALI: threads) of the loader rows (default: the "
                        "engine's own choice for one process)")
    p.add_argument("--group", help=f"comma-separated groups: {', '.join(GROUPS)} (default, "
                   "without --only: all)")
    p.add_argument("--only", help="comma-separated units (see --list); with --group, both")
    p.add_argument("--list", action="store_true", help="print the units and exit")
    p.add_argument("--target", action="append", default=[], metavar="NAME=VALUE",
                   help=f"replace a target ({', '.join(f'{k}={v:g}' for k, v in TARGETS.items())})")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", type=Path, metavar="PATH", help="the record (rewritten after "
                   "each unit)")
    p.add_argument("--out", type=Path, help="the runs and their console output (default: "
                   "runs/bench_gpu-DATE-TIME)")
    p.add_argument("--data", type=Path, help="the generated JPEG set of the loader rows "
                   "(default: runs/bench_gpu-data/<size>; made once, reused)")
    p.add_argument("--prepare-data", action="store_true",
                   help="only make the loader rows' JPEG set (at --data) and exit: beside "
                        "another job, before the measurements that read it")
    p.add_argument("--row-timeout", type=float, default=360,
                   help="seconds an entry script's run may take (default: %(default)s)")
    p.add_argument("--commit", help="the commit measured, for a copied tree without .git "
                   "(default: git's)")
    p.add_argument("--timm-benchmark", type=Path, metavar="PATH",
                   help="timm's benchmark.py, fetched by you (the timm-benchmark unit)")
    peers = p.add_argument_group("peers (bench.e2e)")
    peers.add_argument("--timm", type=Path, help="timm's train.py, fetched by you")
    peers.add_argument("--torchvision", type=Path,
                       help="torchvision's references/classification/train.py, fetched by you "
                            "with the modules beside it")
    peers.add_argument("--peers-data", type=Path,
                       help="an ImageFolder root with train/ and val/ (default: bench.e2e "
                            "generates 10 classes x (--peers-train-per-class + 50) JPEGs)")
    peers.add_argument("--peers-train-per-class", type=int, default=800,
                       help="(default: %(default)s)")
    peers.add_argument("--peers-epochs", type=int, default=3,
                       help="3 or more gives the steady state (default: %(default)s)")
    peers.add_argument("--peers-repeats", type=int, default=2, help="(default: %(default)s)")
    peers.add_argument("--peers-only", help="comma-separated contenders of ours to run beside "
                       f"the peers ({', '.join(c for c in PEER_ROWS if c.startswith('nd '))}; "
                       "default: all that can run here)")
    peers.add_argument("--peers-timeout", type=float, default=540,
                       help="seconds the whole comparison may take (default: %(default)s)")
    args = p.parse_args(argv)
    from imagenet_recipes.bench import bare_loop as loop  # torch, like every measurement after the parse

    loop.check_sizes(p, args)
    if args.peers_only and not set(args.peers_only.split(",")) <= {
            c for c in PEER_ROWS if c.startswith("nd ")}:
        p.error(f"--peers-only {args.peers_only}: contenders are "
                f"{', '.join(c for c in PEER_ROWS if c.startswith('nd '))}")
    if args.workers is not None and args.workers <= 0:
        p.error("--workers must be positive (the loader rows measure worker processes)")
    args.targets = dict(TARGETS)
    for item in args.target:
        name, _, value = item.partition("=")
        if name not in TARGETS:
            p.error(f"--target {item}: unknown target {name!r} ({', '.join(TARGETS)})")
        try:
            args.targets[name] = float(value)
        except ValueError:
            p.error(f"--target {item}: {value!r} is not a number")
    try:
        args.units = select(args.group, args.only)
    except ValueError as err:
        p.error(str(err))
    return args


def select(groups: Optional[str], only: Optional[str]) -> List[str]:
    """The units to run, in their canonical order, with the units they need."""
    def names(text: Optional[str]) -> List[str]:
        return [w.strip() for w in (text or "").split(",") if w.strip()]

    bad = [g for g in names(groups) if g not in GROUPS]
    if bad:
        raise ValueError(f"--group: unknown {', '.join(bad)} (groups: {', '.join(GROUPS)})")
    bad = [u for u in names(only) if u not in UNITS]
    if bad:
        raise ValueError(f"--only: unknown {', '.join(bad)} (units: {', '.join(UNITS)})")
    wanted = {u.name for u in UNITS.values() if u.group in names(groups)} | set(names(only))
    if not (groups or only):
        wanted = set(UNITS)
    for name in list(wanted):
        wanted |= set(UNITS[name].needs)
    return [name for name in UNITS if name in wanted]


def list_units() -> None:
    for group in GROUPS:
        print(f"{group}:")
        for u in UNITS.values():
            if u.group == group:
                needs = f" (brings {', '.join(u.needs)})" if u.needs else ""
                print(f"  {u.name:<15} {u.what}; rows {', '.join(u.rows)}{needs}")


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


def _stop_on_signal(signum, frame) -> None:
    CHILDREN.stop_all()
    raise SystemExit(128 + signum)


# --- the environment ----------------------------------------------------------------------------
# --- the rows -----------------------------------------------------------------------------------
def new_row(name: str, unit: str, config: str, img_s: Optional[float] = None,
            repeats: Sequence[float] = (), reference: Optional[str] = None,
            peak_bytes: Optional[int] = None, **detail) -> dict:
    return {"name": name, "unit": unit, "status": "ok", "config": config, "img_s": img_s,
            "repeats": list(repeats), "reference": reference, "ratio": None,
            "peak_bytes": peak_bytes, "targets": [], "note": "", "detail": detail}


def workload(args: argparse.Namespace, level: str, dtype: str) -> str:
    return (f"{args.arch} {args.image_size} px, batch {args.batch_size}, channels_last, "
            f"{level} {dtype}")


def reference_of(row: str) -> Optional[str]:
    """The row a row's ratio compares with (what its method differs from in one thing)."""
    if row.startswith("engine-"):
        return "bare-" + row[len("engine-"):]
    if row in ("ddp-1rank", "dali-gpu", "nd-torchrun", *LOADER_FLAGS):
        return "nd-synthetic"
    if row.startswith("peers-nd-"):
        return "peers-timm"
    if row in DECODE_ROWS.values():
        return "nd-synthetic"
    for variants in step_variants.SETS.values():
        if row in [v.name for v in variants[1:]]:
            return variants[0].name
    return TIMM_BENCHMARK_REFERENCE.get(row)


def target_specs(row: dict, ok: Dict[str, dict]) -> List[tuple]:
    """(target name, the value it judges) for a row: its targets, from its own numbers and
    the other rows of the same record. None: a reference is missing, not assessed."""
    name, specs = row["name"], []
    if name == "engine-O1-fp16":
        specs.append(("img_s", row["img_s"]))
    if name.startswith("engine-"):
        specs.append(("engine_bare", row["ratio"]))
    if name in ("engine-O2-fp16", "engine-O2-bf16"):
        o1 = ok.get(name.replace("O2", "O1"))
        specs.append(("o2_o1", row["img_s"] / o1["img_s"] if o1 else None))
    if name == "dali-gpu":
        specs.append(("dali_synthetic", row["ratio"]))
    if name.startswith("gpu-decode"):
        specs.append(("gpu_decode_synthetic", row["ratio"]))
    if name == "gpu-decode-nvimgcodec-compile":
        specs.append(("compiled_img_s", row["img_s"]))
    if name in DECODE_ROWS.values():
        specs.append(("decode_capacity", row["ratio"]))
    if name.startswith("peers-nd-"):
        end_to_end = row["detail"]["end_to_end"]
        specs += [("vs_timm", end_to_end.get("timm fast")),
                  ("vs_torchvision", end_to_end.get("torchvision reference"))]
    return specs


def assess(rows: List[dict], targets: Dict[str, float]) -> None:
    """Ratios and target verdicts of every row, from the rows' img/s (in place)."""
    ok = {r["name"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        row["ratio"], row["targets"] = None, []
        if row["status"] != "ok":
            continue
        ref = ok.get(row["reference"])
        if ref:
            row["ratio"] = row["img_s"] / ref["img_s"]
        for name, value in target_specs(row, ok):
            row["targets"].append({"name": name, "text": TARGET_TEXT[name].format(targets[name]),
                                   "min": targets[name], "value": value,
                                   "met": None if value is None else value >= targets[name]})


def missed(rows: List[dict]) -> List[str]:
    return [f"{r['name']}: {t['text']} ({_number(t['value'])})" for r in rows
            for t in r["targets"] if t["met"] is False]


# --- the pairs: bench.bare_loop in this process ----------------------------------------------
@contextlib.contextmanager
def loop_trainer(args: argparse.Namespace, level: str, dtype: str, compile_: bool):
    """(bench.bare_loop's arguments, a Trainer set up as the entry scripts set it up, batches
    already on its device) for this tool's sizes, channels_last; the trainer is closed when the
    block ends. A configuration the trainer refuses fails the unit with its message."""
    from imagenet_recipes.bench import bare_loop as loop
    from imagenet_recipes.config import UsageError

    largs = loop.parse_cli([
        "-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
        "--opt-level", level, "--amp-dtype", dtype, "--device", args.device, "--channels-last",
        *(["--compile"] if compile_ else [])])
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as logdir:
        try:
            trainer = loop.build_trainer(largs, logdir)
        except UsageError as err:
            raise Failure(str(err)) from None
        try:
            yield largs, trainer, loop.make_batches(
                max(args.steps, args.warmup), args.batch_size, args.image_size,
                trainer.num_classes, trainer.device, True)
        finally:
            trainer.close()


def release_device(device: str) -> None:
    """What a unit measured in this process is gone before the next one starts."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_pair(args: argparse.Namespace, unit: Unit, level: str, dtype: str,
                 compile_: bool) -> List[dict]:
    from imagenet_recipes.bench import bare_loop as loop

    with loop_trainer(args, level, dtype, compile_) as (largs, trainer, batches):
        bare = loop.BareLoop(trainer)
        print(f"{'round':>6} {'engine img/s':>13} {'bare img/s':>11} {'engine/bare':>12}",
              flush=True)
        rounds = loop.measure(largs, trainer, bare, batches)
        weight_diff = loop.max_weight_difference(trainer.strategy.module, bare.model)
    del trainer, bare, batches
    release_device(args.device)

    def peak(side: str) -> Optional[int]:
        values = [r[f"{side}_peak_bytes"] for r in rounds if f"{side}_peak_bytes" in r]
        return max(values) if values else None

    config = workload(args, level, dtype) + (", torch.compile" if compile_ else "")
    bare_name, engine_name = unit.rows
    return [
        new_row(bare_name, unit.name, f"bare PyTorch loop: {config}",
                statistics.median(r["bare_img_s"] for r in rounds),
                [r["bare_img_s"] for r in rounds], peak_bytes=peak("bare")),
        new_row(engine_name, unit.name, f"engine (Trainer.train_step): {config}",
                statistics.median(r["engine_img_s"] for r in rounds),
                [r["engine_img_s"] for r in rounds], reference=bare_name,
                peak_bytes=peak("engine"), round_ratios=[r["ratio"] for r in rounds],
                max_weight_diff=weight_diff),
    ]


def measure_variants(args: argparse.Namespace, unit: Unit) -> List[dict]:
    """bench.step_variants in this process: the step with one thing changed, O1 in
    --amp-dtype, each variant against the unit's first (its reference)."""
    compiled = unit.name == "step-compiled"
    variants = step_variants.SETS["compiled" if compiled else "eager"]
    with loop_trainer(args, "O1", args.amp_dtype, compiled) as (largs, trainer, batches):
        results = step_variants.measure(largs, trainer, variants, batches)
    del trainer, batches
    release_device(args.device)
    config = workload(args, "O1", args.amp_dtype) + (", torch.compile" if compiled else "")
    return [new_row(r["name"], unit.name, f"{r['what']}: {config}", r["img_s"], r["repeats"],
                    reference=r["reference"], max_weight_diff=r["max_weight_diff"])
            for r in results]


# --- the entry scripts --------------------------------------------------------------------------
class Context:
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
    torchrun = entry == "ddp" or launcher == "torchrun"
    launched = ("torchrun --nproc_per_node=1 " if torchrun else "") + f"train/{entry}.py"
    return [new_row(unit.rows[0], unit.name,
                    f"{launched} --dummy: {workload(args, 'O1', args.amp_dtype)}, "
                    f"{run['world_size']} process{backend}",
                    statistics.median(i["img_s"] for i in window),
                    [i["img_s"] for i in window], reference=reference_of(unit.rows[0]),
                    peak_bytes=peak, backend=run.get("backend"),
                    warmup_steps=warm * args.steps)]


def prefetch_factor() -> int:
    """Batches each DataLoader worker keeps ready: the pytorch backend leaves torch's default,
    read here from torch itself (building a DataLoader starts no worker)."""
    from torch.utils.data import DataLoader

    return DataLoader(range(1), num_workers=1).prefetch_factor


def loader_workers(args: argparse.Namespace) -> int:
    """-j of the loader rows: --workers, else what the engine picks for one process (-j -1)."""
    if args.workers:
        return args.workers
    from imagenet_recipes.data.loading import default_workers

    return default_workers(1)


# Validation images per class of the generated set: the peers' runs validate on them
# (bench.e2e's --val-per-class), so one set serves the loader rows and the peers (--peers-data).
JPEG_SET_VAL = 50


def jpeg_set(args: argparse.Namespace) -> Path:
    """Generated JPEGs (data/make_synthetic.py) for the loader rows' training images, of
    ImageNet-like sizes (about 1.4x to 2.2x the crop: 314-493 px for 224), 10 classes; made once
    and reused (make_synthetic.py skips a complete identical set)."""
    from imagenet_recipes.bench.jobs import dataset_command, make_dataset

    per_class = math.ceil(loader_steps(args)[1] * args.batch_size / 10)
    low, high = round(args.image_size * 1.4), round(args.image_size * 2.2)
    root = args.data or REPO / "runs" / "bench_gpu-data" / f"{low}-{high}px-{per_class}"
    print(f"JPEG set: {10 * per_class} training images at {low}-{high} px in {root}", flush=True)
    make_dataset(dataset_command(root, classes=10, train=per_class, val=JPEG_SET_VAL,
                                 min_size=low, max_size=high, workers=None))
    return root


def loader_steps(args: argparse.Namespace) -> tuple:
    """(warm-up intervals, steps) of a loader row. One interval is as many batches as the
    workers may hold ready at once; the window is LOADER_WINDOW of them, so a full prefetch
    buffer at the start is at most a tenth of it."""
    per = loader_workers(args) * prefetch_factor()
    warm = max(1, math.ceil(args.warmup / per))
    return warm, per * (warm + LOADER_WINDOW)


# The loader rows' --data-backend
LOADER_FLAGS = {"pytorch-loader": ["--data-backend", "pytorch"],
                "gpu-decode": ["--data-backend", "gpu"],
                "gpu-decode-nvimgcodec": ["--data-backend", "gpu", "--gpu-decoder", "nvimgcodec"],
                "gpu-decode-nvimgcodec-compile": ["--data-backend", "gpu", "--gpu-decoder",
                                                  "nvimgcodec", "--compile"],
                "dali-gpu": ["--data-backend", "dali-gpu"]}
# What a loader row's flags need installed
LOADER_NEEDS = {"gpu": "torchcodec", "nvimgcodec": "nvidia.nvimgcodec", "dali-gpu": "nvidia.dali"}


def measure_loader(ctx: Context, unit: Unit, backend_flags: List[str]) -> List[dict]:
    """nd.py on generated JPEGs: images over seconds across LOADER_WINDOW log intervals of
    (workers x prefetch_factor) batches each, after the warm-up interval(s)."""
    args = ctx.args
    backend = backend_flags[1]
    if backend.startswith("dali") and args.device != "cuda":
        raise Skip("dali-gpu decodes on a GPU: not with --device cpu")
    decoder = (backend_flags[backend_flags.index("--gpu-decoder") + 1]
               if "--gpu-decoder" in backend_flags else backend)
    module = LOADER_NEEDS.get(decoder)
    if module and not installed(module):
        raise Skip(f"{module} is not installed")
    workers, prefetch = loader_workers(args), prefetch_factor()
    per = workers * prefetch
    warm, steps = loader_steps(args)
    data = jpeg_set(args)
    flags = [*common_flags(args), *backend_flags, "-j", str(workers), "-p", str(per),
             "--steps-per-epoch", str(steps), str(data)]
    log, peak = run_entry(ctx, unit.name, "nd", flags)
    window = intervals(log)[warm:]
    counted = sum(i["steps"] for i in window)
    if counted < LOADER_WINDOW * per:
        raise Failure(f"only {counted} batches after the warm-up, expected "
                      f"{LOADER_WINDOW * per}")
    img_s = sum(i["images"] for i in window) / sum(i["seconds"] for i in window)
    label = ("thread" if backend.startswith("dali") else "worker") + "s" * (workers > 1)
    return [new_row(unit.rows[0], unit.name,
                    f"train/nd.py {' '.join(backend_flags)}, generated JPEGs, {workers} loader "
                    f"{label}: {workload(args, 'O1', args.amp_dtype)}", img_s,
                    [i["img_s"] for i in window], reference=reference_of(unit.rows[0]),
                    peak_bytes=peak, workers=workers, prefetch_factor=prefetch,
                    warmup_batches=warm * per, window_batches=counted, data=str(data))]


# --- timm's benchmark.py ------------------------------------------------------------------------
def timm_benchmark_rate(output: str) -> float:
    """train_samples_per_sec from the JSON benchmark.py prints after its `--result` line."""
    _, marker, tail = output.rpartition("--result\n")
    if not marker:
        raise Failure("benchmark.py printed no --result")
    try:
        return float(json.loads(tail)["train_samples_per_sec"])
    except (ValueError, KeyError, TypeError) as err:
        raise Failure(f"benchmark.py's result unreadable: {err}") from None


def measure_timm_benchmark(ctx: Context, unit: Unit) -> List[dict]:
    """timm's own train-step benchmark (eager, then --torchcompile) on this tool's model,
    batch, size, half type and classes, each a process of its own: what timm measures as a
    training step, beside the hand-written step doing the same work (step-timm-work)."""
    args = ctx.args
    if not args.timm_benchmark:
        raise Skip("timm's benchmark.py not given (--timm-benchmark)")
    from imagenet_recipes.config import TrainConfig

    steps = args.steps * args.repeats
    base = [sys.executable, str(args.timm_benchmark.resolve()), "--bench", "train",
            "--model", args.arch, "--amp", "--amp-dtype", args.amp_dtype, "--channels-last",
            "-b", str(args.batch_size), "--img-size", str(args.image_size),
            "--num-classes", str(TrainConfig.synthetic_classes), "--device", args.device,
            "--num-warm-iter", str(args.warmup), "--num-bench-iter", str(steps), "--no-retry"]
    rows = []
    for row, extra in zip(unit.rows, ([], ["--torchcompile"])):
        run_logged(ctx, row, "benchmark.py", base + extra, args.row_timeout, dict(os.environ))
        rate = timm_benchmark_rate((ctx.out / f"{row}.console.txt").read_text(errors="replace"))
        shown = " ".join(["benchmark.py", *base[2:], *extra])
        rows.append(new_row(row, unit.name, f"timm {shown}", rate, [rate],
                            reference=reference_of(row)))
    return rows


# --- decode capacity: bench.decode, in this process ---------------------------------------------
def measure_decode(ctx: Context, unit: Unit) -> List[dict]:
    """bench.decode's rows over the loader rows' JPEG set, at this tool's batch and size; the
    pytorch backend's row is its best -j, every -j's rate in its detail."""
    from imagenet_recipes.bench import decode

    args = ctx.args
    dargs = argparse.Namespace(data=jpeg_set(args), device=args.device,
                               batch_size=args.batch_size, image_size=args.image_size,
                               batches=max(3 * args.steps, 10), only=None,
                               workers=str(args.workers) if args.workers else None)
    measured = decode.measure(dargs)
    rows = []
    for backend, name in DECODE_ROWS.items():
        found = [r for r in measured if r["backend"] == backend]
        ok = [r for r in found if r["status"] == "ok"]
        config = f"bench.decode {backend}: {args.batch_size} x {args.image_size} px"
        if not ok:
            status = found[0]["status"] if found else "skipped"
            rows.append(dict(new_row(name, unit.name, config), status=status,
                             note=found[0].get("detail", "") if found else ""))
            continue
        best = max(ok, key=lambda r: r["img_s"])
        rows.append(new_row(name, unit.name, f"{config}, -j {best['workers']}", best["img_s"],
                            reference=reference_of(name), workers=best["workers"],
                            cores_busy=best["cores_busy"], jpeg_engines=best["jpeg_engines"],
                            by_workers={r["workers"]: round(r["img_s"], 1) for r in ok}))
    return rows


# --- the peers: bench.e2e -----------------------------------------------------------------------
def measure_peers(ctx: Context, unit: Unit) -> List[dict]:
    """bench.e2e as its own process (its contenders in turns, each started as a user starts
    it), then its record turned into rows: steady-state img/s, and for ours the end-to-end
    ratios against each peer (their wall time over ours, median of the repeats)."""
    args = ctx.args
    scripts = [(flag, path) for flag, path in (("--timm", args.timm),
                                                ("--torchvision", args.torchvision)) if path]
    if not scripts:
        raise Skip("no peer script given (--timm, --torchvision)")
    record_path = ctx.out / "peers.json"
    cmd = [sys.executable, "-m", "imagenet_recipes.bench.e2e",
           *([str(args.peers_data)] if args.peers_data else []),
           *[str(w) for flag, path in scripts for w in (flag, path.resolve())],
           "-a", args.arch, "-b", str(args.batch_size), "-j", str(loader_workers(args)),
           "--epochs", str(args.peers_epochs), "--repeats", str(args.peers_repeats),
           "--train-per-class", str(args.peers_train_per_class), "--val-per-class", "50",
           "--fast-amp", "on" if args.device == "cuda" else "off",
           "--json", str(record_path), "--only", *peer_contenders(args)]
    # --device cpu on a machine with a GPU: the contenders see none, as on a CPU machine
    env = {**os.environ, **({} if args.device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""})}
    run_logged(ctx, "peers", "bench.e2e", cmd, args.peers_timeout, env)
    return peer_rows(json.loads(record_path.read_text()), unit)


def peer_contenders(args: argparse.Namespace) -> List[str]:
    """bench.e2e's contenders to run: ours that --peers-only names (all without it), and every
    peer whose script was given."""
    ours = [c for c in PEER_ROWS if c.startswith("nd ")]
    return [c for c in PEER_ROWS if c not in ours or not args.peers_only
            or c in args.peers_only.split(",")]


def _against(ratios: Dict[tuple, List[float]], contender: str) -> Dict[str, float]:
    """bench.e2e's ratios of `contender` against each other contender: their median."""
    return {theirs: statistics.median(v) for (ours, theirs), v in ratios.items()
            if ours == contender}


def peer_rows(record: dict, unit: Unit) -> List[dict]:
    """bench.e2e's record -> the peers unit's rows, one per contender (one it did not run:
    skipped, saying why)."""
    from imagenet_recipes.bench import e2e

    train_images = record["images"]["train"]
    wall = e2e.ratios(record)
    steady = e2e.ratios(record, steady=True)
    cfg = record["config"]
    rows = []
    for contender, row_name in PEER_ROWS.items():
        runs = [r for r in record["runs"] if r["contender"] == contender]
        rates = [rate for rate in (e2e.steady_img_s(r, train_images) for r in runs) if rate]
        if not rates:
            why = ("not run: " + ("its script was not given" if not contender.startswith("nd")
                                  else "its data backend is not installed here"))
            rows.append(dict(new_row(row_name, unit.name, contender), status="skipped",
                             note=why))
            continue
        config = (f"{record['commands'][contender]}: {cfg['epochs']} epochs of "
                  f"{train_images} generated JPEGs, {cfg['workers']} loader workers")
        rows.append(new_row(
            row_name, unit.name, config, statistics.median(rates), rates,
            reference=reference_of(row_name),
            wall_s=statistics.median(r["wall"] for r in runs),
            end_to_end=_against(wall, contender), steady_vs=_against(steady, contender)))
    return rows


# --- running ------------------------------------------------------------------------------------
def measure(ctx: Context, unit: Unit) -> List[dict]:
    args = ctx.args
    if unit.group == "loop":
        level, short = unit.name.split("-")
        return measure_pair(args, unit, level, DTYPE[short], compile_=False)
    if unit.name == "compile":
        return measure_pair(args, unit, "O1", args.amp_dtype, compile_=True)
    if unit.name == "nd-synthetic":
        return measure_synthetic(ctx, unit, "nd")
    if unit.name == "ddp-1rank":
        return measure_synthetic(ctx, unit, "ddp")
    if unit.name == "peers":
        return measure_peers(ctx, unit)
    if unit.name == "decode-only":
        return measure_decode(ctx, unit)
    if unit.group == "causes":
        if unit.name == "nd-torchrun":
            return measure_synthetic(ctx, unit, "nd", launcher="torchrun")
        if unit.name == "timm-benchmark":
            return measure_timm_benchmark(ctx, unit)
        return measure_variants(args, unit)
    return measure_loader(ctx, unit, LOADER_FLAGS[unit.name])


def run_unit(ctx: Context, unit: Unit) -> List[dict]:
    """The unit's rows; a unit that fails or cannot run here gives rows saying so, and the
    others still run."""
    print(f"\n== {unit.name}: {unit.what}", flush=True)
    started = time.perf_counter()
    try:
        rows = measure(ctx, unit)
    except Skip as why:
        rows = [dict(new_row(r, unit.name, unit.what), status="skipped", note=str(why))
                for r in unit.rows]
    except Failure as why:
        rows = [dict(new_row(r, unit.name, unit.what), status="failed", note=str(why))
                for r in unit.rows]
    except Exception as err:  # a unit that breaks is a failed unit; the next may still run
        note = f"{type(err).__name__}: {err}"
        rows = [dict(new_row(r, unit.name, unit.what), status="failed", note=note[:500])
                for r in unit.rows]
    seconds = time.perf_counter() - started
    for row in rows:
        row["seconds"] = seconds
    return rows


def _number(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"


def _memory(peak: Optional[int]) -> str:
    return "n/a" if peak is None else f"{peak / 2**30:.1f} GiB"


def verdicts(row: dict) -> str:
    marks = {True: "met", False: "MISSED", None: "not assessed (reference not measured)"}
    return "; ".join(f"{t['text']}: {marks[t['met']]}" for t in row["targets"])


def print_row(row: dict) -> None:
    if row["status"] != "ok":
        print(f"{row['name']:<16} {row['status'].upper()}: {row['note']}", flush=True)
        return
    text = f"{row['name']:<16} {row['img_s']:>9,.1f} img/s"
    if row["ratio"] is not None:
        text += f"  {row['ratio']:.3f}x {row['reference']}"
    text += f"  peak {_memory(row['peak_bytes'])}"
    if row["targets"]:
        text += f"  [{verdicts(row)}]"
    print(text, flush=True)


def write_record(path: Path, record: dict) -> None:
    """Whole or not at all: a kill while writing leaves the previous version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(record, indent=2) + "\n")
    scratch.replace(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_cli(argv)
    if args.list:
        list_units()
        return 0
    if args.prepare_data:
        jpeg_set(args)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu: no CUDA GPU is visible (torch.cuda.is_available() is False); "
              "--device cpu checks the tool itself", file=sys.stderr)
        return 2
    from imagenet_recipes.bench.common import git_commit

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop_on_signal)
    atexit.register(CHILDREN.stop_all)

    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or REPO / "runs" / f"bench_gpu-{stamp:%Y%m%d-%H%M%S}"
    ctx = Context(args, out)
    given = list(sys.argv[1:] if argv is None else argv)
    # --commit only names what a copied tree cannot tell: not part of the measurement
    shown = [a for i, a in enumerate(given) if not (a.startswith("--commit") or (
        i and given[i - 1] == "--commit"))]
    record = {"tool": RECORD_TOOL, "command": shown_command("gpu", shown),
              "commit": args.commit or git_commit(),
              "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
              "environment": device_environment(args.device),
              "config": {k: getattr(args, k) for k in (
                  "device", "arch", "image_size", "batch_size", "steps", "warmup", "repeats",
                  "amp_dtype", "workers")},
              "targets": args.targets, "units": args.units, "complete": False, "seconds": 0.0,
              "rows": []}
    env = record["environment"]
    print(f"bench.gpu: {env['gpu'] or 'CPU'} | cpu {env['cpu']} ({env['cpu_cores']} cores) | "
          f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}; units: "
          f"{', '.join(args.units)}; output in {out}", flush=True)
    rows: List[dict] = []
    try:
        for name in args.units:
            rows += run_unit(ctx, UNITS[name])
            assess(rows, args.targets)
            for row in rows:
                if row["unit"] == name:
                    print_row(row)
            record.update(rows=rows, seconds=time.perf_counter() - started)
            if args.json:
                write_record(args.json, record)
        record["complete"] = True
    finally:
        record.update(rows=rows, seconds=time.perf_counter() - started)
        if args.json:
            write_record(args.json, record)
        CHILDREN.stop_all()

    failed = [r["name"] for r in rows if r["status"] == "failed"]
    misses = missed(rows)
    print(f"\nbench.gpu: {len(rows)} rows in {record['seconds'] / 60:.1f} min; "
          f"{len(failed)} failed; {len(misses)} target(s) missed"
          + (f" (record: {args.json})" if args.json else ""))
    for text in misses:
        print(f"  TARGET MISSED  {text}")
    if failed:
        return 1
    return 1 if misses and args.strict else 0


# --- RESULTS.md ---------------------------------------------------------------------------------
def records(folder: Path) -> List[tuple]:
    """(file name, record) of the bench.gpu records in `folder`, oldest first."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and record.get("tool") == RECORD_TOOL:
            found.append((path.name, record))
    return sorted(found, key=lambda item: (item[1]["date"], item[0]))


def block(folder: Path, figures: Optional[Path] = None) -> str:
    """RESULTS.md's `gpu` block from the records in `folder` (results/gpu/): every row once,
    from the latest record that measured it; or, without a record, a plain statement that none
    exists."""
    kept = records(folder)
    if not kept:
        return render("gpu", records=None)
    latest: Dict[str, tuple] = {}
    for i, (_, record) in enumerate(kept, 1):
        for row in record["rows"]:
            latest[row["name"]] = (i, row)
    order = {name: n for n, name in enumerate(ROW_ORDER)}
    shown = sorted(latest.values(), key=lambda item: order.get(item[1]["name"], len(order)))
    used = []  # the records some row comes from: (number, file name, record, versions)
    for i in sorted({i for i, _ in shown}):
        name, record = kept[i - 1]
        env = record["environment"]
        used.append((i, name, record, ", ".join(
            f"{k} {env[k]}" for k in ("torch", "cuda", "cudnn", "nccl", "nvidia-dali")
            if env.get(k))))
    table = []
    for i, row in shown:
        name = f"{row['name']} [{i}]"  # [i]: the record it comes from, listed above
        if row["status"] != "ok":
            table.append([name, row["config"], f"{row['status']}: {row['note']}".replace(
                "|", "/"), "", "", "", ""])
            continue
        ratio = (f"{row['ratio']:.3f}x {row['reference']}" if row["ratio"] is not None
                 else "")
        marks = {True: "met", False: "**MISSED**", None: "not assessed"}
        targets = "; ".join(f"{t['text']}: {marks[t['met']]}" for t in row["targets"])
        spread = (f"{min(row['repeats']):,.0f}-{max(row['repeats']):,.0f}" if row["repeats"]
                  else "")
        table.append([name, row["config"], targets or "-", f"{row['img_s']:,.1f}", ratio,
                      _memory(row["peak_bytes"]), spread])
    causes = any(UNITS.get(row["unit"]) and UNITS[row["unit"]].group == "causes"
                 for _, row in shown)
    return render("gpu", records=used, rows=table, causes=causes,
                  met=sum(t["met"] is True for _, r in shown for t in r["targets"]),
                  missed=sum(t["met"] is False for _, r in shown for t in r["targets"]),
                  shown_commit=shown_commit)


if __name__ == "__main__":
    sys.exit(main())
