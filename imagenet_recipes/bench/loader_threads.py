"""The `pytorch` backend's loader workers as processes (what it runs) or as threads, measured.

    launch/env.sh python -m imagenet_recipes.bench.loader_threads             # generated data
    launch/env.sh python -m imagenet_recipes.bench.loader_threads --json results/io/loader_threads.json
    python -m imagenet_recipes.bench.loader_threads --images 3200 --counts 1 8 15 --passes 3
                                                             # a 16-core GPU node, 15 workers

The training loader's samples (region decode, resize, flip: ImageFolderUint8) and batches
(collate_uint8) made two ways from the same files: by its DataLoader's worker processes, as a
run makes them, and by a pool of threads inside the consuming process, each thread making whole
batches as a worker does (SPDL's design; the decoder and torch's resize release the GIL). Three
measurements, the contenders taking turns:

  alone          img/s with k processes, then k threads, for k = 1 and --workers (--counts:
                 others); median of --passes passes after a warm-up pass (bench.io's method)
  GIL per sample the share of a sample's time its thread holds the GIL, from py-spy (a
                 sampling profiler, `pip install py-spy`) watching a process that makes
                 samples in one thread: every sample of it, then only those where it holds the
                 GIL. Threads in one process make at most one sample per GIL time, whatever the
                 cores.
  beside a step  a training step's rate alone, beside the backend's default number of loader
                 processes (--workers - 1: a core left for the training process) and beside as
                 many loader threads (SPDL warns that loading threads slow the training thread),
                 and the loader's rate meanwhile. The step is launch-bound as a GPU step is on
                 the CPU: an MLP of 100 layers of 32 units, batch 8, one thread, whose time is
                 Python and operator dispatch rather than arithmetic.

The threads' samples draw their crop boxes and flips from torch's global generator, which the
threads share, so they are not each sample key's own as the processes' are; each is drawn from
the same law, so the work per sample is the same. This is a benchmark, not a loader to train
with, and not a test.
"""
from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence

import torch

from imagenet_recipes.bench.common import (cpu_cores, git_commit, machine, shown_command,
                                           shown_commit)
from imagenet_recipes.bench.io import measure, recipe_train_loader
from imagenet_recipes.bench.jobs import dataset_command, make_dataset
from imagenet_recipes.bench.render import render
from imagenet_recipes.data.folders import UInt8Batch, collate_uint8
from imagenet_recipes.data.loading import default_workers

PREFETCH = 2  # batches in flight per worker: DataLoader's default prefetch_factor


def process_pass(loader) -> Callable[[], int]:
    """-> one pass of the backend's training loader: its worker processes' uint8 batches, each
    released once counted (a run releases it once normalised)."""
    state = {"epoch": 0}

    def one_pass() -> int:
        loader.set_epoch(state["epoch"])
        state["epoch"] += 1
        count = 0
        for batch in loader.loader:
            count += len(batch.targets)
            one_pass.made += len(batch.targets)
            loader.slots.release(batch.tag)
        return count
    one_pass.close, one_pass.made = (lambda: None), 0
    return one_pass


class ThreadBatches:
    """The batches of a training loader's sampler made by `threads` threads of this process,
    each batch by one thread as a worker makes it (the samples, then collate_uint8), in the
    sampler's order, PREFETCH per thread in flight. Each thread has its own copy of the
    dataset, so its own nvImageCodec decoder (one decoder must not serve two threads)."""

    def __init__(self, loader, threads: int):
        self.dataset, self.batch_size = loader.loader.dataset, loader.loader.batch_size
        self.sampler, self.threads = loader.sampler, threads
        self.pool = ThreadPoolExecutor(threads)
        self.local = threading.local()

    def _make(self, keys: Sequence) -> UInt8Batch:
        if not hasattr(self.local, "dataset"):
            self.local.dataset = pickle.loads(pickle.dumps(self.dataset))
        return collate_uint8([self.local.dataset[key] for key in keys])

    def epoch(self, epoch: int) -> Iterator[UInt8Batch]:
        """One epoch's batches (the last partial batch dropped, as training drops it)."""
        self.sampler.set_epoch(epoch)
        keys, size = list(self.sampler), self.batch_size
        pending = deque()
        for start in range(0, len(keys) - size + 1, size):
            pending.append(self.pool.submit(self._make, keys[start:start + size]))
            if len(pending) >= PREFETCH * self.threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def thread_pass(loader, threads: int) -> Callable[[], int]:
    """-> one pass of ThreadBatches over the loader's sampler, counted like process_pass."""
    batches = ThreadBatches(loader, threads)
    state = {"epoch": 0}

    def one_pass() -> int:
        count = 0
        for batch in batches.epoch(state["epoch"]):
            count += len(batch.targets)
            one_pass.made += len(batch.targets)
        state["epoch"] += 1
        return count
    one_pass.close, one_pass.made = batches.pool.shutdown, 0
    return one_pass


