"""Horovod vs DDP throughput in one run: same model, data, batch, precision and process count.

    launch/env.sh python lab/hvd.py                 # 2 processes x 1 thread, CPU, ~4 min
    launch/env.sh python lab/hvd.py --nproc 4 -a resnet50 --image-size 224 -b 64
    launch/env.sh python lab/hvd.py --report runs/bench_hvd-20261123-110000

Runs `torchrun train/ddp.py` and `horovodrun train/hvd.py` in turns (--rounds each, so drifts in
a shared machine's speed hit both alike) on synthetic data (compute and communication only),
reads each run's JSONL log and reports the median img/s of the logged intervals after the first
(warm-up) one, and the Horovod/DDP ratio. The runs' logs and the tool's record (bench_hvd.json:
the command and the order the runs were made in) stay in --out, from which `report` (and
lab/page.py, once archived into lab/records/hvd) writes the studies page's block. A
benchmark, not a test.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from imagenet_recipes.bench.common import (REPO, interval_img_s, logged_hardware, logged_precision,
                          measure_or_report, read_log, shown_command, shown_commit, turns_parser)
from imagenet_recipes.bench.jobs import launcher, stamped_out
from imagenet_recipes.bench.render import render

TEMPLATES = Path(__file__).resolve().parent / "templates"  # this page's prose

RECORD = "bench_hvd.json"
LABELS = {"ddp": "DDP (gloo)", "hvd": "Horovod (gloo)"}


def measure(args) -> Path:
    out = args.out or stamped_out("bench_hvd")
    out.mkdir(parents=True, exist_ok=True)
    common = ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
              "--dummy", "--synthetic-classes", "10", "--synthetic-val-size", "64",
              "--epochs", "1", "--steps-per-epoch", str(args.steps), "-p", "5",
              "--logdir", str(out), *args.extra.split()]
    launchers = {name: launcher(name, args.nproc) for name in LABELS}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    order = []
    for round_ in range(args.rounds):
        for name, launch in launchers.items():
            run_name = f"{name}-{round_}"
            subprocess.run(launch + common + ["--run-name", run_name], check=True, env=env,
                           stdout=subprocess.DEVNULL, cwd=REPO)
            order.append(run_name)
            print(f"{run_name}: {statistics.median(interval_img_s(out / run_name)):.1f} img/s",
                  flush=True)
    record = {"command": shown_command("lab/hvd.py", args.argv), "rounds": args.rounds,
              "steps": args.steps, "threads": args.threads, "order": order}
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return out


def report(folder: Path) -> str:
    """The RESULTS.md block from a measurement's folder: the logs and bench_hvd.json."""
    record = json.loads((folder / RECORD).read_text())
    per_round = {name: [] for name in LABELS}
    pooled = {name: [] for name in LABELS}
    for run_name in record["order"]:
        name = run_name.split("-")[0]
        rates = interval_img_s(folder / run_name)
        per_round[name].append(statistics.median(rates))
        pooled[name] += rates
    median = {name: statistics.median(r) for name, r in pooled.items()}
    first = read_log(folder / record["order"][0])["run"][0]
    cfg = first["config"]
    ratios = [h / d for d, h in zip(per_round["ddp"], per_round["hvd"])]
    rows = [[LABELS[name], f"{median[name]:.1f}", ", ".join(f"{x:.1f}" for x in per_round[name])]
            for name in LABELS]
    rows.append(["**Horovod / DDP**", f"**{median['hvd'] / median['ddp']:.2f}**",
                 ", ".join(f"{x:.2f}" for x in ratios)])
    return render("hvd", TEMPLATES, record=record, cfg=cfg, first=first, rows=rows,
                  precision=logged_precision(first), hardware=logged_hardware(first),
                  commit=shown_commit(first.get("commit")))


def main(argv=None) -> int:
    parser = turns_parser(__doc__, "bench_hvd")
    return measure_or_report(parser, argv, RECORD, measure, report)


if __name__ == "__main__":
    sys.exit(main())
