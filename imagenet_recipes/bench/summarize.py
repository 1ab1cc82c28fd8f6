"""Print a Markdown table of runs, read only from their JSONL logs (for RESULTS.md).

    launch/env.sh python -m imagenet_recipes.bench.summarize runs/quickstart-* runs/bench-*

One row per run dir: script, strategy, processes, precision, global batch, steady-state
throughput (median of the interval records after the first, which includes warm-up),
last and best validation top-1, wall time, and the hardware recorded at start.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from imagenet_recipes.bench.common import logged_device, logged_entry, logged_precision, markdown_table, \
    read_log, steady, strategy_label


def row(run_dir: Path) -> dict:
    logs = read_log(run_dir)
    run = logs["run"][-1]
    train = logs.get("train", [])
    # A run too short for a second interval is shown with its only one, warm-up included.
    rates = steady(train, "img_s") or [r["img_s"] for r in train]
    val = logs.get("val", [])
    return {
        "run": run_dir.name, "script": logged_entry(run), "strategy": strategy_label(run),
        "procs": run["world_size"], "precision": logged_precision(run),
        "arch": run["config"]["arch"], "image": run["config"]["image_size"],
        "global batch": run["global_batch"],
        "img/s": f"{statistics.median(rates):.1f}" if rates else "-",
        "img/s/proc": f"{statistics.median(rates) / run['world_size']:.1f}" if rates else "-",
        "val top-1": f"{val[-1]['top1']:.1f}" if val else "-",
        "best top-1": f"{max(v['top1'] for v in val):.1f}" if val else "-",
        "epochs": len(logs.get("train_epoch", [])),
        "wall s": f"{(logs.get('end') or train or [run])[-1]['elapsed']:.0f}",
        "device": logged_device(run), "torch": run["versions"]["torch"],
    }


def markdown(rows: list) -> str:
    cols = list(rows[0])
    # Text and numbers alternate across the columns: all of them stay left-aligned.
    return markdown_table(cols, [[str(r[c]) for c in cols] for r in rows], right_from=len(cols))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    dirs = [d for d in args.run_dirs if (d / "log.jsonl").is_file()]
    if not dirs:
        print("error: none of the given folders holds a log.jsonl", file=sys.stderr)
        return 2
    print(markdown([row(d) for d in dirs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
