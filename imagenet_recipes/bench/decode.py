"""Decode capacity: each data backend's training input pipeline alone, no model, on the device
that would train: files read, JPEGs decoded, RandomResizedCrop, flip, normalised, a batch ready
on the device. What the loader could feed, to hold against what the GPU trains (bench.gpu
--group scripts): a loader slower than training holds the step back; one faster has room.

    launch/env.sh python -m imagenet_recipes.bench.decode DATA --json runs/decode.json   # a GPU
    launch/env.sh python -m imagenet_recipes.bench.decode DATA --device cpu -b 32 --image-size 64
    python -m imagenet_recipes.bench.gpu --group decode ...       # the same rows, in bench.gpu

Rows, each where it can run (`--only` picks some):
  pytorch -j N        --data-backend pytorch with N loader workers, for N from a few to every core
                      but one (--workers sets the list)
  gpu torchcodec      --data-backend gpu --gpu-decoder torchcodec (nvJPEG's CUDA decoder)
  gpu nvimgcodec      --data-backend gpu --gpu-decoder nvimgcodec (crop regions only; the GPU's
                      hardware JPEG decoder and the CUDA decoder); on a CPU both gpu rows decode
                      with libjpeg-turbo in the training process
  dali-gpu            --data-backend dali-gpu (DALI's mixed decoder, ROI); a GPU only
  dali-cpu            --data-backend dali-cpu
  gpu nvimgcodec-whole
                      --gpu-decoder nvimgcodec-whole (whole images, cropped on the device): only
                      when named by --only, for an nvImageCodec whose regions fail
The gpu rows count the images their decoder refused (decoded by torchvision on the CPU instead):
`cpu_decoded` and its share of every image the row decoded, warm-up batches included. A row with
more than 1 % of them decoded on the CPU is not GPU decoding, and says so.

Each row builds the backend's training loader as the entry scripts do, takes the batches that
its workers may hold ready before the clock starts (prefetch) plus two, then times --batches
batches: images over wall seconds, until the last batch is on the device (a CUDA
synchronisation at the end of the window, none inside it). Beside it: the CPU cores busy over
the window (the whole machine's busy CPU-seconds over the wall seconds), and on a GPU the
hardware JPEG engines' utilisation as nvidia-smi reports it, read every quarter second over the
window: its mean, maximum and number of readings (where nvidia-smi reports it).
The rows run one after the other, each over the same files, in the order listed.
This is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench.common import installed
from imagenet_recipes.bench.jobs import busy_cpu_seconds

DEFAULT_ROWS = ("pytorch", "gpu torchcodec", "gpu nvimgcodec", "dali-gpu", "dali-cpu")
ROWS = (*DEFAULT_ROWS, "gpu nvimgcodec-whole")
DECODER_MODULE = {"gpu torchcodec": "torchcodec", "gpu nvimgcodec": "nvidia.nvimgcodec",
                  "gpu nvimgcodec-whole": "nvidia.nvimgcodec", "dali-gpu": "nvidia.dali",
                  "dali-cpu": "nvidia.dali"}
# More than this share of a gpu row's images decoded on the CPU: the row is not GPU decoding
CPU_DECODED_LIMIT = 0.01


def worker_counts(cores: int) -> List[int]:
    """-j of the pytorch rows: from a few to every core but one."""
    top = max(1, cores - 1)
    return sorted({n for n in (2, 4, 8) if n < top} | {top})


def backend_flags(row: str) -> List[str]:
    if row.startswith("gpu "):
        return ["--data-backend", "gpu", "--gpu-decoder", row.split()[1]]
    return ["--data-backend", row]


def why_not(row: str, device: str) -> Optional[str]:
    """Why the row cannot run here, or None."""
    module = DECODER_MODULE.get(row)
    if module and not installed(module):
        return f"{module} is not installed"
    if row == "dali-gpu" and device != "cuda":
        return "dali-gpu decodes on a GPU"
    return None


class JpegEngineWatch:
    """The hardware JPEG engines' utilisation over the window, as nvidia-smi reports it: read
    every `interval_s` from `delay_s` in until the window ends (None where nvidia-smi is missing
    or reports none). One reading can land in a pause; the mean of many says whether the row's
    decoder used the engines at all."""

    def __init__(self, delay_s: float, interval_s: float = 0.5):
        self.readings: Dict[str, List[str]] = {}
        self._stop = threading.Event()
        self._thread = None
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._watch, args=(delay_s, interval_s),
                                            daemon=True)
            self._thread.start()

    def _watch(self, delay_s: float, interval_s: float) -> None:
        if self._stop.wait(delay_s):
            return
        while True:
            self._read()
            if self._stop.wait(interval_s):
                return

    def _read(self) -> None:
        try:
            out = subprocess.run(["nvidia-smi", "-q", "-d", "UTILIZATION", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        for name, value in re.findall(r"(JPE?G\w*)\s*:\s*([^\n]+)", out):
            self.readings.setdefault(name, []).append(value.strip())

    def result(self) -> Optional[str]:
        """'JPEG 21 % (mean of 12 readings, max 35 %)' per engine line nvidia-smi gives; a
        reading that is not a percentage (N/A) as it was read."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=15)
        return "; ".join(_summary(name, values) for name, values in self.readings.items()) \
            or None