# --- the GIL a sample holds ----------------------------------------------------------------------
def sample_loop(loader, seconds: float) -> float:
    """Make the loader's training batches in this thread for `seconds`: py-spy's subject.
    -> microseconds per sample."""
    dataset, batch = loader.loader.dataset, loader.loader.batch_size
    loader.sampler.set_epoch(0)
    keys = list(loader.sampler)
    made, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for first in range(0, len(keys) - batch + 1, batch):
            collate_uint8([dataset[key] for key in keys[first:first + batch]])
            made += batch
    return (time.perf_counter() - start) / made * 1e6


def _spied_samples(stacks: str) -> int:
    """py-spy's raw output ("frame;frame;... count" per line): the samples inside
    sample_loop."""
    return sum(int(line.rpartition(" ")[2]) for line in stacks.splitlines()
               if f"{sample_loop.__name__} (" in line)


def py_spy() -> str:
    """py-spy's program, or exit saying how to install it."""
    # pip puts it beside python in a virtualenv; a system Python's pip puts it on the PATH
    beside = Path(sys.executable).with_name("py-spy")
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed (not beside python, not on the PATH): pip "
                         "install py-spy (requirements.txt and the package's [tools] extra "
                         "have it)")
    return spy


def gil_share(spy: str, data: Path, batch: int, size: int, seconds: float) -> dict:
    """The share of a sample's time its thread holds the GIL: py-spy (`spy`) samples a process
    making samples in its main thread (sample_loop) twice, once at every sample and once only
    where the thread holds the GIL, at 200 Hz; the share is the ratio of the two counts."""
    child = [sys.executable, "-m", "imagenet_recipes.bench.loader_threads", str(data),
             "-b", str(batch), "--image-size", str(size), "--sample-loop", str(seconds)]
    counts, sample_us = [], []
    with tempfile.TemporaryDirectory(prefix="py_spy_") as tmp:
        for only_gil in ([], ["--gil"]):
            out = Path(tmp) / "stacks.txt"
            run = subprocess.run([spy, "record", "--rate", "200", "--format", "raw",
                                  "--idle", *only_gil, "-o", str(out), "--", *child],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"py-spy failed ({run.returncode}): {run.stderr[-2000:]}")
            counts.append(_spied_samples(out.read_text()))
            # py-spy writes its own lines to the same stdout
            line = next(text for text in run.stdout.splitlines()
                        if text.startswith("sample_us "))
            sample_us.append(float(line.split()[1]))
    every, holding = counts
    return {"share": holding / every, "samples": every, "samples_holding": holding,
            "sample_us": statistics.median(sample_us)}


# --- beside a training step ----------------------------------------------------------------------
def launch_bound_step() -> Callable[[], None]:
    """A training step whose time is Python and dispatch (module docstring)."""
    layers = [m for _ in range(100) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 32)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
    return step


def step_rate_beside(step: Callable[[], None], one_pass: Optional[Callable[[], int]],
                     seconds: float) -> dict:
    """The step's rate over `seconds` while a thread runs loader passes (None: no loader), and
    the loader's images per second meanwhile (counted per batch). A pass is never left early:
    a process loader's batches in flight would keep their memory slots."""
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            one_pass()

    feeder = threading.Thread(target=load) if one_pass else None
    if feeder:
        feeder.start()
        time.sleep(min(1.0, seconds / 4))  # past the first batches' start
    made_before = one_pass.made if feeder else 0
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    took = time.perf_counter() - start
    made = one_pass.made - made_before if feeder else None
    stop.set()
    if feeder:
        feeder.join()
    return {"step_s": steps / took, "img_s": made / took if feeder else None}


def beside_step(passes: Dict[str, Callable[[], int]], rounds: int, seconds: float) -> dict:
    """{contender: {"step_s": median, "img_s": median, runs}} with "step alone" first, in
    turns."""
    step = launch_bound_step()
    for _ in range(50):
        step()  # warm-up
    contenders = {"step alone": None, **passes}
    runs = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, one_pass in contenders.items():
            runs[name].append(step_rate_beside(step, one_pass, seconds))
    return {name: {"step_s": statistics.median(r["step_s"] for r in rs),
                   "step_s_runs": [round(r["step_s"], 1) for r in rs],
                   "img_s": (statistics.median(r["img_s"] for r in rs)
                             if rs[0]["img_s"] is not None else None)}
            for name, rs in runs.items()}


# --- the report ----------------------------------------------------------------------------------
RECORD = "loader_threads.json"  # in results/io/, rendered after bench.io's records


