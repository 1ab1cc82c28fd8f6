"""Study: how much does one engine step (Trainer.train_step) cost over a hand-written one? Same
batches; the measurement is imagenet_recipes.bench.bare_loop's.

    launch/env.sh python lab/loop.py          # resnet18, 64 px, b32: ~3 min, 2 idle cores
    launch/env.sh python lab/loop.py --threads 1   # steadier when others share the CPU
    launch/env.sh python lab/loop.py -a resnet50 --image-size 224 -b 256 --opt-level O1
    ... --compile                     # both sides torch.compile'd (the engine through --compile)

This is a benchmark, not a test: it always exits 0 and only reports whether the ratio meets
--target.
"""
from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from imagenet_recipes.bench.bare_loop import (BareLoop, build_trainer, make_batches,
                                              max_weight_difference, measure, parse_cli,
                                              print_header, print_row)
from imagenet_recipes.bench.common import git_commit
from imagenet_recipes.config import exit_on_usage_error
from imagenet_recipes.errors import UsageError


def main(argv=None) -> None:
    args = parse_cli(argv)
    wall_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    command = shlex.join(["python", "lab/loop.py",
                          *(sys.argv[1:] if argv is None else argv)])

    with tempfile.TemporaryDirectory(prefix="bench_loop-") as logdir:
        try:
            trainer = build_trainer(args, logdir)  # prints its one-line summary
        except UsageError as err:  # unknown -a, --device cuda without a GPU, ...
            exit_on_usage_error(err)
        hw = print_header(args, command, trainer.device)
        bare = BareLoop(trainer)
        batches = make_batches(max(args.steps, args.warmup), args.batch_size, args.image_size,
                               trainer.num_classes, trainer.device, args.channels_last)
        rounds = measure(args, trainer, bare, batches)
        weight_diff = max_weight_difference(trainer.strategy.module, bare.model)
        trainer.close()

    # The headline is the median of the per-round ratios: each pair ran back to back, so slow
    # drifts cancel within a pair. The median row takes each column's median on its own.
    summary = {k: statistics.median(r[k] for r in rounds)
               for k in ("engine_img_s", "bare_img_s", "ratio")}
    print_row("median", summary)
    verdict = "meets" if summary["ratio"] >= args.target else "BELOW"
    print(f"engine/bare img/s ratio: {summary['ratio']:.2f}x (median of {len(rounds)}; "
          f"target >= {args.target}: {verdict})")
    steps_each = args.warmup + args.repeats * args.steps
    print(f"same math check: max |engine - bare| weight after {steps_each} steps each = "
          f"{weight_diff:.3g}")
    runtime = time.perf_counter() - wall_start
    print(f"benchmark runtime: {runtime:.1f}s")

    if args.json:
        record = {"command": command, "commit": git_commit(), "config": vars(args),
                  "hardware": hw, "rounds": rounds,
                  "median": summary,
                  "ratio_of_medians": summary["engine_img_s"] / summary["bare_img_s"],
                  "target": args.target, "max_weight_diff": weight_diff,
                  "runtime_s": runtime}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