def _summary(name: str, values: List[str]) -> str:
    percents = [float(m[1]) for v in values if (m := re.match(r"(\d+(?:\.\d+)?)\s*%", v))]
    if not percents:
        return f"{name} {values[-1]}"
    mean = sum(percents) / len(percents)
    return (f"{name} {mean:.0f} % (mean of {len(percents)} readings, max "
            f"{max(percents):.0f} %)")


def measure_row(row: str, workers: int, args: argparse.Namespace) -> dict:
    """One row: its loader's batches over a timed window (see the module docstring)."""
    import torch

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data import Shard, build_loaders
    from imagenet_recipes.options import LoaderOptions, PlanOptions
    from imagenet_recipes.run_plan import plan_run

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    # prefetch: what a pytorch-style loader holds ready before the clock starts
    ready = workers * 2 if row == "pytorch" or row.startswith("gpu ") else 2
    warm = ready + 2
    cfg = parse_args(["-a", "resnet50", "-b", str(args.batch_size), "-j", str(workers),
                      "--image-size", str(args.image_size), "--channels-last",
                      "--steps-per-epoch", str(warm + args.batches), *backend_flags(row),
                      str(args.data)], entry="nd")
    train, val, _ = build_loaders(LoaderOptions.of(cfg), Shard(), device,
                                  plan_run(PlanOptions.of(cfg), 1, device.type))
    train.set_epoch(0)
    batches, images, warm_images = iter(train), 0, 0
    try:
        for _ in range(warm):
            warm_images += next(batches)[0].shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        watch = JpegEngineWatch(delay_s=0.25, interval_s=0.25) if device.type == "cuda" \
            else None
        busy, start = busy_cpu_seconds(), time.perf_counter()
        for _ in range(args.batches):
            x, _ = next(batches)
            images += x.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        busy_after = busy_cpu_seconds()
        # the pass's images the batched decoder refused (the gpu backend counts them)
        on_cpu = sum(train.fallbacks.values()) if hasattr(train, "fallbacks") else None
    finally:
        getattr(batches, "close", lambda: None)()  # stops a thread preparing batches ahead
        train.close()
        val.close()
    cores = (busy_after - busy) / seconds if busy is not None and busy_after is not None \
        else None
    name = f"pytorch -j {workers}" if row == "pytorch" else row
    return {"name": name, "backend": row, "workers": workers, "img_s": images / seconds,
            "images": images, "seconds": seconds, "cores_busy": cores,
            "jpeg_engines": watch.result() if watch else None, "status": "ok",
            "cpu_decoded": on_cpu,
            "cpu_decoded_share": None if on_cpu is None else on_cpu / (images + warm_images)}


