"""Input-pipeline throughput, all loaders in one run over one ImageFolder on the same cores.

    launch/env.sh python -m imagenet_recipes.bench.io                    # generated data, all cores
    launch/env.sh python -m imagenet_recipes.bench.io /data/imagenet --images 20000 --figure io.png
    launch/env.sh python -m imagenet_recipes.bench.io --json results/io/bench_io.json   # keep it for RESULTS.md
    launch/env.sh python -m imagenet_recipes.bench.io --workers 1 --json results/io/bench_io_per_core.json

Every contender produces training batches with the same augmentation (RandomResizedCrop to
--image-size with the standard scale/ratio ranges, random horizontal flip) from the same files,
using --workers cores (processes or threads), and is timed over --passes passes after one
warm-up pass, the contenders taking turns; the figure is the median:

  decode PIL            full decode only, PIL (Image.open + convert RGB), one process per core
  decode torchvision    full decode only, torchvision.io.decode_jpeg, one process per core
  classic ImageFolder   torchvision ImageFolder + PIL + RandomResizedCrop + flip + ToTensor +
                        Normalize in a DataLoader, as in pytorch/examples
  timm loader           timm's create_loader as its train.py uses it (PIL, its own
                        RandomResizedCrop, uint8 batches normalised by its PrefetchLoader on the
                        device), colour jitter off
  pytorch backend       this repository's --data-backend pytorch (uint8 decode and batches,
                        normalised on the device)
  DALI CPU-only         --data-backend dali-cpu on a machine without GPU (every op on the CPU):
                        one pipeline for the run, fed each pass's file paths in the sampler's
                        order; DALI's threads read the files (fn.io.file.read)
  DALI cpu / gpu        --data-backend dali-cpu / dali-gpu, when a GPU is present

  DALI CPU stage: random-crop decode / + resize
                        the DALI training pipeline's first operators alone, on the CPU, over
                        the same files: where DALI's time goes (its own file reader,
                        fn.readers.file, with the files in a fixed order; no flip,
                        normalisation or hand-over to torch)

The two decode-only rows are the ceiling for a CPU loader (no crop, resize or batching at all).
Prints a Markdown table (--figure PATH: draws it too) with the img/s and the CPU seconds per image
(the whole machine's busy time: measure on a quiet machine); --json keeps the measurement's record
(for results/io/: bench_io_per_core.json with one worker, bench_io.json with all cores, from which
bench.regenerate rewrites RESULTS.md's block, figures/io_per_core.png and figures/io.png, and
estimates from the one-worker rate what the `pytorch` backend feeds a GPU with N cores each).
This is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

import torch
import torchvision
from torchvision import transforms

from imagenet_recipes.bench.common import (cpu_cores, git_commit, machine, shown_command,
                          shown_commit)
from imagenet_recipes.bench.jobs import busy_cpu_seconds, dataset_command, make_dataset
from imagenet_recipes.bench.render import render

from imagenet_recipes.config import parse_args
from imagenet_recipes.data import IMAGENET_MEAN, IMAGENET_STD, build_loaders
from imagenet_recipes.options import LoaderOptions, PlanOptions
from imagenet_recipes.run_plan import plan_run
from imagenet_recipes.strategies import Strategy

# --- decode-only ceilings ------------------------------------------------------------------------
def _decode_pil(path: str) -> int:
    from PIL import Image
    with Image.open(path) as image:
        return image.convert("RGB").size[0]


def _decode_torchvision(path: str) -> int:
    torch.set_num_threads(1)
    data = torchvision.io.read_file(path)
    return torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB).shape[-1]


def decode_only(decode, paths, workers: int):
    """-> a function running one pass: every file decoded once across `workers` processes."""
    pool = ProcessPoolExecutor(workers)
    chunk = max(1, len(paths) // (workers * 8))

    def one_pass() -> int:
        return sum(1 for _ in pool.map(decode, paths, chunksize=chunk))
    one_pass.close = pool.shutdown
    return one_pass


def dali_cpu_stages(paths, resize_to: Optional[int], batch: int, workers: int):
    """-> one pass of the first operators of the DALI training pipeline, every one on the CPU:
    the random-crop decode, and with `resize_to` the resize after it. No flip, normalisation,
    hand-over to torch or file reading in Python: what DALI's own work costs, stage by stage."""
    from imagenet_recipes.data.dali import import_dali, random_crop_decode
    fn, types, pipeline_def, _, _ = import_dali()

    def graph():
        encoded, _ = fn.readers.file(files=list(paths))
        images = random_crop_decode(fn, types, encoded, "cpu")
        return fn.resize(images, resize_x=resize_to, resize_y=resize_to) if resize_to else images

    # No prefetching: a batch queued ahead would still be computing when the pass's clock
    # stops, on the next contender's time.
    pipe = pipeline_def(graph, batch_size=batch, num_threads=workers, device_id=None, seed=0,
                        prefetch_queue_depth=1)()
    pipe.build()

    def one_pass() -> int:
        for _ in range(len(paths) // batch):
            pipe.run()
        return len(paths) // batch * batch
    one_pass.close = lambda: None
    return one_pass


# --- loaders -------------------------------------------------------------------------------------
def classic_imagefolder(train_dir: Path, batch: int, size: int, workers: int):
    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    dataset = torchvision.datasets.ImageFolder(str(train_dir), tf)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                         num_workers=workers, persistent_workers=True,
                                         drop_last=True)
    return _loader_pass(loader)


