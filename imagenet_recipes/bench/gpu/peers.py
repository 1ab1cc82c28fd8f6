"""The rows that run other projects' scripts, fetched by the user: bench.e2e's comparison of this
project against timm's train.py and torchvision's reference train.py end to end (the `peers`
group: --timm, --torchvision), and timm's own benchmark.py beside the hand-written step doing the
same work (the `causes` group's timm rows: --timm-benchmark). A script not given: its rows are
skipped, saying so."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List

from imagenet_recipes.bench.gpu.loaders import loader_workers
from imagenet_recipes.bench.gpu.scripts import Context, run_logged
from imagenet_recipes.bench.gpu.units import (PEER_ROWS, Failure, Skip, Unit, new_row,
                                              reference_of)


# --- the peers: bench.e2e -----------------------------------------------------------------------
def measure_peers(ctx: Context, unit: Unit) -> List[dict]:
    """bench.e2e as its own process (its contenders in turns, each started as a user starts
    it), then its record turned into rows: steady-state img/s, and for ours the end-to-end
    ratios against each peer (their wall time over ours, median of the repeats)."""
    args = ctx.args
    scripts = [(flag, path) for flag, path in (("--timm", args.timm),
                                                ("--torchvision", args.torchvision)) if path]
    if not scripts:
        raise Skip("no peer script given (--timm, --torchvision)")
    record_path = ctx.out / "peers.json"
    cmd = [sys.executable, "-m", "imagenet_recipes.bench.e2e",
           *([str(args.peers_data)] if args.peers_data else []),
           *[str(w) for flag, path in scripts for w in (flag, path.resolve())],
           "-a", args.arch, "-b", str(args.batch_size), "-j", str(loader_workers(args)),
           "--epochs", str(args.peers_epochs), "--repeats", str(args.peers_repeats),
           "--train-per-class", str(args.peers_train_per_class), "--val-per-class", "50",
           "--fast-amp", "on" if args.device == "cuda" else "off",
           "--json", str(record_path), "--only", *peer_contenders(args)]
    # --device cpu on a machine with a GPU: the contenders see none, as on a CPU machine
    env = {**os.environ, **({} if args.device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""})}
    run_logged(ctx, "peers", "bench.e2e", cmd, args.peers_timeout, env)
    return peer_rows(json.loads(record_path.read_text()), unit)


def peer_contenders(args: argparse.Namespace) -> List[str]:
    """bench.e2e's contenders to run: ours that --peers-only names (all without it), and every
    peer whose script was given."""
    ours = [c for c in PEER_ROWS if c.startswith("nd ")]
    return [c for c in PEER_ROWS if c not in ours or not args.peers_only
            or c in args.peers_only.split(",")]


def _against(ratios: Dict[tuple, List[float]], contender: str) -> Dict[str, float]:
    """bench.e2e's ratios of `contender` against each other contender: their median."""
    return {theirs: statistics.median(v) for (ours, theirs), v in ratios.items()
            if ours == contender}


def peer_rows(record: dict, unit: Unit) -> List[dict]:
    """bench.e2e's record -> the peers unit's rows, one per contender (one it did not run:
    skipped, saying why)."""
    from imagenet_recipes.bench import e2e

    train_images = record["images"]["train"]
    wall = e2e.ratios(record)
    steady = e2e.ratios(record, steady=True)
    cfg = record["config"]
    rows = []
    for contender, row_name in PEER_ROWS.items():
        runs = [r for r in record["runs"] if r["contender"] == contender]
        rates = [rate for rate in (e2e.steady_img_s(r, train_images) for r in runs) if rate]
        if not rates:
            why = ("not run: " + ("its script was not given" if not contender.startswith("nd")
                                  else "its data backend is not installed here"))
            rows.append(dict(new_row(row_name, unit.name, contender), status="skipped",
                             note=why))
            continue
        config = (f"{record['commands'][contender]}: {cfg['epochs']} epochs of "
                  f"{train_images} generated JPEGs, {cfg['workers']} loader workers")
        rows.append(new_row(
            row_name, unit.name, config, statistics.median(rates), rates,
            reference=reference_of(row_name),
            wall_s=statistics.median(r["wall"] for r in runs),
            end_to_end=_against(wall, contender), steady_vs=_against(steady, contender)))
    return rows


# --- timm's benchmark.py ------------------------------------------------------------------------
def timm_benchmark_rate(output: str) -> float:
    """train_samples_per_sec from the JSON benchmark.py prints after its `--result` line."""
    _, marker, tail = output.rpartition("--result\n")
    if not marker:
        raise Failure("benchmark.py printed no --result")
    try:
        return float(json.loads(tail)["train_samples_per_sec"])
    except (ValueError, KeyError, TypeError) as err:
        raise Failure(f"benchmark.py's result unreadable: {err}") from None


def measure_timm_benchmark(ctx: Context, unit: Unit) -> List[dict]:
    """timm's own train-step benchmark (eager, then --torchcompile) on this tool's model,
    batch, size, half type and classes, each a process of its own: what timm measures as a
    training step, beside the hand-written step doing the same work (step-timm-work)."""
    args = ctx.args
    if not args.timm_benchmark:
        raise Skip("timm's benchmark.py not given (--timm-benchmark)")
    from imagenet_recipes.config import TrainConfig

    steps = args.steps * args.repeats
    base = [sys.executable, str(args.timm_benchmark.resolve()), "--bench", "train",
            "--model", args.arch, "--amp", "--amp-dtype", args.amp_dtype, "--channels-last",
            "-b", str(args.batch_size), "--img-size", str(args.image_size),
            "--num-classes", str(TrainConfig.synthetic_classes), "--device", args.device,
            "--num-warm-iter", str(args.warmup), "--num-bench-iter", str(steps), "--no-retry"]
    rows = []
    for row, extra in zip(unit.rows, ([], ["--torchcompile"])):
        run_logged(ctx, row, "benchmark.py", base + extra, args.row_timeout, dict(os.environ))
        rate = timm_benchmark_rate((ctx.out / f"{row}.console.txt").read_text(errors="replace"))
        shown = " ".join(["benchmark.py", *base[2:], *extra])
        rows.append(new_row(row, unit.name, f"timm {shown}", rate, [rate],
                            reference=reference_of(row)))
    return rows
