"""The parameter-server benchmark's contenders (bench.ps), read from their JSONL logs only, and
the numbers its figures (bench.plot_ps) and RESULTS.md table (bench.results) show.

Every run folder with a log.jsonl under the folder is one contender (DDP, PS sync/async/esync).
What is computed, and from what:

  training wall-clock  DDP: the sum of `train_epoch` epoch_time up to that epoch (validation,
                       checkpoints and start-up excluded); PS: the val record's train_elapsed (the
                       time since all workers registered at which the evaluated weights were
                       taken; evaluation runs in the background on the server)
  time to target       training wall-clock of the first val record with top-1 >= --target
                       (auto: the highest multiple of 5 % that every contender reached)
  samples/s            all train samples / training wall-clock (train_epoch records); per worker:
                       PS `worker` records (samples / interval seconds); DDP is synchronous, so
                       every rank does the same (total / ranks)
  traffic per worker   PS: MEASURED, the workers' cumulative bytes_pushed + bytes_pulled
                       (parameters or gradients or deltas, plus BatchNorm buffers); DDP: COMPUTED,
                       not measured: a ring all-reduce sends and receives 2(N-1)/N x gradient
                       bytes per rank and all-reduce (one per step; local SGD: all_reduces())
                       (fp32 gradients of the model's parameters; DDP's
                       BatchNorm buffer broadcast from rank 0, under 0.1 % of that, left out)
  comm ratio           PS: comm / (comm + compute + wait) per worker from `worker` records
                       (wait: held at the server for the other workers of a round); DDP: not
                       measured (its log has no per-rank split of compute and all-reduce time)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from imagenet_recipes.bench.common import CurvePoint, Log, entry_order, logged_entry, \
    logged_hardware, ps_rule, read_log, run_dirs, strategy_label, val_points

from imagenet_recipes.ps.options import MODES
from imagenet_recipes.registry import runs_servers

@dataclass
class Contender:
    name: str
    logs: Log

    @property
    def run(self) -> dict:
        return self.logs["run"][-1]

    @property
    def is_ps(self) -> bool:
        return runs_servers(logged_entry(self.run))

    @property
    def key(self) -> str:
        return self.run["mode"] if self.is_ps else self.run.get("entry", "ddp")

    @property
    def variant(self) -> str:
        """The mode with the rule it ran (async-plain, esync-normalized, ...); sync and DDP
        as `key`."""
        rule = ps_rule(self.run) if self.is_ps else None
        return f"{self.key}-{rule}" if rule else self.key

    @property
    def label(self) -> str:
        label = strategy_label(self.run)
        return label if self.is_ps else f"{label} (all-reduce)"

    @property
    def workers(self) -> int:
        return self.run["workers"] if self.is_ps else self.run["world_size"]

    @property
    def slowdowns(self) -> List[float]:
        if self.run.get("slowdowns"):
            return list(self.run["slowdowns"])
        text = self.run["config"].get("worker_slowdown")
        return [float(x) for x in text.split(",")] if text else [1.0] * self.workers


def load(bench_dir: Path) -> List[Contender]:
    found = [Contender(d.name, read_log(d)) for d in run_dirs(bench_dir)]
    found = [c for c in found if "run" in c.logs]
    return sorted(found, key=_order)


def _order(c: Contender) -> tuple:
    """DDP first (the registry's order), then the server's modes in the engine's order."""
    entry = logged_entry(c.run)
    mode = MODES.index(c.key) if c.key in MODES else len(MODES)
    return entry_order(entry), mode, c.name


def val_curve(c: Contender) -> List[CurvePoint]:
    """The val points that have a training wall-clock, in its order: time to target is that of
    the first one over the target."""
    timed = [p for p in val_points(c.logs) if p.seconds is not None]
    return sorted(timed, key=lambda p: (p.seconds, p.epoch))


def gradient_bytes(c: Contender) -> int:
    """fp32 bytes of the model's parameters (computed from the architecture and class count)."""
    import torchvision

    cfg = c.run["config"]
    if "num_classes" in c.run:
        classes = c.run["num_classes"]
    elif cfg.get("dummy") or cfg.get("data_backend") == "synthetic":
        classes = cfg["synthetic_classes"]
    else:  # logs from before the run record had num_classes: count the data set's folders
        classes = sum(1 for d in (Path(cfg["data"]) / "train").iterdir() if d.is_dir())
    model = torchvision.models.get_model(cfg["arch"], weights=None, num_classes=classes)
    return sum(p.numel() for p in model.parameters()) * 4


def all_reduces(cfg: dict, steps: int, epochs: int) -> int:
    """Gradient-sized all-reduces of a DDP run: one per step; with --local-sgd-period H one per
    warm-up step, one per H local steps and two per epoch (before validation and the checkpoint
    the models, then the momentum buffers, are averaged: at most that)."""
    period = cfg.get("local_sgd_period") or 0
    if not period:
        return steps
    warmup = min(cfg.get("local_sgd_warmup_steps", 0), steps)
    return warmup + (steps - warmup) // period + 2 * epochs


def _mean(weighted: List[tuple]) -> Optional[float]:
    """The mean over intervals of (mean, intervals) pairs; None without any."""
    count = sum(n for _, n in weighted)
    return sum(v * n for v, n in weighted) / count if count else None


def summarize(c: Contender, target: Optional[float]) -> dict:
    epochs = c.logs.get("train_epoch", [])
    train_s = sum(e["epoch_time"] for e in epochs)
    samples = sum(e["img_s"] * e["epoch_time"] for e in epochs)
    curve = val_curve(c)
    hit = next((p for p in curve if target is not None and p.top1 >= target), None)
    n = c.workers
    row = {"run": c.name, "label": c.label, "key": c.key, "workers": n,
           "slowdowns": c.slowdowns, "epochs": len(epochs), "train_s": train_s,
           "samples_s": samples / train_s if train_s else None,
           "final_top1": curve[-1].top1 if curve else None,
           "best_top1": max((p.top1 for p in curve), default=None),
           "time_to_target": hit.seconds if hit else None,
           "epoch_to_target": hit.epoch if hit else None,
           "per_worker_samples_s": [], "traffic_mb_s": [], "bytes_per_sample": [],
           "comm_ratio": [], "wait_ratio": [], "traffic": "measured",
           "local_steps": None, "staleness": None}
    if c.is_ps:
        per: Dict[int, dict] = {}
        for w in c.logs.get("worker", []):
            s = per.setdefault(w["worker"], {"samples": 0, "seconds": 0.0, "comm": 0.0,
                                             "compute": 0.0, "wait": 0.0, "bytes": 0.0,
                                             "local": [], "stale": []})
            s["samples"] += w["samples"]
            s["seconds"] += w.get("seconds") or 0.0
            s["comm"] += w["comm_time"]
            s["compute"] += w["compute_time"]
            s["wait"] += w["wait_time"]
            s["bytes"] = w["bytes_pushed"] + w["bytes_pulled"]  # cumulative
            # (mean, intervals): a record kept in results/ holds the mean of several
            # intervals (imagenet_recipes.bench.kept)
            if w.get("local_steps") is not None:
                s["local"].append((w["local_steps"], w.get("local_steps_intervals", 1)))
            if w.get("staleness") is not None:
                s["stale"].append((w["staleness"], w.get("staleness_intervals", 1)))
        for w in sorted(per):
            s = per[w]
            busy = s["comm"] + s["compute"] + s["wait"]
            row["per_worker_samples_s"].append(s["samples"] / train_s if train_s else None)
            row["traffic_mb_s"].append(s["bytes"] / 1e6 / train_s if train_s else None)
            row["bytes_per_sample"].append(s["bytes"] / s["samples"] if s["samples"] else None)
            row["comm_ratio"].append(s["comm"] / busy if busy else None)
            row["wait_ratio"].append(s["wait"] / busy if busy else None)
        local = [x for s in per.values() for x in s["local"]]
        stale = [x for s in per.values() for x in s["stale"]]
        row["local_steps"] = [_mean(s["local"]) for _, s in sorted(per.items())] if local else None
        row["staleness"] = [_mean(s["stale"]) for _, s in sorted(per.items())] if stale else None
    else:
        g = gradient_bytes(c)
        b = c.run["config"]["batch_size"]
        steps = epochs[-1]["step"] if epochs else 0
        per_step = 2 * 2 * (n - 1) / n * g  # sent + received by each rank, ring all-reduce
        exchanges = all_reduces(c.run["config"], steps, len(epochs))
        row["traffic"] = "computed"
        row["gradient_bytes"] = g
        row["per_worker_samples_s"] = [row["samples_s"] / n if row["samples_s"] else None] * n
        row["traffic_mb_s"] = [per_step * exchanges / 1e6 / train_s if train_s else None] * n
        row["bytes_per_sample"] = [per_step * exchanges / (steps * b) if steps else None] * n
        row["comm_ratio"] = [None] * n
        row["wait_ratio"] = [None] * n
    return row


def parse_target(text) -> Optional[float]:
    """--target (an argparse type): a val top-1 % or 'auto' (None)."""
    if text in (None, "auto"):
        return None
    try:
        return float(text)
    except ValueError:
        # argparse shows this message as it is (a plain ValueError would read "invalid
        # parse_target value")
        raise argparse.ArgumentTypeError(f"takes a percentage or auto, got {text!r}") from None


def resolve_target(contenders: List[Contender], target: Optional[float]) -> tuple:
    """(target, chosen automatically?). 'auto' (None): the highest multiple of 5 % that every
    contender reached, so each has a time to it."""
    if target is not None:
        return target, False
    bests = [max((p.top1 for p in val_curve(c)), default=0.0) for c in contenders]
    return max(5.0, 5.0 * (min(bests) // 5)), True


def hardware(contenders: List[Contender]) -> str:
    return logged_hardware(contenders[0].run)
