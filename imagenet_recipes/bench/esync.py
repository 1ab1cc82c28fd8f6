"""ESync against synchronous and asynchronous SGD on the parameter server, with heterogeneous
workers, on an IID and a non-IID (by-class) split: the comparison the ESync paper makes.

    launch/env.sh python -m imagenet_recipes.bench.esync                  # ~35 min on 2 cores
    launch/env.sh python -m imagenet_recipes.bench.esync --quick          # smoke run (~3 min)
    launch/env.sh python -m imagenet_recipes.bench.esync --splits iid --workers 2 --slowdown 1,2 \
        --variants sync async-plain async-staleness      # the async rules alone
    launch/env.sh python -m imagenet_recipes.bench.esync --report runs/esync-20261123-120000

Every combination of --variants (sync; async with each --async-rule, plain and staleness; esync
with each --esync-average, mean and normalized) and --split iid|by-class runs train/ps.py (as
`-m imagenet_recipes.bench.slow_workers.ps`, with an emulated straggler) with --workers compute
processes and the same --worker-slowdown (default 1,1,4: the third worker sleeps 3x its compute
time after each step, an emulated slower device), --repeats times with seeds 0..R-1, the
repeats interleaved so that drifts in the machine's speed hit every mode.
Same model, data, per-worker batch, base lr (scaled per mode as in imagenet_recipes/ps/server.py),
schedule and epochs; the server validates once per epoch, in the background, on the weights of
that moment (their `train_elapsed` is the wall-clock used here).

For each split and seed the target is synchronous SGD's final validation top-1 of that seed:
time to target is the training wall-clock of a run's first validation at or above it, and
ESync's speed-up is sync's time to its own final accuracy over ESync's. The table, the figure
(figures/esync_study.png) and the RESULTS.md block are written from the runs' logs only.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import List

from imagenet_recipes.bench import ps_stats
from imagenet_recipes.bench.common import logged_hardware, read_meta, repo_relative, shown_commit, spread
from imagenet_recipes.bench.render import render
from imagenet_recipes.bench.jobs import SLOW_PS, STUDY_QUICK, launcher, quick_defaults, run_study, study_arguments

# --mode with its rule: --async-rule for async, --esync-average for esync
VARIANTS = ("sync", "async-plain", "async-staleness", "esync-mean", "esync-normalized")
SPLITS = ("iid", "by-class")


def variant_args(variant: str, args) -> List[str]:
    mode, _, rule = variant.partition("-")
    if mode == "async":
        return ["--mode", mode, "--async-rule", rule]
    if mode == "esync":
        return ["--mode", mode, "--esync-average", rule, "--esync-epsilon",
                str(args.esync_epsilon)]
    return ["--mode", mode]
FIGURE = "esync_study.png"


def jobs(args, out: Path, data: Path) -> List[tuple]:
    common = ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--warmup-epochs",
              str(args.warmup_epochs), "--lr-schedule", "cosine", "-p", str(args.print_freq),
              "-j", str(args.loader_workers), "--worker-slowdown", args.slowdown, "--logdir",
              str(out), str(data)]
    listed = []
    for seed in range(args.repeats):
        for split in args.splits:
            for variant in args.variants:
                name = f"{split}-{variant}-s{seed}"
                listed.append((name, launcher("ps", args.workers + 1, SLOW_PS) + common + [
                    *variant_args(variant, args), "--split", split, "--seed", str(seed),
                    "--run-name", name]))
    return listed


# --- what the logs say ---------------------------------------------------------------------------
def compare(folder: Path) -> List[dict]:
    """Every run of the study (bench.ps_stats reads its log) with split, mode and seed, its
    seed's sync target, its time to that target and its speed-up over sync."""
    runs = [c for c in ps_stats.load(folder) if c.is_ps]
    sync = {}  # (split, seed) -> (sync's final top-1, its time to reach it)
    for c in (c for c in runs if c.key == "sync"):
        final = ps_stats.summarize(c, None)["final_top1"]
        sync[c.run["split"], c.run["config"]["seed"]] = (
            final, ps_stats.summarize(c, final)["time_to_target"])
    out = []
    for c in runs:
        split, seed = c.run["split"], c.run["config"]["seed"]
        target, t_sync = sync.get((split, seed), (None, None))
        row = ps_stats.summarize(c, target)
        t = row["time_to_target"]
        out.append({"split": split, "mode": c.variant, "seed": seed, "run": c.run,
                    "curve": ps_stats.val_curve(c), "final": row["final_top1"],
                    "samples_s": row["samples_s"], "local_steps": row["local_steps"],
                    "target": target, "time": t,
                    "speedup": t_sync / t if t and t_sync else None,
                    "gap": row["final_top1"] - target if target is not None else None})
    return out


DEFAULTS = {"--workers": 3, "--slowdown": "1,1,4", "--repeats": 2}


