"""Parameter server vs DDP with a slow worker (bench.ps): figures from the JSONL logs.

    launch/env.sh python -m imagenet_recipes.bench.plot_ps runs/bench_ps-20261122-150000 --target 80
                                              # -> figures/ps_*.png

The contenders are read and the numbers computed by bench.ps_stats (its docstring says what
each number is and where it comes from); this module only draws them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from imagenet_recipes.bench.common import REPO
from imagenet_recipes.bench.figure import plt, save_figure
from imagenet_recipes.bench.ps_stats import hardware, load, parse_target, resolve_target, summarize, val_curve

FIGURES = ("ps_accuracy_time.png", "ps_throughput.png", "ps_traffic.png", "ps_comm_ratio.png")


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
        ax.plot([p.seconds for p in curve], [p.top1 for p in curve], "o-", label=c.label)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g} %")
    ax.set(xlabel="training wall-clock (s): DDP sum of epoch times, PS train_elapsed of the "
                  "evaluated snapshot", ylabel="val top-1 (%)", ylim=(0, 101),
           title="Validation accuracy vs training wall-clock")
    ax.xaxis.label.set_fontsize(7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=7)
    save_figure(fig, out[0])

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
    save_figure(fig, out[1])

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
    save_figure(fig, out[2])

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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars
    fig.suptitle(title, fontsize=7)
    save_figure(fig, out[3])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_dir", type=Path)
    parser.add_argument("-o", "--figures", type=Path, default=REPO / "figures")
    parser.add_argument("--target", type=parse_target, default=None,
                        help="val top-1 %% for time-to-target, or auto (default): the highest "
                             "multiple of 5 %% every contender reached")
    args = parser.parse_args(argv)
    draw(args.bench_dir, args.figures, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