def cpu_decoded_text(result: dict) -> str:
    """'' for a row that decoded (nearly) everything where it says; else what it decoded on the
    CPU, and that it is no GPU decoding."""
    share = result.get("cpu_decoded_share")
    if share is None or share <= CPU_DECODED_LIMIT:
        return ""
    return (f"{100 * share:.1f} % of its images decoded on the CPU by torchvision "
            f"({result['cpu_decoded']}): not GPU decoding")


def rows_to_run(args: argparse.Namespace) -> List[tuple]:
    """(row, workers) in the order they run."""
    cores = os.cpu_count() or 1
    chosen = args.only.split(",") if args.only else list(DEFAULT_ROWS)
    unknown = set(chosen) - set(ROWS)
    if unknown:
        raise SystemExit(f"bench.decode: unknown rows {sorted(unknown)}; rows: {', '.join(ROWS)}")
    plan = []
    for row in chosen:
        if row == "pytorch":
            counts = [int(n) for n in args.workers.split(",")] if args.workers else \
                worker_counts(cores)
            plan += [(row, n) for n in counts]
        else:
            plan.append((row, max(1, cores - 1)))  # DALI's threads, the gpu rows' file readers
    return plan


def measure(args: argparse.Namespace, report=print) -> List[dict]:
    """Every row that can run here, one after the other; a row that cannot says why."""
    results = []
    for row, workers in rows_to_run(args):
        reason = why_not(row, args.device)
        if reason:
            results.append({"name": row, "backend": row, "status": "skipped", "detail": reason})
            report(f"  {row:<18} skipped: {reason}")
            continue
        try:
            result = measure_row(row, workers, args)
        except Exception as err:  # a backend that fails here must not stop the others
            result = {"name": row, "backend": row, "status": "failed",
                      "detail": f"{type(err).__name__}: {err}"[:400]}
            report(f"  {row:<18} FAILED: {result['detail']}")
        else:
            cores, on_cpu = result["cores_busy"], cpu_decoded_text(result)
            report(f"  {result['name']:<18} {result['img_s']:>9,.0f} img/s  "
                   f"{'' if cores is None else f'{cores:.1f} cores busy'}"
                   f"{'  ' + result['jpeg_engines'] if result['jpeg_engines'] else ''}"
                   f"{'  ' + on_cpu if on_cpu else ''}")
        results.append(result)
    return results


def parse_cli(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m imagenet_recipes.bench.decode",
                                description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path, help="an ImageFolder root with train/ (e.g. bench.gpu "
                   "--prepare-data's set)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="(default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=256, help="(default: %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="(default: %(default)s)")
    p.add_argument("--batches", type=int, default=40,
                   help="timed batches per row (default: %(default)s)")
    p.add_argument("--workers", help="comma-separated -j of the pytorch rows (default: from a "
                   "few to every core but one)")
    p.add_argument("--only", help=f"comma-separated rows: {', '.join(ROWS)}")
    p.add_argument("--json", type=Path, help="the record")
    args = p.parse_args(argv)
    if not (args.data / "train").is_dir():
        p.error(f"{args.data} has no train/ folder")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_cli(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.decode: no CUDA GPU is visible; --device cpu measures the CPU's",
              file=sys.stderr)
        return 2
    from imagenet_recipes.bench.common import device_environment

    env = device_environment(args.device)
    print(f"bench.decode: {env['gpu'] or 'CPU'} | {env['cpu_cores']} cores | batch "
          f"{args.batch_size} at {args.image_size} px, {args.batches} timed batches per row",
          flush=True)
    rows = measure(args, report=lambda line: print(line, flush=True))
    record = {"tool": "bench.decode", "environment": env,
              "config": {k: getattr(args, k) for k in ("device", "batch_size", "image_size",
                                                       "batches")},
              "data": str(args.data), "rows": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