def timm_loader(train_dir: Path, batch: int, size: int, workers: int):
    """timm's training loader as its train.py builds it on this machine's device: PIL decode,
    RandomResizedCropAndInterpolation + flip in the workers, uint8 batches normalised by its
    PrefetchLoader on the device. Colour jitter off (train.py's default 0.4 jitters colours; the
    other loaders do not)."""
    from timm.data import create_dataset, create_loader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = create_dataset("", root=str(train_dir), is_training=True)
    loader = create_loader(dataset, input_size=(3, size, size), batch_size=batch,
                           is_training=True, color_jitter=0.0, num_workers=workers,
                           device=device, use_prefetcher=True, persistent_workers=True,
                           pin_memory=device.type == "cuda")
    return _loader_pass(loader, sync=device.type == "cuda")


def recipe_train_loader(data: Path, backend: str, batch: int, size: int, workers: int,
                        device: torch.device):
    """The training loader a run of this repository would use, built the same way."""
    cfg = parse_args(["-b", str(batch), "--image-size", str(size), "-j", str(workers),
                      "--data-backend", backend, str(data)])
    shard = Strategy().data_shard()
    plan = plan_run(PlanOptions.of(cfg), shard.world_size, device.type)
    return build_loaders(LoaderOptions.of(cfg), shard, device, plan)[0]


def recipe_backend(data: Path, backend: str, batch: int, size: int, workers: int):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = recipe_train_loader(data, backend, batch, size, workers, device)
    return _loader_pass(train, sync=device.type == "cuda", epochs=True)


def _loader_pass(loader, sync: bool = False, epochs: bool = False):
    state = {"epoch": 0}

    def one_pass() -> int:
        if epochs:
            loader.set_epoch(state["epoch"])
            state["epoch"] += 1
        count = sum(len(targets) for _, targets in loader)
        if sync:
            torch.cuda.synchronize()
        return count
    one_pass.close = getattr(loader, "close", lambda: None)
    return one_pass


def measure(passes_by_name: dict, passes: int) -> dict:
    """Warm every contender up, then time them in turns (pass 1 of each, pass 2 of each, ...) so
    that drifts in a shared machine's speed hit all of them alike; median per contender. The CPU
    seconds per image are the whole machine's busy time over the pass (/proc/stat: the workers,
    the process consuming the batches, and anything else running, so measure on a quiet
    machine), median of the passes."""
    for one_pass in passes_by_name.values():
        one_pass()  # warm-up: worker start, pipeline build, page cache
    rates = {name: [] for name in passes_by_name}
    cpu = {name: [] for name in passes_by_name}
    for _ in range(passes):
        for name, one_pass in passes_by_name.items():
            start, busy = time.perf_counter(), busy_cpu_seconds()
            images = one_pass()
            rates[name].append(images / (time.perf_counter() - start))
            if busy is not None:
                cpu[name].append((busy_cpu_seconds() - busy) / images)
    for one_pass in passes_by_name.values():
        one_pass.close()
    return {name: {"img_s": statistics.median(r), "runs": [round(x, 1) for x in r],
                   "cpu_ms_per_image": (round(1000 * statistics.median(cpu[name]), 3)
                                        if cpu[name] else None)}
            for name, r in rates.items()}


