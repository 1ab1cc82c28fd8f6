"""Scaling figures of a strategy sweep (bench.sweep), drawn from the runs' JSONL logs only.

    launch/env.sh python -m imagenet_recipes.bench.plot_scaling runs/sweep-20261122-140000   # figures/scaling_*.png
    launch/env.sh python -m imagenet_recipes.bench.plot_scaling runs/sweep-X --curves runs/quickstart-*
                                                  # ... with the learning curves of other runs

The runs are read and the numbers computed by bench.sweep_stats (its docstring says what each
number is and where it comes from); this module only draws them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from matplotlib.ticker import MaxNLocator

from imagenet_recipes.bench.common import REPO
from imagenet_recipes.bench.figure import plt, save_figure
from imagenet_recipes.bench.sweep_stats import IMAGENET_TRAIN_IMAGES, Run, analyze, curve_points, \
    describe_hardware, load_run, load_sweep

FIGURES = ("scaling_throughput.png", "scaling_efficiency.png", "scaling_epoch_time.png",
           "scaling_comm_share.png", "scaling_curves.png", "scaling_top1_vs_time.png")


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


def _spread(rows: List[dict], scale: Optional[List[float]] = None) -> List[List[float]]:
    """Error-bar lengths below and above the median img/s (times `scale`), from the lowest and
    highest repeat; never negative (a single repeat gives 0 up to rounding)."""
    scale = scale or [1.0] * len(rows)
    return [[max(0.0, (r["img_s"] - r["img_s_low"]) * k) for r, k in zip(rows, scale)],
            [max(0.0, (r["img_s_high"] - r["img_s"]) * k) for r, k in zip(rows, scale)]]


def plot_throughput(rows: List[dict], title: str, path: Path) -> None:
    """img/s against the processes each strategy used, one line per strategy (and variant);
    the bars span the lowest and highest of the repeats, the point is their median."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        mine = [r for r in rows if r["label"] == label and r["img_s"]]
        base = next((r for r in rows if r["family"] == mine[0]["family"] and r["workers"] == 1
                     and not r["variant"] and r["img_s"]), None) if mine else None
        points = sorted({r["processes"]: r for r in mine + ([base] if base else [])}.values(),
                        key=lambda r: r["processes"])
        if not points:
            continue
        xs = [r["processes"] for r in points]
        ys = [r["img_s"] for r in points]
        spread = _spread(points)
        color = _family_color(mine[0]["family"])
        ax.errorbar(xs, ys, yerr=spread, fmt="s--" if mine[0]["variant"] else "o-",
                    color=color, capsize=4, markerfacecolor="none", label=label)
        if base and mine[0]["variant"] == "" and len(xs) > 1:  # ideal: N x the 1-worker rate
            ax.plot(xs, [base["img_s"] * r["workers"] for r in points], ":", color=color,
                    alpha=0.7)
    ax.plot([], [], "k:", label="ideal linear (N workers x own 1-worker img/s)")
    ax.set_xticks(sorted({r["processes"] for r in rows}))
    repeats = sorted({r["repeats"] for r in rows if r["repeats"]})
    ax.set(xlabel="processes (parameter server: workers + 1 server process)",
           ylabel="img/s (all workers)",
           title=f"Throughput vs processes (median of {'/'.join(map(str, repeats))} repeats; "
                 "bars: lowest to highest)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
        # the repeats' spread, against the 1-worker median
        ax.errorbar(range(len(multi)), [r["efficiency"] for r in multi],
                    yerr=_spread(multi, scale=[r["efficiency"] / r["img_s"] for r in multi]),
                    fmt="none", ecolor="k", capsize=4, lw=0.8)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="tab:red", ls="--", lw=0.8, label="target 0.90")
    ax.set(ylabel="img/s(N) / (N x img/s(1))", ylim=(0, 1.25),
           title="Weak-scaling efficiency vs the same strategy's 1-worker run "
                 "(bars: lowest to highest repeat)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
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
    """Two measures in two panels: the step-time overhead of N workers over one (any
    strategy), and the parameter server's communication and wait shares (its workers' own
    timers)."""
    overhead = [r for r in rows if r["overhead"] is not None]
    ps = [r for r in rows if r["ps_comm_share"] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.8),
                                      gridspec_kw={"width_ratios": [max(len(overhead), 2),
                                                                    max(len(ps), 1)]})
    if overhead:
        _bars(left, overhead, "overhead")
    left.axhline(0, color="k", lw=0.8)
    left.set(ylabel="1 - step time(1 worker) / step time(N)",
             title="Step-time overhead of N workers over 1")
    names = [f"{r['label']}\nN={r['workers']}" for r in ps]
    comm = [r["ps_comm_share"] for r in ps]
    wait = [r["ps_wait_share"] or 0.0 for r in ps]
    right.bar(range(len(ps)), comm, color="tab:orange", label="comm")
    right.bar(range(len(ps)), wait, bottom=comm, color="tab:gray", label="wait for the round")
    for i, (c, w) in enumerate(zip(comm, wait)):
        right.annotate(f"{c:.2f} + {w:.2f}", (i, c + w), ha="center", va="bottom", fontsize=7)
    right.set_xticks(range(len(ps)), names, fontsize=6.5, rotation=20, ha="right")
    right.set_xlim(-0.7, max(len(ps), 2) - 0.3)
    right.set(ylim=(0, 1.1), ylabel="share of (comm + compute + wait)",
              title="Parameter server: its workers' time")
    if ps:
        right.legend(fontsize=7, loc="upper right")
    else:
        right.text(0.5, 0.5, "no parameter-server run\nin this sweep", ha="center",
                   va="center", transform=right.transAxes, fontsize=8)
    for ax in (left, right):
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = "osD^v<>p"


