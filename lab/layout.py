"""NCHW or channels_last: one training step of the same model in each memory layout, crop size by
crop size, in turns. The measurement behind the CPU default of `--channels-last` (unset: on from
`imagenet_recipes.run_plan.CPU_CHANNELS_LAST_MIN_CROP` px up).

    launch/env.sh python lab/layout.py                  # resnet18, CPU, ~1 min on 2 cores
    launch/env.sh python lab/layout.py --sizes 64 224 -a resnet50 -b 16
    launch/env.sh python lab/layout.py \
        --json lab/records/layout/bench_layout.json

For every crop size: the model (torchvision, fresh weights, 1000 classes) is built once per
layout, warmed up by one step, then each layout takes --steps fp32 SGD steps
(forward, cross-entropy, backward, step) on a fixed random batch, in --rounds turns; a layout's
step time is its fastest round's median step. The speed-up is NCHW's step time over
channels_last's (above 1: channels_last is faster). This is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from imagenet_recipes.bench.common import (cpu_cores, cpu_name, git_commit, shown_command,
                          shown_commit)
from imagenet_recipes.bench.render import render

TEMPLATES = Path(__file__).resolve().parent / "templates"  # this page's prose

LAYOUTS = ("NCHW", "channels_last")


def step_times(arch: str, size: int, batch: int, steps: int, rounds: int) -> dict:
    """layout -> seconds per training step (the fastest round's median)."""
    import torch
    import torch.nn.functional as F
    import torchvision

    trainers = {}
    for layout in LAYOUTS:
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        torch.manual_seed(0)
        model = torchvision.models.get_model(arch).to(memory_format=fmt)
        images = torch.randn(batch, 3, size, size).contiguous(memory_format=fmt)
        labels = torch.randint(0, 1000, (batch,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, images=images, labels=labels, opt=opt) -> float:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            return time.perf_counter() - start

        step()  # warm-up: oneDNN builds its kernels for these shapes
        trainers[layout] = step
    best = {layout: float("inf") for layout in LAYOUTS}
    for _ in range(rounds):
        for layout, step in trainers.items():
            best[layout] = min(best[layout], statistics.median(step() for _ in range(steps)))
    return best


def table(record: dict) -> str:
    """The RESULTS.md block of a record."""
    rows = [[f"{r['size']} px", f"{r['NCHW'] * 1e3:.0f}", f"{r['channels_last'] * 1e3:.0f}",
             f"**{r['NCHW'] / r['channels_last']:.2f}x**"] for r in record["sizes"]]
    return render("layout", TEMPLATES, record=record, rows=rows,
                  commit=shown_commit(record["commit"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 1)[1])
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 96, 112, 128, 160, 224])
    parser.add_argument("--steps", type=int, default=3, help="steps per round and layout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    import torch
    record = {"command": shown_command("lab/layout.py", list(argv if argv is not None
                                                        else sys.argv[1:])),
              "arch": args.arch, "batch": args.batch_size, "threads": torch.get_num_threads(),
              "cpu": cpu_name(), "cores": cpu_cores(), "torch": torch.__version__,
              "commit": git_commit(), "sizes": []}
    for size in args.sizes:
        times = step_times(args.arch, size, args.batch_size, args.steps, args.rounds)
        record["sizes"].append({"size": size, **times})
        print(f"{size} px: NCHW {times['NCHW'] * 1e3:.0f} ms, channels_last "
              f"{times['channels_last'] * 1e3:.0f} ms per step", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    print("\n" + table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