# --- report --------------------------------------------------------------------------------------
def kind(record: dict) -> tuple:
    """-> (file, title, figure) of a record in results/io/: one worker, or all cores."""
    return RECORDS[0] if record["config"]["workers"] == 1 else RECORDS[1]


def table(record: dict, estimate: Optional[dict] = None) -> str:
    """A RESULTS.md block from a measurement's record (what --json writes)."""
    results, cfg = record["results"], record["config"]
    name, title, figure = kind(record)
    classic = results.get("classic ImageFolder", {}).get("img_s")
    ceiling = max((r["img_s"] for loader, r in results.items() if loader.startswith("decode")),
                  default=None)
    rows = [[loader, f"{r['img_s']:.0f}", f"{r['img_s'] / cfg['workers']:.0f}",
             f"{r['cpu_ms_per_image']:.2f}" if r.get("cpu_ms_per_image") else "-",
             f"{r['img_s'] / classic:.2f}x" if classic else "-",
             f"{100 * r['img_s'] / ceiling:.0f}%" if ceiling else "-",
             ", ".join(f"{x:.0f}" for x in r["runs"])] for loader, r in results.items()]
    return render("io", record=record, cfg=cfg, commit=shown_commit(record["commit"]),
                  rows=rows, name=name, title=title, figure=figure, estimate=estimate)


def plot(record: dict, path: Path) -> None:
    import matplotlib.patches

    from imagenet_recipes.bench.figure import plt, save_figure

    results, cfg = record["results"], record["config"]
    names = list(results)
    rates = [results[n]["img_s"] for n in names]
    kinds = {"decode only (the ceiling: no crop, resize or batching)": "#999999",
             "PyTorch DataLoader": "#4477aa", "NVIDIA DALI": "#76b900"}
    colors = [kinds["decode only (the ceiling: no crop, resize or batching)"]
              if n.startswith("decode") else kinds["PyTorch DataLoader"] if "DALI" not in n
              else kinds["NVIDIA DALI"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
    ax.barh(names[::-1], rates[::-1], color=colors[::-1])
    # every pass as a tick on its bar (the spread the median hides), the median after them
    for y, name in enumerate(names[::-1]):
        runs = results[name]["runs"]
        ax.plot(runs, [y] * len(runs), "|", color="black", markersize=10)
        ax.text(max(runs), y, f"  {results[name]['img_s']:.0f}", va="center")
    ax.set_xlabel("images / s (higher is better); bar: median, ticks: single passes")
    ax.set_title(f"{record['hardware']}\n{record['images']} JPEGs, {cfg['workers']} worker(s), "
                 f"crop {cfg['image_size']}, batch {cfg['batch_size']}", fontsize=9)
    ax.set_xlim(0, max(max(results[n]["runs"]) for n in names) * 1.15)
    # one entry per line: the long row labels push the axes right, and a one-line legend
    # centred under them ran off the figure
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=k) for k, c in kinds.items()
                       if c in colors], fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.2), ncol=1)
    save_figure(fig, path, dpi=120)


# The records bench.regenerate renders, in this order: (file, title, figure)
RECORDS = (("bench_io_per_core.json", "Per core", "io_per_core.png"),
           ("bench_io.json", "All cores", "io.png"))

# The GPU node estimate: cores per GPU on common 8-GPU nodes (DGX H100/H200: 112 cores, 14
# per GPU) and on the single-GPU machines of results/gpu/ (16)
CORES_PER_GPU = (4, 8, 12, 16)


def h200_rates(gpu_folder: Path) -> Optional[dict]:
    """From the H200's kept bench.gpu record: its synthetic training rate, and what the
    `pytorch` backend fed it with its workers. None where the record is not kept."""
    path = gpu_folder / "h200_scripts.json"
    if not path.exists():
        return None
    rows = {row["name"]: row for row in json.loads(path.read_text())["rows"]}
    loader = rows.get("pytorch-loader")
    return {"synthetic": rows["nd-synthetic"]["img_s"],
            "loader": loader["img_s"] if loader else None,
            "workers": loader["detail"]["workers"] if loader else None}


