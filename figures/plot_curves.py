"""Learning curves drawn from run logs (JSONL) only: train loss per interval and val top-1/top-5
per epoch, one line per run.

    python figures/plot_curves.py runs/quickstart-* -o figures/quickstart_curves.png
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def read(run_dir: Path) -> dict:
    kinds: dict = {}
    for line in (run_dir / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        kinds.setdefault(record["kind"], []).append(record)
    return kinds


def plot(run_dirs: list, out: Path) -> None:
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for run_dir in run_dirs:
        logs = read(run_dir)
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
    run = read(run_dirs[0])["run"][0]
    hw = run["hardware"]
    device = ", ".join(hw["gpus"]) or f"{hw['cpu']} ({hw['cpu_count']} cores)"
    fig.suptitle(f"{run['config']['arch']} — {device} — torch {run['versions']['torch']}",
                 fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


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
