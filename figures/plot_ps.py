"""Parameter server vs DDP with a slow worker (launch/bench_ps.py): figures from the JSONL logs.

    python figures/plot_ps.py runs/bench_ps-20261122-150000 --target 80   # -> figures/ps_*.png

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
                       bytes per rank and step (fp32 gradients of the model's parameters; DDP's
                       BatchNorm buffer broadcast from rank 0, under 0.1 % of that, left out)
  comm ratio           PS: comm / (comm + compute + wait) per worker from `worker` records
                       (wait: held at the server for the other workers of a round); DDP: not
                       measured (its log has no per-rank split of compute and all-reduce time)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plot_curves import read  # noqa: E402
from plot_scaling import _save  # noqa: E402  (one figure writer for both)

FIGURES = ("ps_accuracy_time.png", "ps_throughput.png", "ps_traffic.png", "ps_comm_ratio.png")
ORDER = {"ddp": 0, "sync": 1, "async": 2, "esync": 3}


@dataclass
class Contender:
    name: str
    logs: Dict[str, List[dict]]

    @property
    def run(self) -> dict:
        return self.logs["run"][-1]

    @property
    def is_ps(self) -> bool:
        return self.run.get("strategy") == "ps"

    @property
    def key(self) -> str:
        return self.run["mode"] if self.is_ps else self.run.get("entry", "ddp")

    @property
    def label(self) -> str:
        if self.is_ps:
            return f"PS {self.run['mode']}"
        return "DDP (all-reduce)"

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
    found = [Contender(d.name, read(d)) for d in sorted(bench_dir.iterdir())
             if d.is_dir() and (d / "log.jsonl").is_file()]
    found = [c for c in found if "run" in c.logs]
    return sorted(found, key=lambda c: (ORDER.get(c.key, 9), c.name))


def val_curve(c: Contender) -> List[tuple]:
    """(training wall-clock s, epoch, top1, top5) per val record."""
    clock, t = {}, 0.0
    for e in c.logs.get("train_epoch", []):
        t += e["epoch_time"]
        clock[e["epoch"]] = t
    points = []
    for v in c.logs.get("val", []):
        when = v.get("train_elapsed") if c.is_ps else clock.get(v["epoch"])
        if when is not None:
            points.append((when, v["epoch"] + 1, v["top1"], v["top5"]))
    return sorted(points)


def gradient_bytes(c: Contender) -> int:
    """fp32 bytes of the model's parameters (computed from the architecture and class count)."""
    import torchvision

    cfg = c.run["config"]
    if cfg.get("dummy") or cfg.get("data_backend") == "synthetic":
        classes = cfg["synthetic_classes"]
    else:
        classes = sum(1 for d in (Path(cfg["data"]) / "train").iterdir() if d.is_dir())
    model = torchvision.models.get_model(cfg["arch"], weights=None, num_classes=classes)
    return sum(p.numel() for p in model.parameters()) * 4