def gpu_feed_estimate(record: dict, h200: Optional[dict]) -> Optional[dict]:
    """What the `pytorch` backend feeds one GPU with N cores per GPU and its default N - 1
    workers, two ways: from a one-worker record's rate on this machine (a worker alone, its
    batches consumed by an idle process), and from what each worker delivered on the H200 node
    (beside a training process on the same cores); against the H200's synthetic training rate.
    None without a one-worker record of the backend or the H200's record."""
    row = record["results"].get("pytorch backend")
    if record["config"]["workers"] != 1 or row is None or not h200 or not h200["loader"]:
        return None
    here, synthetic = row["img_s"], h200["synthetic"]
    node = h200["loader"] / h200["workers"]
    return {"here": f"{here:.0f}", "node": f"{node:.0f}", "node_workers": h200["workers"],
            "node_measured": f"{h200['loader']:,.0f}", "synthetic": f"{synthetic:,.0f}",
            "rows": [[str(n), f"{(n - 1) * here:,.0f} ({(n - 1) * here / synthetic:.2f}x)",
                      f"{(n - 1) * node:,.0f} ({(n - 1) * node / synthetic:.2f}x)"]
                     for n in CORES_PER_GPU]}


def block(folder: Path, figures: Path) -> str:
    """bench.regenerate's section: a table and a figure per record kept in results/io/ (one
    worker, then all cores), and the GPU node estimate from the one-worker record."""
    h200 = h200_rates(folder.parent / "gpu")
    parts = []
    for name, title, figure in RECORDS:
        path = folder / name
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        plot(record, figures / figure)
        parts.append(table(record, gpu_feed_estimate(record, h200)))
    return "\n\n".join(parts)


def main(argv=None) -> None:
    cores = cpu_cores()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="?", help="ImageFolder root with train/ (default: "
                        "generate one of --images JPEGs of 300-500 px)")
    parser.add_argument("--images", type=int, default=1280, help="images to read per pass")
    parser.add_argument("--workers", type=int, default=cores, help="cores to use (default all)")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="run only these contenders (name prefixes)")
    parser.add_argument("--figure", type=Path, help="draw the figure here too")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the measurement's record here (for results/io/)")
    args = parser.parse_args(argv)

    tmp = None
    if args.data:
        data = Path(args.data)
        args.data_description = str(data)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_io_")
        data = Path(tmp.name)
        classes = 10
        make_dataset(dataset_command(data, classes, args.images // classes, 1, 300, 500,
                                     workers=None))
        args.data_description = "generated, 300-500 px, quality 90"
    paths = sorted(str(p) for p in (data / "train").rglob("*") if p.is_file())[:args.images]

    torch.set_num_threads(1)  # the main process only batches; workers do the decoding
    gpu = torch.cuda.is_available()
    contenders = {
        "decode PIL": lambda: decode_only(_decode_pil, paths, args.workers),
        "decode torchvision": lambda: decode_only(_decode_torchvision, paths, args.workers),
        "classic ImageFolder": lambda: classic_imagefolder(data / "train", args.batch_size,
                                                           args.image_size, args.workers),
        "timm loader": lambda: timm_loader(data / "train", args.batch_size, args.image_size,
                                           args.workers),
        "pytorch backend": lambda: recipe_backend(data, "pytorch", args.batch_size,
                                                  args.image_size, args.workers),
        "DALI cpu" if gpu else "DALI CPU-only": lambda: recipe_backend(
            data, "dali-cpu", args.batch_size, args.image_size, args.workers),
    }
    contenders["DALI CPU stage: random-crop decode"] = lambda: dali_cpu_stages(
        paths, None, args.batch_size, args.workers)
    contenders[f"DALI CPU stage: + resize to {args.image_size}"] = lambda: dali_cpu_stages(
        paths, args.image_size, args.batch_size, args.workers)
    if gpu:
        contenders["DALI gpu"] = lambda: recipe_backend(data, "dali-gpu", args.batch_size,
                                                        args.image_size, args.workers)
    chosen = {name: make() for name, make in contenders.items()
              if not args.only or any(name.startswith(prefix) for prefix in args.only)}
    results = measure(chosen, args.passes)
    for name, r in results.items():
        print(f"{name:30s} {r['img_s']:8.1f} img/s  passes {r['runs']}", flush=True)

    record = {"command": shown_command("io", argv if argv is not None else sys.argv[1:]),
              "commit": git_commit(), "hardware": machine(gpu=gpu), "images": len(paths),
              "data_description": args.data_description,
              "config": {k: getattr(args, k) for k in ("workers", "batch_size", "image_size",
                                                       "passes")},
              "results": results}
    text = table(record)
    print("\n" + text)
    if args.figure:
        plot(record, args.figure)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
