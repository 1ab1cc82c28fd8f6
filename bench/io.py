"""Input-pipeline throughput, all loaders in one run over one ImageFolder on the same cores.

    launch/env.sh python -m bench.io                    # generated data, all cores
    launch/env.sh python -m bench.io /data/imagenet --images 20000 --update-results

Every contender produces training batches with the same augmentation (RandomResizedCrop to
--image-size with the standard scale/ratio ranges, random horizontal flip) from the same files,
using --workers cores (processes or threads), and is timed over --passes passes after one
warm-up pass, the contenders taking turns; the figure is the median:

  decode PIL            full decode only, PIL (Image.open + convert RGB), one process per core
  decode torchvision    full decode only, torchvision.io.decode_jpeg, one process per core
  classic ImageFolder   torchvision ImageFolder + PIL + RandomResizedCrop + flip + ToTensor +
                        Normalize in a DataLoader, as in pytorch/examples
  pytorch backend       this repository's --data-backend pytorch (uint8 decode and batches,
                        normalised on the device)
  DALI CPU-only         --data-backend dali-cpu on a machine without GPU (every op on the CPU);
                        it builds a pipeline per epoch (each epoch has its own file order), so
                        "steady state" also shows one pipeline reused, as in long epochs
  DALI cpu / gpu        --data-backend dali-cpu / dali-gpu, when a GPU is present

The two decode-only rows are the ceiling for a CPU loader (no crop, resize or batching at all).
Writes figures/io.png and a Markdown table; --update-results puts the table into RESULTS.md.
This is a benchmark, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torchvision
from torchvision import transforms

from bench.common import REPO, cpu_cores, exit_without_recipe, git_commit, machine, write_block
from bench.jobs import dataset_command, make_dataset

try:
    from recipe.config import parse_args
    from recipe.data import IMAGENET_MEAN, IMAGENET_STD, build_loaders
    from recipe.strategies import Strategy
except ModuleNotFoundError as err:
    exit_without_recipe(err)

RESULTS_HEADING = "## Input pipelines (`bench/io.py`)"


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


def recipe_train_loader(data: Path, backend: str, batch: int, size: int, workers: int,
                        device: torch.device):
    """The training loader a run of this repository would use, built the same way."""
    cfg = parse_args(["-b", str(batch), "--image-size", str(size), "-j", str(workers),
                      "--data-backend", backend, str(data)])
    return build_loaders(cfg, Strategy().data_shard(), device)[0]


def recipe_backend(data: Path, backend: str, batch: int, size: int, workers: int):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = recipe_train_loader(data, backend, batch, size, workers, device)
    return _loader_pass(train, sync=device.type == "cuda", epochs=True)


def dali_steady_state(data: Path, batch: int, size: int, workers: int):
    """The dali-cpu pipeline built once and reused pass after pass: what an epoch costs once
    it is long enough (ImageNet) for the per-epoch pipeline build to vanish. The backend itself
    builds one pipeline per epoch, to read each epoch's own file order."""
    train = recipe_train_loader(data, "dali-cpu", batch, size, workers, torch.device("cpu"))
    batches = train.Iterator([train.pipeline(*train.files_for_pass())], ["images", "targets"],
                             reader_name="Reader", last_batch_policy=train.LastBatchPolicy.DROP,
                             auto_reset=True)

    def one_pass() -> int:
        return sum(len(batch[0]["targets"]) for batch in batches)
    one_pass.close = lambda: None
    return one_pass


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
    that drifts in a shared machine's speed hit all of them alike; median per contender."""
    for one_pass in passes_by_name.values():
        one_pass()  # warm-up: worker start, pipeline build, page cache
    rates = {name: [] for name in passes_by_name}
    for _ in range(passes):
        for name, one_pass in passes_by_name.items():
            start = time.perf_counter()
            images = one_pass()
            rates[name].append(images / (time.perf_counter() - start))
    for one_pass in passes_by_name.values():
        one_pass.close()
    return {name: {"img_s": statistics.median(r), "runs": [round(x, 1) for x in r]}
            for name, r in rates.items()}