def summarize(c: Contender, target: Optional[float]) -> dict:
    epochs = c.logs.get("train_epoch", [])
    train_s = sum(e["epoch_time"] for e in epochs)
    samples = sum(e["img_s"] * e["epoch_time"] for e in epochs)
    curve = val_curve(c)
    hit = next((p for p in curve if target is not None and p[2] >= target), None)
    n = c.workers
    row = {"run": c.name, "label": c.label, "key": c.key, "workers": n,
           "slowdowns": c.slowdowns, "epochs": len(epochs), "train_s": train_s,
           "samples_s": samples / train_s if train_s else None,
           "final_top1": curve[-1][2] if curve else None,
           "best_top1": max((p[2] for p in curve), default=None),
           "time_to_target": hit[0] if hit else None, "epoch_to_target": hit[1] if hit else None,
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
            if w.get("local_steps") is not None:
                s["local"].append(w["local_steps"])
            if w.get("staleness") is not None:
                s["stale"].append(w["staleness"])
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
        row["local_steps"] = [sum(s["local"]) / len(s["local"]) if s["local"] else None
                              for _, s in sorted(per.items())] if local else None
        row["staleness"] = [sum(s["stale"]) / len(s["stale"]) if s["stale"] else None
                            for _, s in sorted(per.items())] if stale else None
    else:
        g = gradient_bytes(c)
        b = c.run["config"]["batch_size"]
        steps = epochs[-1]["step"] if epochs else 0
        per_step = 2 * 2 * (n - 1) / n * g  # sent + received by each rank, ring all-reduce
        row["traffic"] = "computed"
        row["gradient_bytes"] = g
        row["per_worker_samples_s"] = [row["samples_s"] / n if row["samples_s"] else None] * n
        row["traffic_mb_s"] = [per_step * steps / 1e6 / train_s if train_s else None] * n
        row["bytes_per_sample"] = [per_step / b] * n
        row["comm_ratio"] = [None] * n
        row["wait_ratio"] = [None] * n
    return row


def parse_target(text) -> Optional[float]:
    """--target: a val top-1 % or 'auto' (None)."""
    return None if text in (None, "auto") else float(text)


def resolve_target(contenders: List[Contender], target: Optional[float]) -> tuple:
    """(target, chosen automatically?). 'auto' (None): the highest multiple of 5 % that every
    contender reached, so each has a time to it."""
    if target is not None:
        return target, False
    bests = [max((p[2] for p in val_curve(c)), default=0.0) for c in contenders]
    return max(5.0, 5.0 * (min(bests) // 5)), True


def hardware(contenders: List[Contender]) -> str:
    run = contenders[0].run
    hw = run["hardware"]
    device = ", ".join(hw["gpus"]) or f"{hw['cpu']} ({hw['cpu_count']} cores, no GPU)"
    return f"{device}, torch {run['versions']['torch']}"


def _grouped(ax, rows: List[dict], key: str, ylabel: str, fmt: str) -> None:
    """One group per contender, one bar per worker; computed (not measured) bars hatched."""
    n = max(len(r[key]) for r in rows)
    width = 0.8 / n
    for i, r in enumerate(rows):
        for w, value in enumerate(r[key]):
            if value is None:
                ax.annotate("n/a", (i + (w - (n - 1) / 2) * width, 0), ha="center",
                            va="bottom", fontsize=6)
                continue
            x = i + (w - (n - 1) / 2) * width
            hatch = "//" if r["traffic"] == "computed" and key in ("traffic_mb_s",
                                                                    "bytes_per_sample") else None
            ax.bar(x, value, width, color=f"C{w}", hatch=hatch,
                   label=f"worker {w + 1} (x{r['slowdowns'][w]:g})" if i == 0 else None)
            ax.annotate(fmt.format(value), (x, value), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(rows)), [r["label"] + (" [computed]" if r["traffic"] == "computed"
                                                   and key in ("traffic_mb_s", "bytes_per_sample")
                                                   else "") for r in rows], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")


def draw(bench_dir: Path, figures: Path, target: Optional[float]) -> List[Path]:
    contenders = load(bench_dir)
    if not contenders:
        raise SystemExit(f"error: no run with a log.jsonl under {bench_dir}")
    target, _ = resolve_target(contenders, target)
    rows = [summarize(c, target) for c in contenders]
    cfg = contenders[0].run["config"]
    slow = ",".join(f"{f:g}" for f in contenders[0].slowdowns)
    title = (f"{bench_dir.name}: {cfg['arch']} {cfg['image_size']} px, -b {cfg['batch_size']} "
             f"per worker, {contenders[0].workers} workers, slowdown {slow} (emulated by sleep)"
             f"\n{hardware(contenders)}")
    out = [figures / f for f in FIGURES]

    fig, ax = plt.subplots(figsize=(8, 5))
    for c in contenders:
        curve = val_curve(c)
        ax.plot([p[0] for p in curve], [p[2] for p in curve], "o-", label=c.label)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g} %")
    ax.set(xlabel="training wall-clock (s): DDP sum of epoch times, PS train_elapsed of the "
                  "evaluated snapshot", ylabel="val top-1 (%)", ylim=(0, 101),
           title="Validation accuracy vs training wall-clock")
    ax.xaxis.label.set_fontsize(7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=7)
    _save(fig, out[0])

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 2]})
    a1.bar(range(len(rows)), [r["samples_s"] or 0 for r in rows], color="tab:gray")
    for i, r in enumerate(rows):
        a1.annotate(f"{r['samples_s'] or 0:.3g}", (i, r["samples_s"] or 0), ha="center",
                    va="bottom", fontsize=7)
    a1.set_xticks(range(len(rows)), [r["label"] for r in rows], fontsize=7, rotation=15)
    a1.set(ylabel="samples/s (all workers)", title="Training samples/s")
    a1.grid(alpha=0.3, axis="y")
    _grouped(a2, rows, "per_worker_samples_s", "samples/s", "{:.3g}")
    a2.set_title("per worker (DDP: synchronous, every rank the same)")
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=7)
    _save(fig, out[1])

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6))
    rows_mb = [{**r, "bytes_per_sample": [x / 1e6 if x is not None else None
                                          for x in r["bytes_per_sample"]]} for r in rows]
    _grouped(a1, rows_mb, "bytes_per_sample", "MB per sample (sent + received)", "{:.2f}")
    a1.set_title("Traffic per worker per training sample", fontsize=9)
    _grouped(a2, rows, "traffic_mb_s", "MB/s (sent + received)", "{:.3g}")
    a2.set_title("Traffic per worker per second of training", fontsize=9)
    a1.legend(fontsize=7)
    fig.suptitle(title + "\nPS: measured by the workers; DDP [computed, hatched]: ring "
                 "all-reduce 2(N-1)/N x fp32 gradient bytes each way per step, not measured",
                 fontsize=7)
    _save(fig, out[2])

    fig, ax = plt.subplots(figsize=(9, 4.8))
    ps_rows = [r for r in rows if r["traffic"] == "measured"]
    n = max((len(r["comm_ratio"]) for r in ps_rows), default=1)
    width = 0.8 / n
    for i, r in enumerate(ps_rows):
        for w in range(len(r["comm_ratio"])):
            x = i + (w - (n - 1) / 2) * width
            comm, wait = r["comm_ratio"][w] or 0, r["wait_ratio"][w] or 0
            ax.bar(x, comm, width, color="tab:orange", label="comm" if i == w == 0 else None)
            ax.bar(x, wait, width, bottom=comm, color="tab:gray",
                   label="wait (for the round's other workers)" if i == w == 0 else None)
            ax.bar(x, 1 - comm - wait, width, bottom=comm + wait, color="tab:blue", alpha=0.5,
                   label="compute (incl. emulated slowdown)" if i == w == 0 else None)
            ax.annotate(f"w{w + 1}\n{comm:.2f}", (x, 1.0), ha="center", va="bottom",
                        fontsize=6)
    ax.set_xticks(range(len(ps_rows)), [r["label"] for r in ps_rows])
    ax.set(ylabel="share of worker time", ylim=(0, 1.18),
           title="PS workers: comm / (comm + compute + wait) (number = comm ratio); DDP: not "
                 "measured")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=7)
    _save(fig, out[3])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("-o", "--figures", type=Path, default=HERE)
    parser.add_argument("--target", type=parse_target, default=None,
                        help="val top-1 %% for time-to-target, or auto (default): the highest "
                             "multiple of 5 %% every contender reached")
    args = parser.parse_args(argv)
    draw(args.bench_dir, args.figures, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