def _curve_style(i: int) -> dict:
    """Lines that stay visible when they lie on top of each other: each run its own marker
    (hollow, so one under another shows through) and line style."""
    return {"marker": MARKERS[i % len(MARKERS)], "markersize": 8 - 1.2 * (i % 4),
            "markerfacecolor": "none", "linestyle": LINE_STYLES[i % len(LINE_STYLES)]}


def plot_curves(curve_runs: List[Run], title: str, path: Path) -> None:
    """Validation (top row) and training (bottom row) top-1 per epoch and top-5 per epoch."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    colors = _colors([r.name for r in curve_runs])
    for i, r in enumerate(curve_runs):
        pts = curve_points(r.logs)
        for row, split in ((0, "val"), (1, "train")):
            for col, k in ((0, 2), (1, 3)):  # top-1, top-5
                axes[row][col].plot([p[0] for p in pts[split]], [p[k] for p in pts[split]],
                                    color=colors[r.name], alpha=0.85,
                                    label=f"{r.label}, N={r.workers}", **_curve_style(i))
    for row, split in ((0, "validation"), (1, "training")):
        for col, metric in ((0, "top-1"), (1, "top-5")):
            axes[row][col].set(xlabel="epoch", ylabel=f"{metric} (%)", ylim=(0, 101),
                               title=f"{split} {metric} per epoch")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs only
    axes[0][0].legend(fontsize=6.5, loc="lower right")
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path)


def plot_top1_vs_time(curve_runs: List[Run], title: str, path: Path) -> None:
    """Validation top-1 against training wall-clock, one line per strategy: which one gets
    there first on the same machine."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = _colors([r.name for r in curve_runs])
    for i, r in enumerate(curve_runs):
        val = [p for p in curve_points(r.logs)["val"] if p.seconds is not None]
        ax.plot([p.seconds for p in val], [p.top1 for p in val], color=colors[r.name],
                label=f"{r.label}, N={r.workers}", **_curve_style(i))
    ax.set(xlabel="training wall-clock, s (validation excluded)", ylabel="val top-1 (%)",
           ylim=(0, 101), title="Validation top-1 vs training time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
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
    curves_title = (f"{ccfg['arch']}, {ccfg['image_size']} px, -b {ccfg['batch_size']} per "
                    f"worker, data {data}, {describe_hardware(runs)}")
    plot_curves(curve_runs, f"learning curves: {curves_title}", out[4])
    plot_top1_vs_time(curve_runs, curves_title, out[5])
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
