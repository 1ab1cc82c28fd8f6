"""Scaling figures of a strategy sweep (launch/sweep.py), drawn from the runs' JSONL logs only.

    python figures/plot_scaling.py runs/sweep-20261122-140000            # -> figures/scaling_*.png
    python figures/plot_scaling.py runs/sweep-X --curves runs/quickstart-*  # other curve runs

Every run folder with a log.jsonl under the sweep folder is read; `curves-*` folders are the
learning-curve runs, the others throughput runs. What is computed, and from what:

  img/s            median of the run's `train` interval records after the first (the first holds
                   start-up and warm-up); all processes together
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

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_curves import read  # noqa: E402  (the JSONL reader of the other figures)

IMAGENET_TRAIN_IMAGES = 1_281_167
FIGURES = ("scaling_throughput.png", "scaling_efficiency.png", "scaling_epoch_time.png",
           "scaling_comm_share.png", "scaling_curves.png")


@dataclass
class Run:
    name: str
    logs: Dict[str, List[dict]]
    stage: str              # throughput | curves
    entry: str              # nd | ddp | ddp_apex | hvd | ps
    workers: int
    processes: int
    precision: str          # e.g. "O0 float32", "O1 bfloat16"
    variant: str            # "" or "fp16 hook", "fp16 compression", ...
    img_s: Optional[float] = None
    step_time: Optional[float] = None
    intervals: int = 0
    ps_comm: Optional[Dict[str, float]] = None
    extra: dict = field(default_factory=dict)

    @property
    def run(self) -> dict:
        return self.logs["run"][-1]

    @property
    def family(self) -> str:
        """Strategy and precision: the runs one efficiency curve is drawn through."""
        base = {"nd": "nd", "ddp": "DDP", "ddp_apex": "DDP (apex)", "hvd": "Horovod"}.get(
            self.entry, f"PS {self.run.get('mode', '')}".strip())
        return f"{base} {self.precision}"

    @property
    def label(self) -> str:
        return f"{self.family}, {self.variant}" if self.variant else self.family


def steady(records: List[dict], key: str) -> List[float]:
    """The values of `key` in the interval records after the first (warm-up)."""
    values = [r[key] for r in records if r.get(key) is not None]
    return values[1:] if len(values) > 1 else []


def load_run(run_dir: Path) -> Optional[Run]:
    logs = read(run_dir)
    if "run" not in logs:
        return None
    run = logs["run"][-1]
    cfg = run["config"]
    entry = run.get("entry", run.get("strategy"))
    workers = run.get("workers", run["world_size"]) if entry == "ps" else run["world_size"]
    if entry == "ps":
        precision = "O0 float32"  # the parameter server trains in fp32
    else:
        precision = f"{run['precision']['opt_level']} {run['precision']['dtype']}"
    variant = ""
    if run.get("comm_hook") not in (None, "none"):
        variant = f"{run['comm_hook']} hook"
    elif cfg.get("fp16_allreduce") and entry == "hvd":
        variant = "fp16 compression"
    r = Run(run_dir.name, logs, "curves" if run_dir.name.startswith("curves-") else "throughput",
            entry, workers, run["world_size"], precision, variant)
    train = logs.get("train", [])
    rates, steps = steady(train, "img_s"), steady(train, "step_time")
    r.intervals = len(rates)
    r.img_s = statistics.median(rates) if rates else None
    r.step_time = statistics.median(steps) if steps else None
    if entry == "ps":
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
    runs = [load_run(d) for d in sorted(sweep_dir.iterdir())
            if d.is_dir() and (d / "log.jsonl").is_file()]
    order = {"nd": 0, "ddp": 1, "ddp_apex": 2, "hvd": 3, "ps": 4}
    return sorted((r for r in runs if r is not None),
                  key=lambda r: (r.stage != "throughput", order.get(r.entry, 9), r.precision,
                                 r.workers, r.variant, r.name))


def baseline(run: Run, runs: List[Run]) -> Optional[Run]:
    """The same strategy and precision at 1 worker, plain (no hook / compression)."""
    for r in runs:
        if (r.stage == "throughput" and r.family == run.family and r.workers == 1
                and not r.variant and r.img_s):
            return r
    return None


def nd_baseline(runs: List[Run]) -> Optional[Run]:
    return next((r for r in runs if r.stage == "throughput" and r.entry == "nd" and r.img_s),
                None)


def analyze(runs: List[Run], epoch_images: int = IMAGENET_TRAIN_IMAGES) -> List[dict]:
    """One row per throughput run: the numbers the figures and RESULTS.md tables show."""
    nd = nd_baseline(runs)
    rows = []
    for r in runs:
        if r.stage != "throughput":
            continue
        base = baseline(r, runs)
        row = {"run": r.name, "label": r.label, "family": r.family, "variant": r.variant,
               "entry": r.entry, "workers": r.workers, "processes": r.processes,
               "precision": r.precision, "img_s": r.img_s, "intervals": r.intervals,
               "step_time": r.step_time, "batch": r.run["config"]["batch_size"],
               "efficiency": None, "efficiency_nd": None, "overhead": None,
               "ps_comm_share": r.ps_comm["share"] if r.ps_comm else None,
               "ps_wait_share": r.ps_comm["wait_share"] if r.ps_comm else None,
               "epoch_hours": epoch_images / r.img_s / 3600 if r.img_s else None}
        if r.img_s and base and r.workers > 1:
            row["efficiency"] = r.img_s / (r.workers * base.img_s)
            if base.step_time and r.step_time:
                row["overhead"] = 1 - base.step_time / r.step_time
        if r.img_s and nd and nd.precision == r.precision and r.entry != "nd":
            row["efficiency_nd"] = r.img_s / (r.workers * nd.img_s)
        rows.append(row)
    return rows


def describe_hardware(runs: List[Run]) -> str:
    run = runs[0].run
    hw = run["hardware"]
    device = ", ".join(hw["gpus"]) or f"{hw['cpu']} ({hw['cpu_count']} cores, no GPU)"
    return f"{device}, torch {run['versions']['torch']}"


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


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


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
    _save(fig, path)


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
    _save(fig, path)


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
    _save(fig, path)


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
    _save(fig, path)


def curve_points(logs: Dict[str, List[dict]]) -> dict:
    """Per-epoch train and val top-1/top-5 with their epoch and training wall-clock."""
    epochs = logs.get("train_epoch", [])
    clock, t = {}, 0.0
    for e in epochs:
        t += e["epoch_time"]
        clock[e["epoch"]] = t
    train = [(e["epoch"] + 1, clock[e["epoch"]], e["top1"], e["top5"]) for e in epochs]
    val = []
    for v in logs.get("val", []):
        when = v.get("train_elapsed", clock.get(v["epoch"]))
        val.append((v["epoch"] + 1, when, v["top1"], v["top5"]))
    return {"train": train, "val": val}


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
    _save(fig, path)


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
    parser.add_argument("-o", "--figures", type=Path,
                        default=Path(__file__).resolve().parent)
    parser.add_argument("--curves", type=Path, nargs="+",
                        help="run dirs for the learning curves (default: the sweep's curves-*)")
    parser.add_argument("--epoch-images", type=int, default=IMAGENET_TRAIN_IMAGES)
    args = parser.parse_args(argv)
    draw(args.sweep_dir, args.figures, args.curves, args.epoch_images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
