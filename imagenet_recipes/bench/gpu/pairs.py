"""The rows measured in this process on batches already on the device: the pairs (bench.bare_loop:
the engine's train step against a hand-written loop with the same model, precision and optimizer,
in alternating rounds; the `loop` and `compile` groups) and the step with one thing changed
(bench.step_variants; the `causes` group's step rows). The engine is set up with the entry
scripts' own flags (--opt-level ... --channels-last); peak memory is each side's as if it ran
alone (imagenet_recipes/bench/bare_loop.py)."""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
from typing import List, Optional

from imagenet_recipes.bench import step_variants
from imagenet_recipes.bench.gpu.units import Failure, Unit, new_row, workload


@contextlib.contextmanager
def loop_trainer(args: argparse.Namespace, level: str, dtype: str, compile_: bool):
    """(bench.bare_loop's arguments, a Trainer set up as the entry scripts set it up, batches
    already on its device) for this tool's sizes, channels_last; the trainer is closed when the
    block ends. A configuration the trainer refuses fails the unit with its message."""
    from imagenet_recipes.bench import bare_loop as loop
    from imagenet_recipes.errors import UsageError

    largs = loop.parse_cli([
        "-a", args.arch, "--image-size", str(args.image_size), "-b", str(args.batch_size),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
        "--opt-level", level, "--amp-dtype", dtype, "--device", args.device, "--channels-last",
        *(["--compile"] if compile_ else [])])
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as logdir:
        try:
            trainer = loop.build_trainer(largs, logdir)
        except UsageError as err:
            raise Failure(str(err)) from None
        try:
            yield largs, trainer, loop.make_batches(
                max(args.steps, args.warmup), args.batch_size, args.image_size,
                trainer.num_classes, trainer.device, True)
        finally:
            trainer.close()


def release_device(device: str) -> None:
    """What a unit measured in this process is gone before the next one starts."""
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_pair(args: argparse.Namespace, unit: Unit, level: str, dtype: str,
                 compile_: bool) -> List[dict]:
    from imagenet_recipes.bench import bare_loop as loop

    with loop_trainer(args, level, dtype, compile_) as (largs, trainer, batches):
        bare = loop.BareLoop(trainer)
        print(f"{'round':>6} {'engine img/s':>13} {'bare img/s':>11} {'engine/bare':>12}",
              flush=True)
        rounds = loop.measure(largs, trainer, bare, batches)
        weight_diff = loop.max_weight_difference(trainer.strategy.module, bare.model)
    del trainer, bare, batches
    release_device(args.device)

    def peak(side: str) -> Optional[int]:
        values = [r[f"{side}_peak_bytes"] for r in rounds if f"{side}_peak_bytes" in r]
        return max(values) if values else None

    config = workload(args, level, dtype) + (", torch.compile" if compile_ else "")
    bare_name, engine_name = unit.rows
    return [
        new_row(bare_name, unit.name, f"bare PyTorch loop: {config}",
                statistics.median(r["bare_img_s"] for r in rounds),
                [r["bare_img_s"] for r in rounds], peak_bytes=peak("bare")),
        new_row(engine_name, unit.name, f"engine (Trainer.train_step): {config}",
                statistics.median(r["engine_img_s"] for r in rounds),
                [r["engine_img_s"] for r in rounds], reference=bare_name,
                peak_bytes=peak("engine"), round_ratios=[r["ratio"] for r in rounds],
                max_weight_diff=weight_diff),
    ]


def measure_variants(args: argparse.Namespace, unit: Unit) -> List[dict]:
    """bench.step_variants in this process: the step with one thing changed, O1 in
    --amp-dtype, each variant against the unit's first (its reference)."""
    compiled = unit.name == "step-compiled"
    variants = step_variants.SETS["compiled" if compiled else "eager"]
    with loop_trainer(args, "O1", args.amp_dtype, compiled) as (largs, trainer, batches):
        results = step_variants.measure(largs, trainer, variants, batches)
    del trainer, batches
    release_device(args.device)
    config = workload(args, "O1", args.amp_dtype) + (", torch.compile" if compiled else "")
    return [new_row(r["name"], unit.name, f"{r['what']}: {config}", r["img_s"], r["repeats"],
                    reference=r["reference"], max_weight_diff=r["max_weight_diff"])
            for r in results]