def block(record: dict) -> str:
    """RESULTS.md's part for a record (what --json writes)."""
    alone, cfg = record["alone"], record["config"]
    counts = sorted({int(name.split(", ")[1]) for name in alone})
    rows = []
    for k in counts:
        processes, threads = alone[f"processes, {k}"]["img_s"], alone[f"threads, {k}"]["img_s"]
        rows.append([str(k), f"{processes:.0f}", f"{threads:.0f}",
                     f"{threads / processes:.2f}x"])
    gil = record["gil"]
    held_us = gil["share"] * gil["sample_us"]
    ceiling = 1e6 / held_us
    one_worker = alone["processes, 1"]["img_s"]
    step_alone = record["beside_step"]["step alone"]["step_s"]
    beside = [[name, f"{r['step_s']:.0f}", f"{r['step_s'] / step_alone:.2f}x",
               f"{r['img_s']:.0f}" if r["img_s"] is not None else "-"]
              for name, r in record["beside_step"].items()]
    beside_workers = [name for name in record["beside_step"] if name != "step alone"][0]
    return render("io_threads", record=record, cfg=cfg, commit=shown_commit(record["commit"]),
                  name=RECORD, alone=rows, beside=beside,
                  beside_workers=beside_workers.split(", ")[1],
                  step_seconds=f"{cfg['step_seconds']:g}", rounds=len(
                      record["beside_step"]["step alone"]["step_s_runs"]),
                  gil={"share": f"{100 * gil['share']:.0f}", "held": f"{held_us:.0f}",
                       "sample": f"{gil['sample_us']:.0f}", "samples": gil["samples"],
                       "holding": gil["samples_holding"],
                       "ceiling": f"{ceiling:,.0f}", "workers": f"{ceiling / one_worker:.1f}"})


# --- the tool ------------------------------------------------------------------------------------
def contenders(data: Path, batch: int, size: int, counts: Sequence[int]
                ) -> Dict[str, Callable[[], int]]:
    """"processes, k" and "threads, k" for each k of `counts`, in that order."""
    passes = {}
    for k in counts:
        loader = recipe_train_loader(data, "pytorch", batch, size, k, torch.device("cpu"))
        passes[f"processes, {k}"] = process_pass(loader)
        passes[f"threads, {k}"] = thread_pass(loader, k)
    return passes


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", help="ImageFolder root with train/ (default: "
                        "generate one of --images JPEGs of 300-500 px)")
    parser.add_argument("--images", type=int, default=1280,
                        help="images to generate (a pass reads the train/ set once)")
    parser.add_argument("--workers", type=int, default=cpu_cores(),
                        help="the most processes or threads (default: every core)")
    parser.add_argument("--counts", type=int, nargs="+", metavar="K",
                        help="the numbers of processes and of threads measured alone, "
                             "besides 1 (default: --workers)")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=8.0,
                        help="how long each step measurement runs")
    parser.add_argument("--gil-seconds", type=float, default=15.0,
                        help="how long py-spy samples each of its two runs")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the measurement's record here (for results/io/)")
    parser.add_argument("--sample-loop", type=float, metavar="SECONDS",
                        help=argparse.SUPPRESS)  # the process py-spy samples (gil_share)
    args = parser.parse_args(argv)
    if args.sample_loop:
        torch.set_num_threads(1)
        loader = recipe_train_loader(Path(args.data), "pytorch", args.batch_size,
                                     args.image_size, 0, torch.device("cpu"))
        print(f"sample_us {sample_loop(loader, args.sample_loop):.1f}")
        return {}

    spy = py_spy()  # before anything is measured
    tmp = None
    if args.data:
        data, description = Path(args.data), str(args.data)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_loader_threads_")
        data, description = Path(tmp.name), "generated, 300-500 px, quality 90"
        make_dataset(dataset_command(data, 10, args.images // 10, 1, 300, 500, workers=None))
    torch.set_num_threads(1)  # the consuming process: one thread, as in bench.io
    counts = sorted({1, *(args.counts or [args.workers])})  # 1: the block's per-worker rate
    alone = measure(contenders(data, args.batch_size, args.image_size, counts), args.passes)
    for name, r in alone.items():
        print(f"alone    {name:14s} {r['img_s']:8.1f} img/s", flush=True)
    gil = gil_share(spy, data, args.batch_size, args.image_size, args.gil_seconds)
    print(f"GIL      held {gil['share']:.0%} of a {gil['sample_us']:.0f} us sample", flush=True)
    # beside the step, the backend's default worker count: a core left for the training process
    beside_workers = default_workers(1, args.workers)
    passes = contenders(data, args.batch_size, args.image_size, [beside_workers])
    beside = beside_step(passes, rounds=3, seconds=args.step_seconds)
    for name, r in beside.items():
        rate = f", loader {r['img_s']:.0f} img/s" if r["img_s"] is not None else ""
        print(f"step     {name:14s} {r['step_s']:8.1f} steps/s{rate}", flush=True)
    for one_pass in passes.values():
        one_pass.close()

    record = {"command": shown_command("loader_threads",
                                       argv if argv is not None else sys.argv[1:]),
              "commit": git_commit(), "hardware": machine(), "data_description": description,
              "config": {**{k: getattr(args, k) for k in ("images", "workers", "batch_size",
                                                          "image_size", "passes",
                                                          "step_seconds", "gil_seconds")},
                         "counts": counts},
              "alone": alone, "gil": gil, "beside_step": beside}
    print("\n" + block(record))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if tmp:
        tmp.cleanup()
    return record


if __name__ == "__main__":
    main()
