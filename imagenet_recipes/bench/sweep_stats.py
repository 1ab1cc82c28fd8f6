"""The runs of a strategy sweep (bench.sweep), read from their JSONL logs only, and the numbers
the figures (bench.plot_scaling) and the RESULTS.md tables (bench.results) show.

Every run folder with a log.jsonl under the sweep folder is read; `curves-*` folders are the
learning-curve runs, the others throughput runs. What is computed, and from what:

  img/s            median of the run's `train` interval records after the first (the first holds
                   start-up and warm-up); all processes together. Repeats of a combination
                   (`<combo>-r2`, ...): one row, img/s = median of their img/s, with the lowest
                   and highest as its spread
  workers N        processes that compute: world size for nd/DDP/Horovod, `workers` of the
                   parameter server's run record (it adds one server process)
  efficiency       weak scaling (-b per worker fixed): img/s(N) / (N x img/s(1)) where img/s(1) is
                   the SAME strategy and precision at 1 worker (for a comm hook or compression
                   variant: the plain strategy at 1 worker, which has nothing to compress);
                   `vs nd` uses nd's 1-process img/s instead (fp32 runs only)
  epoch time       EXTRAPOLATED: --epoch-images / img/s (default 1,281,167 = ImageNet-1k train
                   at the sweep's model and image size), not measured
  overhead         1 - step_time(1 worker) / step_time(N): the share of an N-worker step that
                   the 1-worker step does not have (communication plus contention for the cores)
  PS comm share    comm / (comm + compute + wait), summed over the parameter server's `worker`
                   records after the first interval (measured by the workers); wait share the
                   same with wait (a push held at the server until its round is complete)
  learning curves  train (per epoch) and val top-1/top-5 vs epoch and vs training wall-clock:
                   the sum of `train_epoch` epoch_time (validation, checkpoints and start-up
                   excluded); the parameter server evaluates in the background, its val records
                   use train_elapsed (when the evaluated weights were taken)
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from imagenet_recipes.bench.common import CurvePoint, Log, entry_order, epoch_clock, logged_entry, \
    logged_hardware, logged_precision, read_log, run_dirs, steady, strategy_label, val_points
from imagenet_recipes.registry import BASELINE, HOROVOD_COMPRESSION, provides, runs_servers

IMAGENET_TRAIN_IMAGES = 1_281_167


@dataclass
class Run:
    name: str
    logs: Log
    stage: str              # throughput | curves
    entry: str              # the registry's entry script: nd | ddp | ddp_apex | hvd | ps
    workers: int
    processes: int
    precision: str          # e.g. "O0 float32", "O1 bfloat16"
    variant: str            # "" or "fp16 hook", "fp16 compression", ...
    img_s: Optional[float] = None
    step_time: Optional[float] = None
    intervals: int = 0
    ps_comm: Optional[Dict[str, float]] = None

    @property
    def combo(self) -> str:
        return combination(self.name)

    @property
    def run(self) -> dict:
        return self.logs["run"][-1]

    @property
    def family(self) -> str:
        """Strategy and precision: the runs one efficiency curve is drawn through."""
        return f"{strategy_label(self.run)} {self.precision}"

    @property
    def label(self) -> str:
        return f"{self.family}, {self.variant}" if self.variant else self.family


def combination(run_name: str) -> str:
    """The combination a run measures: its name without a repeat suffix (-r2, -r3, ...)."""
    return re.sub(r"-r\d+$", "", run_name)


def load_run(run_dir: Path) -> Optional[Run]:
    logs = read_log(run_dir)
    if "run" not in logs:
        return None
    run = logs["run"][-1]
    cfg = run["config"]
    entry = logged_entry(run)
    servers = runs_servers(entry)
    workers = run.get("workers", run["world_size"]) if servers else run["world_size"]
    variant = ""
    if run.get("comm_hook") not in (None, "none"):
        variant = f"{run['comm_hook']} hook"
    elif cfg.get("fp16_allreduce") and provides(entry, HOROVOD_COMPRESSION):
        variant = "fp16 compression"
    elif servers and run.get("servers", 1) > 1:
        variant = f"{run['servers']} servers"
    r = Run(run_dir.name, logs, "curves" if run_dir.name.startswith("curves-") else "throughput",
            entry, workers, run["world_size"], logged_precision(run), variant)
    train = logs.get("train", [])
    rates, steps = steady(train, "img_s"), steady(train, "step_time")
    r.intervals = len(rates)
    r.img_s = statistics.median(rates) if rates else None
    r.step_time = statistics.median(steps) if steps else None
    if servers:
        first = train[0]["step"] if train else None
        sums = {k: 0.0 for k in ("comm_time", "compute_time", "wait_time")}
        for w in logs.get("worker", []):
            if w["step"] != first:
                for k in sums:
                    sums[k] += w.get(k) or 0.0
        total = sum(sums.values())
        if total > 0:
            r.ps_comm = {**sums, "share": sums["comm_time"] / total,
                         "wait_share": sums["wait_time"] / total}
    return r


def load_sweep(sweep_dir: Path) -> List[Run]:
    runs = [load_run(d) for d in run_dirs(sweep_dir)]
    return sorted((r for r in runs if r is not None),
                  key=lambda r: (r.stage != "throughput", entry_order(r.entry), r.precision,
                                 r.workers, r.variant, r.name))


def baseline(run: Run, runs: List[Run]) -> Optional[Run]:
    """The same strategy and precision at 1 worker, plain (no hook / compression)."""
    for r in runs:
        if (r.stage == "throughput" and r.family == run.family and r.workers == 1
                and not r.variant and r.img_s):
            return r
    return None


def nd_baseline(runs: List[Run]) -> Optional[Run]:
    return next((r for r in runs if r.stage == "throughput" and r.entry == BASELINE and r.img_s),
                None)


def analyze(runs: List[Run], epoch_images: int = IMAGENET_TRAIN_IMAGES) -> List[dict]:
    """One row per throughput combination (its repeats together): the numbers the figures
    and RESULTS.md tables show."""
    nd = nd_baseline(runs)
    groups = _combinations(runs)
    # per combination: median img/s and step time over its repeats
    medians = {combo: (_median_of(x.img_s for x in repeats),
                       _median_of(x.step_time for x in repeats))
               for combo, repeats in groups.items()}
    rows = []
    for combo, repeats in groups.items():
        r = repeats[0]
        rates = [x.img_s for x in repeats if x.img_s is not None]
        img_s, step_time = medians[combo]
        base = baseline(r, runs)
        row = {"run": combo, "label": r.label, "family": r.family, "variant": r.variant,
               "entry": r.entry, "workers": r.workers, "processes": r.processes,
               "precision": r.precision, "img_s": img_s, "repeats": len(rates),
               "img_s_low": min(rates, default=None), "img_s_high": max(rates, default=None),
               "intervals": sum(x.intervals for x in repeats),
               "step_time": step_time, "batch": r.run["config"]["batch_size"],
               "efficiency": None, "efficiency_nd": None, "overhead": None,
               "ps_comm_share": _median_of(x.ps_comm and x.ps_comm["share"] for x in repeats),
               "ps_wait_share": _median_of(x.ps_comm and x.ps_comm["wait_share"]
                                           for x in repeats),
               "epoch_hours": epoch_images / img_s / 3600 if img_s else None}
        base_img_s, base_step = medians[base.combo] if base else (None, None)
        if img_s and base_img_s and r.workers > 1:
            row["efficiency"] = img_s / (r.workers * base_img_s)
            if base_step and step_time:
                row["overhead"] = 1 - base_step / step_time
        nd_img_s = medians[nd.combo][0] if nd else None
        if img_s and nd_img_s and nd.precision == r.precision and r.entry != BASELINE:
            row["efficiency_nd"] = img_s / (r.workers * nd_img_s)
        rows.append(row)
    return rows


def _combinations(runs: List[Run]) -> Dict[str, List[Run]]:
    """The throughput runs by combination, repeats together, in the order of `runs`."""
    groups: Dict[str, List[Run]] = {}
    for r in runs:
        if r.stage == "throughput":
            groups.setdefault(r.combo, []).append(r)
    return groups


def _median_of(values) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def describe_hardware(runs: List[Run]) -> str:
    return logged_hardware(runs[0].run)


def curve_points(logs: Log) -> Dict[str, List[CurvePoint]]:
    """Per-epoch train and val top-1/top-5 with their epoch and training wall-clock."""
    clock = epoch_clock(logs)
    # (a parameter-server epoch that no worker reported in has no accuracy: server.epoch_stats)
    train = [CurvePoint(e["epoch"] + 1, clock[e["epoch"]], e["top1"], e["top5"])
             for e in logs.get("train_epoch", []) if e["top1"] is not None]
    return {"train": train, "val": val_points(logs)}
