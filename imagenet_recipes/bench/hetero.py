"""Slow and uneven workers: which distribution method to pick when one worker is slower, measured
side by side on the same data, model, batch and schedule.

    launch/env.sh python -m imagenet_recipes.bench.hetero                       # DDP and the PS modes (hours on 2 cores)
    launch/env.sh python -m imagenet_recipes.bench.hetero --profiles one-2x --splits iid   # one profile
    launch/env.sh python -m imagenet_recipes.bench.hetero --quick               # smoke run (~5 min)
    launch/env.sh python -m imagenet_recipes.bench.hetero --report results/hetero
    launch/env.sh python lab/hetero.py                   # the whole study, local SGD and DiLoCo too

Methods (--methods), 3 compute processes each:
  ddp               train/ddp.py: gradients all-reduced every step (the slowest rank sets the pace)
  sync              train/ps.py --mode sync (one server process more)
  async-plain       train/ps.py --mode async --async-rule plain
  async-staleness   train/ps.py --mode async --async-rule staleness (the default rule)
  esync-mean        train/ps.py --mode esync --esync-average mean (the default average)
  esync-normalized  train/ps.py --mode esync --esync-average normalized
A study adds methods built on train/ddp.py (`MoreMethods`): lab/hetero.py adds the local SGD
experiment's local-sgd and diloco (imagenet_recipes/experiments/local_sgd/). This tool starts
none of them; its report reads every method's runs from their logs.
Speed profiles (--profiles), as --worker-slowdown factors (a factor f: the process sleeps
(f - 1) x its compute time after each step, an emulated slower device: train/ddp.py and
train/ps.py run as bench.slow_workers' ddp and ps):
  even 1,1,1   one-2x 1,1,2   one-4x 1,1,4   midway 1,1,4 from epoch 3 (--slowdown-from-epoch)
Splits (--splits): iid, or by-class (each worker its own classes; the parameter server's
--split: DDP's sampler always shards IID, so the DDP methods run on iid only).

Every combination runs --repeats times with seeds 0..R-1, the seeds outermost so that drifts in
the machine's speed hit every method. The target of a (profile, split, seed) is PS sync's final
validation top-1 of that seed minus --target-gap points; time to target is the training
wall-clock of a run's first validation at or above it (bench.ps_stats: DDP's summed epoch times,
the server's train_elapsed). Table, verdicts and figure (figures/hetero_study.png) come from the
runs' logs only; a folder with part of the matrix reports that part.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from imagenet_recipes.bench import ps_stats
from imagenet_recipes.bench.common import logged_hardware, read_meta, repo_relative, shown_commit, spread
from imagenet_recipes.bench.esync import variant_args
from imagenet_recipes.bench.jobs import SLOW_DDP, SLOW_PS, STUDY_QUICK, launcher, quick_defaults, run_study, study_arguments
from imagenet_recipes.bench.render import render

# The methods this tool runs: the product's.
RUN_METHODS = ("ddp", "sync", "async-plain", "async-staleness", "esync-mean", "esync-normalized")
# Every method the report knows, in the order its table and figure show them: local-sgd and
# diloco are the local SGD experiment's, run by lab/hetero.py and read here from their logs.
METHODS = ("ddp", "local-sgd", "diloco", "sync", "async-plain", "async-staleness", "esync-mean",
           "esync-normalized")
# name -> (--worker-slowdown, --slowdown-from-epoch)
PROFILES: Dict[str, Tuple[str, int]] = {"even": ("1,1,1", 0), "one-2x": ("1,1,2", 0),
                                        "one-4x": ("1,1,4", 0), "midway": ("1,1,4", 3)}
SPLITS = ("iid", "by-class")
FIGURE = "hetero_study.png"
META = "hetero.json"


@dataclass(frozen=True)
class MoreMethods:
    """Methods a study adds to the comparison, each built on train/ddp.py (DDP's sampler: the
    iid split only): `start(method, args)` gives its launch command (up to the options every
    run shares) and its own options; `add_options` its command-line options; `quick` its --quick
    settings, as quick_defaults takes them."""
    names: Tuple[str, ...] = ()
    start: Optional[Callable[[str, argparse.Namespace], Tuple[List[str], List[str]]]] = None
    add_options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    quick: Dict[str, tuple] = field(default_factory=dict)


def method_start(method: str, split: str, args) -> Tuple[List[str], List[str]]:
    """(launch command, the method's own options) of one of this tool's methods."""
    if method == "ddp":
        return launcher("ddp", args.workers, SLOW_DDP), []
    # the parameter server's modes, as bench.esync runs them
    return launcher("ps", args.workers + 1, SLOW_PS) + ["--split", split], \
        variant_args(method, args)


def jobs(args, out: Path, data: Path) -> List[tuple]:
    common = ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--warmup-epochs",
              str(args.warmup_epochs), "--lr-schedule", "cosine", "-p", str(args.print_freq),
              "-j", str(args.loader_workers), "--logdir", str(out), str(data)]
    listed = []
    for seed in range(args.repeats):
        for profile in args.profiles:
            slowdown, from_epoch = PROFILES[profile]
            for split in args.splits:
                for method in args.methods:
                    if (method == "ddp" or method in args.more.names) and split != "iid":
                        continue
                    name = f"{profile}-{split}-{method}-s{seed}"
                    start, options = (args.more.start(method, args) if method in args.more.names
                                      else method_start(method, split, args))
                    listed.append((name, start + common + [
                        "--worker-slowdown", slowdown, "--slowdown-from-epoch",
                        str(from_epoch), *options, "--seed", str(seed), "--run-name", name]))
    return listed


# --- what the logs say ---------------------------------------------------------------------------
def method_of(c: ps_stats.Contender) -> str:
    if c.is_ps:
        return c.variant
    cfg = c.run["config"]
    if not cfg.get("local_sgd_period"):
        return "ddp"
    plain = cfg.get("local_sgd_outer_lr", 1) == 1 and not cfg.get("local_sgd_outer_momentum")
    return "local-sgd" if plain else "diloco"


def profile_of(run: dict) -> str:
    cfg = run["config"]
    given = (cfg.get("worker_slowdown") or "1,1,1", cfg.get("slowdown_from_epoch", 0))
    return next((name for name, profile in PROFILES.items() if profile == given),
                f"{given[0]} from epoch {given[1]}")


def compare(folder: Path, gap: float) -> List[dict]:
    """Every run with its profile, split, method and seed, its target (its seed's PS sync final
    top-1 minus `gap`), time to that target and the per-worker means of samples/s and bytes."""
    runs = ps_stats.load(folder)
    keyed = [(c, profile_of(c.run), c.run.get("split", "iid"), method_of(c),
              c.run["config"]["seed"]) for c in runs]
    sync = {(p, s, seed): ps_stats.summarize(c, None)["final_top1"]
            for c, p, s, m, seed in keyed if m == "sync"}
    out = []
    for c, profile, split, method, seed in keyed:
        final_sync = sync.get((profile, split, seed))
        target = final_sync - gap if final_sync is not None else None
        row = ps_stats.summarize(c, target)
        bytes_ = [b for b in row["bytes_per_sample"] if b is not None]
        out.append({"profile": profile, "split": split, "method": method, "seed": seed,
                    "run": c.run, "curve": ps_stats.val_curve(c), "final": row["final_top1"],
                    "gap": row["final_top1"] - final_sync if final_sync is not None else None,
                    "target": target, "time": row["time_to_target"],
                    "samples_s": row["samples_s"], "traffic": row["traffic"],
                    "kb_per_sample": statistics.mean(bytes_) / 1e3 if bytes_ else None})
    return out


def _within(values: List[float], others: List[float]) -> bool:
    """Whether two groups' ranges (lowest to highest run) overlap."""
    return bool(values and others) and min(values) <= max(others) and min(others) <= max(values)


def verdicts(rows: List[dict]) -> List[dict]:
    """Per profile and split: the fastest method to the target among those that reached it in
    every run (with how much slower the next one was), which methods' final top-1 ranges
    overlap sync's, and which lie wholly below or above it."""
    found = []
    for profile in PROFILES:
        for split in SPLITS:
            cell = [r for r in rows if r["profile"] == profile and r["split"] == split]
            if not cell:
                continue
            groups = {m: [r for r in cell if r["method"] == m] for m in METHODS}
            groups = {m: g for m, g in groups.items() if g}
            always = {m: statistics.median(r["time"] for r in g) for m, g in groups.items()
                      if all(r["time"] is not None for r in g)}
            ranked = sorted(always, key=always.get)
            sync_finals = [r["final"] for r in groups.get("sync", [])]
            others = {m: [r["final"] for r in g] for m, g in groups.items() if m != "sync"}
            found.append({
                "profile": profile, "split": split,
                "fastest": ranked[0] if ranked else None,
                "fastest_s": always[ranked[0]] if ranked else None,
                "next_ratio": always[ranked[1]] / always[ranked[0]] if len(ranked) > 1 else None,
                "level": [m for m, finals in others.items() if _within(finals, sync_finals)],
                "below": [m for m, finals in others.items()
                          if sync_finals and max(finals) < min(sync_finals)],
                "above": [m for m, finals in others.items()
                          if sync_finals and min(finals) > max(sync_finals)]})
    return found


def report(rows: List[dict], gap: float, logs: str = "results/hetero/", figure: str = FIGURE,
           note: str = "") -> str:
    table = []
    for profile in PROFILES:
        for split in SPLITS:
            for method in METHODS:
                group = [r for r in rows if (r["profile"], r["split"], r["method"]) ==
                         (profile, split, method)]
                if not group:
                    continue
                reached = [r["time"] for r in group if r["time"] is not None]
                kb = [r["kb_per_sample"] for r in group if r["kb_per_sample"] is not None]
                table.append([
                    profile, split, method, str(len(group)),
                    spread([r["final"] for r in group], ".1f"),
                    "-" if method == "sync" else spread(
                        [r["gap"] for r in group if r["gap"] is not None], "+.1f"),
                    f"{spread(reached, '.0f')} ({len(reached)} of {len(group)})",
                    spread([r["samples_s"] for r in group if r["samples_s"]], ".0f"),
                    spread(kb, ".0f") + (" (computed)" if group[0]["traffic"] == "computed"
                                         else "")])
    first = rows[0]["run"]
    return render("hetero", logs=logs, figure=figure, note=note, gap=gap,
                  cfg=first["config"], hardware=logged_hardware(first),
                  commit=" / ".join(sorted({shown_commit(r["run"].get("commit")) for r in rows})),
                  seeds=sorted({r["seed"] for r in rows}), rows=table, verdicts=verdicts(rows),
                  profiles=[(name, *PROFILES[name]) for name in PROFILES
                            if any(r["profile"] == name for r in rows)],
                  local=next((r["run"]["config"] for r in rows if r["method"] == "local-sgd"),
                             None),
                  diloco=next((r["run"]["config"] for r in rows if r["method"] == "diloco"),
                              None))


def draw(rows: List[dict], figures: Path, figure: str = FIGURE) -> Path:
    from imagenet_recipes.bench.figure import plt, save_figure

    cells = [(p, s) for p in PROFILES for s in SPLITS
             if any(r["profile"] == p and r["split"] == s for r in rows)]
    cols = min(len(cells), 3)
    nrows = (len(cells) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False,
                             sharey=True)
    colours = {method: f"C{i}" for i, method in enumerate(METHODS)}
    for ax, (profile, split) in zip(axes.flat, cells):
        for r in (r for r in rows if r["profile"] == profile and r["split"] == split):
            ax.plot([p.seconds for p in r["curve"]], [p.top1 for p in r["curve"]], "o-",
                    ms=3, color=colours[r["method"]], alpha=0.7,
                    label=r["method"] if r["seed"] == min(x["seed"] for x in rows) else None)
        ax.set(title=f"{profile}, {split}", xlabel="training wall-clock (s)", ylim=(0, 101))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("validation top-1 (%)")
    fig.suptitle("one line per run; 3 workers", fontsize=8)
    path = figures / figure
    save_figure(fig, path)
    return path


def block(folder: Path, figures: Path, figure: str = FIGURE, gap: float = 5.0) -> str:
    """bench.regenerate's section: the figure and the table from the study's kept logs."""
    from imagenet_recipes.bench.results import load_note

    rows = compare(folder, gap)
    if not rows:
        raise SystemExit(f"error: no run with a log.jsonl under {folder}")
    draw(rows, figures, figure)
    return report(rows, gap, f"{repo_relative(folder.resolve())}/", figure,
                  load_note(read_meta(folder / META), META))


def main(argv=None, more: MoreMethods = MoreMethods()) -> int:
    """The tool's command line; `more`: the methods a study adds (lab/hetero.py)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    study_arguments(p, "hetero", repeats=3,
                    esync_epsilon_help="ESync's margin in seconds (as bench.esync)")
    methods = [m for m in METHODS if m in RUN_METHODS or m in more.names]
    p.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    p.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    p.add_argument("--methods", nargs="+", choices=methods, default=methods)
    p.add_argument("--target-gap", type=float, default=5.0,
                   help="target = PS sync's final top-1 of the same seed minus this")
    more.add_options(p)
    args = p.parse_args(argv)
    args.workers, args.more = 3, more
    if args.quick:
        quick_defaults(args, argv, {**STUDY_QUICK, **more.quick})

    def finish(folder: Path) -> int:
        print(block(folder, args.figures or folder / "figures", gap=args.target_gap))
        return 0

    return run_study(p, args, "hetero", META, jobs, finish)


if __name__ == "__main__":
    sys.exit(main())