def shown_command(rows: List[dict]) -> str:
    """The command that makes these runs, from what their logs say (the options left at
    their defaults omitted)."""
    cfg, first = rows[0]["run"]["config"], rows[0]["run"]
    splits = [s for s in SPLITS if any(r["split"] == s for r in rows)]
    variants = [v for v in VARIANTS if any(r["mode"] == v for r in rows)]
    given = {"--workers": first["workers"], "--slowdown": cfg["worker_slowdown"],
             "--repeats": len({r["seed"] for r in rows})}
    parts = ["python -m imagenet_recipes.bench.esync"]
    if splits != list(SPLITS):
        parts += ["--splits", *splits]
    parts += [f"{flag} {value}" for flag, value in given.items() if value != DEFAULTS[flag]]
    if variants != list(VARIANTS):
        parts += ["--variants", *variants]
    return " ".join(parts)


def report(rows: List[dict], logs: str = "results/esync/", figure: str = FIGURE,
           note: str = "") -> str:
    table, verdicts = [], []
    for split in SPLITS:
        for mode in VARIANTS:
            group = [r for r in rows if r["split"] == split and r["mode"] == mode]
            if not group:
                continue
            reached = [r["time"] for r in group if r["time"] is not None]
            local = [r["local_steps"] for r in group if r["local_steps"]]
            table.append([
                split, mode, str(len(group)),
                spread([r["final"] for r in group], ".1f"),
                "-" if mode == "sync" else spread([r["gap"] for r in group], "+.1f"),
                f"{spread(reached, '.0f')} ({len(reached)} of {len(group)})",
                "-" if mode == "sync" else spread(
                    [r["speedup"] for r in group if r["speedup"]], ".2f"),
                spread([r["samples_s"] for r in group if r["samples_s"]], ".0f"),
                " / ".join(f"{statistics.mean(w):.1f}" for w in zip(*local)) if local else "-"])
            if mode != "sync":
                speedups = [r["speedup"] for r in group if r["speedup"]]
                verdicts.append({"split": split, "mode": mode, "runs": len(group),
                                 "gap": statistics.mean(r["gap"] for r in group),
                                 "reached": len(speedups),
                                 "speedup": statistics.median(speedups) if speedups else None})
    first = rows[0]["run"]
    return render("esync", command=shown_command(rows), logs=logs, figure=figure, note=note,
                  run=first, cfg=first["config"], seeds=sorted({r["seed"] for r in rows}),
                  esync=any(r["mode"].startswith("esync") for r in rows),
                  hardware=logged_hardware(first), commit=shown_commit(first.get("commit")),
                  rows=table, verdicts=verdicts)


def draw(rows: List[dict], figures: Path, figure: str = FIGURE) -> Path:
    from imagenet_recipes.bench.figure import plt, save_figure

    splits = [s for s in SPLITS if any(r["split"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(splits), figsize=(5.5 * len(splits), 4), squeeze=False,
                             sharey=True)
    colours = {variant: f"C{i}" for i, variant in enumerate(VARIANTS)}
    for ax, split in zip(axes[0], splits):
        for r in (r for r in rows if r["split"] == split):
            ax.plot([p.seconds for p in r["curve"]], [p.top1 for p in r["curve"]], "o-",
                    ms=3, color=colours[r["mode"]], alpha=0.8,
                    label=r["mode"] if r["seed"] == 0 else None)
        targets = [r["target"] for r in rows if r["split"] == split and r["mode"] == "sync"]
        if targets:
            ax.axhline(statistics.mean(targets), color="black", ls="--", lw=0.8,
                       label="sync's final top-1, mean of seeds")
        ax.set(title=f"split: {split}", xlabel="training wall-clock (s)", ylim=(0, 101))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("validation top-1 (%)")
    run = rows[0]["run"]
    fig.suptitle(f"{run['config']['arch']} {run['config']['image_size']} px, "
                 f"{run['workers']} workers, slowdown {run['config']['worker_slowdown']}; "
                 "one line per seed", fontsize=8)
    path = figures / figure
    save_figure(fig, path)
    return path


def rows_of(folder: Path) -> List[dict]:
    rows = compare(folder)
    if not rows:
        raise SystemExit(f"error: no parameter-server run with a log.jsonl under {folder}")
    return rows


def block(folder: Path, figures: Path, figure: str = FIGURE) -> str:
    """bench.regenerate's section: the figure and the table from a study's kept logs
    (results/<folder>/: the runs kept in runs.jsonl and bench.esync's esync.json)."""
    from imagenet_recipes.bench.results import load_note

    rows = rows_of(folder)
    draw(rows, figures, figure)
    return report(rows, f"{repo_relative(folder.resolve())}/", figure,
                  load_note(read_meta(folder / "esync.json"), "esync.json"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    study_arguments(p, "esync", repeats=2,
                    esync_epsilon_help="ESync's margin in seconds (the authors' 0.5 s exceeds "
                                       "a whole step at this size)")
    p.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="modes with their rule (async: --async-rule, esync: --esync-average)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--slowdown", default="1,1,4")
    args = p.parse_args(argv)
    if args.quick:
        quick_defaults(args, argv, STUDY_QUICK)
    if len(args.slowdown.split(",")) != args.workers:
        p.error(f"--slowdown {args.slowdown} needs one factor per worker ({args.workers})")

    def finish(folder: Path) -> int:
        print(block(folder, args.figures or folder / "figures"))
        return 0

    return run_study(p, args, "esync", "esync.json", jobs, finish)


if __name__ == "__main__":
    sys.exit(main())
