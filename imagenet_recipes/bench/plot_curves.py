"""Learning curves drawn from run logs (JSONL) only: train loss per interval and val top-1/top-5
per epoch, one line per run.

    launch/env.sh python -m imagenet_recipes.bench.plot_curves runs/quickstart-* -o figures/quickstart_curves.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from imagenet_recipes.bench.common import logged_hardware, read_log
from imagenet_recipes.bench.figure import plt, save_figure


def plot(run_dirs: list, out: Path) -> None:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for run_dir in run_dirs:
        logs = read_log(run_dir)
        train, val = logs.get("train", []), logs.get("val", [])
        per_epoch = max(train[0]["steps_per_epoch"], 1) if train else 1
        ax_loss.plot([r["step"] / per_epoch for r in train], [r["loss"] for r in train],
                     label=run_dir.name)
        line, = ax_acc.plot([r["epoch"] + 1 for r in val], [r["top1"] for r in val], "o-",
                            label=f"{run_dir.name} top-1")
        ax_acc.plot([r["epoch"] + 1 for r in val], [r["top5"] for r in val], "--",
                    color=line.get_color(), label=f"{run_dir.name} top-5")
    ax_loss.set(xlabel="epoch", ylabel="train loss", title="training loss (per print interval)")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="validation accuracy", ylim=(0, 101))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    run = read_log(run_dirs[0])["run"][0]
    fig.suptitle(f"{run['config']['arch']} — {logged_hardware(run)}", fontsize=9)
    save_figure(fig, out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("-o", "--out", type=Path, default=Path("figures/curves.png"))
    args = parser.parse_args(argv)
    dirs = [d for d in args.run_dirs if (d / "log.jsonl").is_file()]
    if not dirs:
        print("error: none of the given folders holds a log.jsonl", file=sys.stderr)
        return 2
    plot(dirs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
