"""Horovod vs DDP throughput in one run: same model, data, batch, precision and process count.

    launch/env.sh python -m bench.hvd                 # 2 processes x 1 thread, CPU
    launch/env.sh python -m bench.hvd --nproc 4 -a resnet50 --image-size 224 -b 64

Runs `torchrun train/ddp.py` and `horovodrun train/hvd.py` in turns (--rounds each, so drifts in
a shared machine's speed hit both alike) on synthetic data (compute and communication only),
reads each run's JSONL log and reports the median img/s of the logged intervals after the first
(warm-up) one, and the Horovod/DDP ratio. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.common import REPO, read_log, steady
from bench.jobs import launcher


def interval_img_s(run_dir: Path) -> list:
    return steady(read_log(run_dir).get("train", []), "img_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    parser.add_argument("-a", "--arch", default="resnet18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--extra", default="", help="more trainer options, e.g. '--opt-level O1'")
    args = parser.parse_args()

    logdir = Path(tempfile.mkdtemp(prefix="bench_hvd_"))
    common = ["-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
              "--dummy", "--synthetic-classes", "10", "--synthetic-val-size", "64",
              "--epochs", "1", "--steps-per-epoch", str(args.steps), "-p", "5",
              "--logdir", str(logdir), *args.extra.split()]
    launchers = {name: launcher(name, args.nproc) for name in ("ddp", "hvd")}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    rates = {name: [] for name in launchers}
    for round_ in range(args.rounds):
        for name, launch in launchers.items():
            run_name = f"{name}-{round_}"
            subprocess.run(launch + common + ["--run-name", run_name], check=True, env=env,
                           stdout=subprocess.DEVNULL, cwd=REPO)
            rates[name] += interval_img_s(logdir / run_name)
            print(f"{run_name}: {statistics.median(interval_img_s(logdir / run_name)):.1f} img/s",
                  flush=True)
    ddp, hvd = statistics.median(rates["ddp"]), statistics.median(rates["hvd"])
    print(f"\n{args.nproc} processes x {args.threads} thread(s), {args.arch} at "
          f"{args.image_size} px, batch {args.batch_size}/process, synthetic data, "
          f"{args.rounds} rounds of {args.steps} steps each; logs in {logdir}")
    print(f"DDP     {ddp:.1f} img/s (median of {len(rates['ddp'])} intervals)")
    print(f"Horovod {hvd:.1f} img/s (median of {len(rates['hvd'])} intervals)")
    print(f"Horovod/DDP ratio: {hvd / ddp:.2f}")


if __name__ == "__main__":
    main()