# --- report --------------------------------------------------------------------------------------
def table(results: dict, args, n_images: int, hardware: str) -> str:
    classic = results.get("classic ImageFolder", {}).get("img_s")
    ceiling = max((r["img_s"] for name, r in results.items() if name.startswith("decode")),
                  default=None)
    lines = [f"Measured by `{args.command}` on {hardware}, {n_images} JPEGs "
             f"({args.data_description}), {args.workers} worker(s), batch {args.batch_size}, "
             f"crop {args.image_size}, median of {args.passes} passes after a warm-up.",
             "", "| loader | img/s | per worker | vs classic ImageFolder | vs decode ceiling |",
             "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        vs_classic = f"{r['img_s'] / classic:.2f}x" if classic else "-"
        vs_ceiling = f"{100 * r['img_s'] / ceiling:.0f}%" if ceiling else "-"
        lines.append(f"| {name} | {r['img_s']:.0f} | {r['img_s'] / args.workers:.0f} | "
                     f"{vs_classic} | {vs_ceiling} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib.patches

    from bench.figure import plt, save_figure

    names = list(results)
    rates = [results[n]["img_s"] for n in names]
    kinds = {"decode only (the ceiling: no crop, resize or batching)": "#999999",
             "PyTorch DataLoader": "#4477aa", "NVIDIA DALI": "#76b900"}
    colors = [kinds["decode only (the ceiling: no crop, resize or batching)"]
              if n.startswith("decode") else kinds["PyTorch DataLoader"] if "DALI" not in n
              else kinds["NVIDIA DALI"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
    bars = ax.barh(names[::-1], rates[::-1], color=colors[::-1])
    for bar, rate in zip(bars, rates[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {rate:.0f}",
                va="center")
    ax.set_xlabel("images / s (higher is better)")
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, max(rates) * 1.15)
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=k) for k, c in kinds.items()
                       if c in colors], fontsize=7, loc="lower right")
    save_figure(fig, path, dpi=120)


def main() -> None:
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
    parser.add_argument("--figure", default=str(REPO / "figures/io.png"))
    parser.add_argument("--update-results", action="store_true",
                        help="write the table into RESULTS.md")
    args = parser.parse_args()
    args.command = "python -m bench.io " + " ".join(sys.argv[1:])

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
        "pytorch backend": lambda: recipe_backend(data, "pytorch", args.batch_size,
                                                  args.image_size, args.workers),
        "DALI cpu" if gpu else "DALI CPU-only": lambda: recipe_backend(
            data, "dali-cpu", args.batch_size, args.image_size, args.workers),
    }
    if not gpu:
        contenders["DALI CPU-only, steady state"] = lambda: dali_steady_state(
            data, args.batch_size, args.image_size, args.workers)
    if gpu:
        contenders["DALI gpu"] = lambda: recipe_backend(data, "dali-gpu", args.batch_size,
                                                        args.image_size, args.workers)
    chosen = {name: make() for name, make in contenders.items()
              if not args.only or any(name.startswith(prefix) for prefix in args.only)}
    results = measure(chosen, args.passes)
    for name, r in results.items():
        print(f"{name:30s} {r['img_s']:8.1f} img/s  passes {r['runs']}", flush=True)

    hardware = machine(gpu=gpu)
    text = table(results, args, len(paths), hardware + f", commit {git_commit()}")
    print("\n" + text)
    plot(results, Path(args.figure), f"{hardware}\n{len(paths)} JPEGs, {args.workers} "
                                     f"worker(s), crop {args.image_size}, batch {args.batch_size}")
    if args.update_results:
        write_block(REPO / "RESULTS.md", "bench_io", text, RESULTS_HEADING)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
