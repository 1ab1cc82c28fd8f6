"""Scaling figures of a strategy sweep (bench.sweep), drawn from the runs' JSONL logs only.

    launch/env.sh python -m bench.plot_scaling runs/sweep-20261122-140000   # figures/scaling_*.png
    launch/env.sh python -m bench.plot_scaling runs/sweep-X --curves runs/quickstart-*
                                                  # ... with the learning curves of other runs

The runs are read and the numbers computed by bench.sweep_stats (its docstring says what each
number is and where it comes from); this module only draws them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from bench.common import REPO
from bench.figure import plt, save_figure
from bench.sweep_stats import IMAGENET_TRAIN_IMAGES, Run, analyze, curve_points, \
    describe_hardware, load_run, load_sweep

FIGURES = ("scaling_throughput.png", "scaling_efficiency.png", "scaling_epoch_time.png",
           "scaling_comm_share.png", "scaling_curves.png")


# --- figures --------------------------------------------------------------------------------------
def _colors(labels: List[str]) -> Dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


FAMILY_COLORS: Dict[str, str] = {}  # one colour per strategy and precision in every figure


def _family_color(family: str) -> str:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if family not in FAMILY_COLORS:
        FAMILY_COLORS[family] = cycle[len(FAMILY_COLORS) % len(cycle)]
    return FAMILY_COLORS[family]


def plot_throughput(rows: List[dict], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        mine = [r for r in rows if r["label"] == label and r["img_s"]]
        base = next((r for r in rows if r["family"] == mine[0]["family"] and r["workers"] == 1
                     and not r["variant"] and r["img_s"]), None) if mine else None
        points = sorted({r["workers"]: r["img_s"] for r in mine + ([base] if base else [])
                         }.items())
        if not points:
            continue
        xs, ys = zip(*points)
        color = _family_color(mine[0]["family"])
        ax.plot(xs, ys, "s--" if mine[0]["variant"] else "o-", color=color, label=label)
        if base and mine[0]["variant"] == "" and max(xs) > 1:  # ideal: N x the 1-worker rate
            ax.plot(xs, [base["img_s"] * x for x in xs], ":", color=color, alpha=0.7)
    ax.plot([], [], "k:", label="ideal linear (N x own 1-worker img/s)")
    workers = sorted({r["workers"] for r in rows})
    ax.set_xticks(workers)
    ax.set(xlabel="workers N (PS: + 1 server process)", ylabel="img/s (all workers)",
           title="Throughput vs workers (weak scaling, median of steady intervals)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def _bars(ax, rows: List[dict], key: str, fmt: str = "{:.2f}") -> None:
    labels = [f"{r['label']}\nN={r['workers']}" for r in rows]
    values = [r[key] for r in rows]
    bars = ax.bar(range(len(rows)), values, color=[_family_color(r["family"]) for r in rows],
                  hatch=None)
    for b, r in zip(bars, rows):
        if r["variant"]:
            b.set_hatch("//")  # a comm hook / compression variant of the strategy
    for b, v in zip(bars, values):
        ax.annotate(fmt.format(v), (b.get_x() + b.get_width() / 2, v), ha="center",
                    va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=6.5, rotation=20, ha="right")
    ax.set_xlim(-0.7, max(len(rows), 4) - 0.3)  # a lone bar stays bar-sized
    ax.grid(alpha=0.3, axis="y")


def plot_efficiency(rows: List[dict], title: str, path: Path) -> None:
    multi = [r for r in rows if r["efficiency"] is not None]
    fig, ax = plt.subplots(figsize=(8, 4.6))
    if multi:
        _bars(ax, multi, "efficiency")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="tab:red", ls="--", lw=0.8, label="target 0.90")
    ax.set(ylabel="img/s(N) / (N x img/s(1))", ylim=(0, 1.15),
           title="Weak-scaling efficiency vs the same strategy's 1-worker run")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def plot_epoch_time(rows: List[dict], title: str, path: Path, epoch_images: int) -> None:
    have = [r for r in rows if r["epoch_hours"]]
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    if have:
        _bars(ax, have, "epoch_hours", "{:.1f} h")
    ax.set_yscale("log")  # emulated bf16 is ~24x slower than fp32 here
    ax.set(ylabel="hours per epoch (log scale)",
           title=f"Time per epoch, EXTRAPOLATED: {epoch_images:,} images / steady img/s "
                 "(not measured)")
    ax.title.set_fontsize(9)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def plot_comm_share(rows: List[dict], title: str, path: Path) -> None:
    multi = [r for r in rows if r["overhead"] is not None or r["ps_comm_share"] is not None]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    width = 0.4
    for i, r in enumerate(multi):
        if r["overhead"] is not None:
            ax.bar(i - width / 2, r["overhead"], width, color="tab:blue",
                   label="overhead vs 1 worker: 1 - step(1)/step(N)" if i == 0 else None)
            ax.annotate(f"{r['overhead']:.2f}", (i - width / 2, max(r["overhead"], 0)),
                        ha="center", va="bottom", fontsize=7)
        if r["ps_comm_share"] is not None:
            comm, wait = r["ps_comm_share"], r["ps_wait_share"] or 0.0
            ax.bar(i + width / 2, comm, width, color="tab:orange", hatch="//",
                   label="PS measured: comm / (comm + compute + wait)")
            ax.bar(i + width / 2, wait, width, bottom=comm, color="tab:gray", hatch="..",
                   label="PS measured: wait / (comm + compute + wait) (held for the round)")
            ax.annotate(f"{comm:.2f}+{wait:.2f}", (i + width / 2, comm + wait),
                        ha="center", va="bottom", fontsize=7)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7)
    ax.set_xticks(range(len(multi)), [f"{r['label']}\nN={r['workers']}" for r in multi],
                  fontsize=6.5, rotation=20, ha="right")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlim(-0.7, max(len(multi), 4) - 0.3)
    ax.set(ylabel="share of a step", title="Communication share per strategy")
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def plot_curves(curve_runs: List[Run], title: str, path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colors = _colors([r.name for r in curve_runs])
    markers = "osD^v<>p"
    for i, r in enumerate(curve_runs):
        marker, size = markers[i % len(markers)], 8 - 1.2 * (i % 4)
        pts = curve_points(r.logs)
        label = f"{r.label}, N={r.workers}"
        for col, k in ((0, 2), (1, 3)):  # top-1, top-5
            for row, x in ((0, 0), (1, 1)):  # vs epoch, vs wall-clock
                ax = axes[row][col]
                if pts["val"]:
                    ax.plot([p[x] for p in pts["val"] if p[x] is not None],
                            [p[k] for p in pts["val"] if p[x] is not None], "-",
                            marker=marker, markersize=size, alpha=0.85,
                            color=colors[r.name], label=f"{label} val")
                if pts["train"]:
                    ax.plot([p[x] for p in pts["train"]], [p[k] for p in pts["train"]], "--",
                            color=colors[r.name], alpha=0.6, label=f"{label} train")
    for col, metric in ((0, "top-1"), (1, "top-5")):
        axes[0][col].set(xlabel="epoch", ylabel=f"{metric} (%)", ylim=(0, 101),
                         title=f"{metric} vs epoch (solid val, dashed train)")
        axes[1][col].set(xlabel="training wall-clock (s; validation excluded)",
                         ylabel=f"{metric} (%)", ylim=(0, 101), title=f"{metric} vs wall-clock")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6.5)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def draw(sweep_dir: Path, figures: Path, curves: Optional[List[Path]] = None,
         epoch_images: int = IMAGENET_TRAIN_IMAGES) -> List[Path]:
    runs = load_sweep(sweep_dir)
    if not runs:
        raise SystemExit(f"error: no run with a log.jsonl under {sweep_dir}")
    rows = analyze(runs, epoch_images)
    tput = [r for r in runs if r.stage == "throughput"]
    cfg = (tput or runs)[0].run["config"]
    title = (f"{sweep_dir.name}: {cfg['arch']}, {cfg['image_size']} px, -b {cfg['batch_size']} "
             f"per worker, {describe_hardware(runs)}")
    out = [figures / name for name in FIGURES]
    plot_throughput(rows, title, out[0])
    plot_efficiency(rows, title, out[1])
    plot_epoch_time(rows, title, out[2], epoch_images)
    plot_comm_share(rows, title, out[3])
    curve_runs = ([r for r in (load_run(d) for d in curves) if r] if curves else
                  [r for r in runs if r.stage == "curves"])
    if not curve_runs:  # nothing learnable was run: the throughput runs' single epoch
        curve_runs = tput
    ccfg = curve_runs[0].run["config"]
    data = "synthetic (--dummy)" if ccfg.get("dummy") or ccfg.get("data_backend") == "synthetic" \
        else "/".join(Path(ccfg["data"] or "").parts[-2:])
    plot_curves(curve_runs, f"learning curves: {ccfg['arch']}, {ccfg['image_size']} px, "
                f"-b {ccfg['batch_size']} per worker, data {data}, {describe_hardware(runs)}",
                out[4])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("-o", "--figures", type=Path, default=REPO / "figures")
    parser.add_argument("--curves", type=Path, nargs="+",
                        help="run dirs for the learning curves (default: the sweep's curves-*)")
    parser.add_argument("--epoch-images", type=int, default=IMAGENET_TRAIN_IMAGES)
    args = parser.parse_args(argv)
    draw(args.sweep_dir, args.figures, args.curves, args.epoch_images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
