"""The loader rows: train/nd.py on generated JPEGs with each data backend (the `scripts` group's
loader rows), and each backend's input pipeline alone, no model (bench.decode in this process: the
`decode` group), both over one JPEG set made once and reused (--data, --prepare-data).

A loader row's img/s is images over seconds across a window of --loader-window (default
LOADER_WINDOW) log intervals of
(workers x prefetch_factor) batches after the warm-up, so the batches the workers had ready before
the clock started are a tenth of the window at most."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import List, Tuple

from imagenet_recipes.bench.common import REPO, installed
from imagenet_recipes.bench.gpu.scripts import Context, common_flags, intervals, run_entry
from imagenet_recipes.bench.gpu.units import (DECODE_ROWS, Failure, Skip, Unit, new_row,
                                              reference_of, workload)
from imagenet_recipes.registry import GPU_DECODERS

# The loader rows count over this many intervals of (workers x prefetch_factor) batches.
LOADER_WINDOW = 10


def prefetch_factor() -> int:
    """Batches each DataLoader worker keeps ready: the pytorch backend leaves torch's default,
    read here from torch itself (building a DataLoader starts no worker)."""
    from torch.utils.data import DataLoader

    return DataLoader(range(1), num_workers=1).prefetch_factor


def loader_workers(args: argparse.Namespace) -> int:
    """-j of the loader rows: --workers, else what the engine picks for one process (-j -1)."""
    if args.workers:
        return args.workers
    from imagenet_recipes.data.loading import default_workers

    return default_workers(1)


# Validation images per class of the generated set: the peers' runs validate on them
# (bench.e2e's --val-per-class), so one set serves the loader rows and the peers (--peers-data).
JPEG_SET_VAL = 50


def jpeg_set(args: argparse.Namespace) -> Path:
    """Generated JPEGs (data/make_synthetic.py) for the loader rows' training images, of
    ImageNet-like sizes (about 1.4x to 2.2x the crop: 314-493 px for 224), 10 classes; made once
    and reused (make_synthetic.py skips a complete identical set)."""
    from imagenet_recipes.bench.jobs import dataset_command, make_dataset

    per_class = math.ceil(max(loader_steps(args)[1], decode_batches(args)) * args.batch_size
                          / 10)
    low, high = round(args.image_size * 1.4), round(args.image_size * 2.2)
    root = args.data or REPO / "runs" / "bench_gpu-data" / f"{low}-{high}px-{per_class}"
    print(f"JPEG set: {10 * per_class} training images at {low}-{high} px in {root}", flush=True)
    make_dataset(dataset_command(root, classes=10, train=per_class, val=JPEG_SET_VAL,
                                 min_size=low, max_size=high, workers=None))
    return root


def loader_steps(args: argparse.Namespace) -> tuple:
    """(warm-up intervals, steps) of a loader row. One interval is as many batches as the
    workers may hold ready at once; the window is LOADER_WINDOW of them, so a full prefetch
    buffer at the start is at most a tenth of it."""
    per = loader_workers(args) * prefetch_factor()
    warm = max(1, math.ceil(args.warmup / per))
    return warm, per * (warm + loader_window(args))


def loader_window(args: argparse.Namespace) -> int:
    """Log intervals a loader row counts over: --loader-window, else LOADER_WINDOW."""
    return getattr(args, "loader_window", None) or LOADER_WINDOW


def decode_batches(args: argparse.Namespace) -> int:
    """Batches a decode-only row reads in its one pass: what its loader holds ready before the
    clock (2 per worker or file reader, at most one per core but one), two more, and the
    timed ones (bench.decode.measure_row)."""
    return max(1, (os.cpu_count() or 1) - 1) * 2 + 2 + decode_timed(args)


def decode_timed(args: argparse.Namespace) -> int:
    return max(3 * args.steps, 10)


# What a loader row's flags need installed, and the GPU decoder they decode with
LOADER_DECODER = {"gpu": "torchcodec", "nvimgcodec": "nvimgcodec",
                  "nvimgcodec-whole": "nvimgcodec-whole"}
LOADER_NEEDS = {**{flag: GPU_DECODERS[name].module for flag, name in LOADER_DECODER.items()},
                "dali-gpu": "nvidia.dali"}


def whole_images_note(args: argparse.Namespace) -> str:
    """What an nvImageCodec row says when --nvimgcodec-whole (nvImageCodec's regions fail here)
    has it decode whole images; "" when regions work."""
    cause = getattr(args, "nvimgcodec_whole", None)
    return f"whole images (--gpu-decoder nvimgcodec-whole), not regions: {cause}" if cause else ""


def whole_images_instead(args: argparse.Namespace, flags: List[str]) -> Tuple[List[str], str]:
    """A row's flags with --gpu-decoder nvimgcodec turned into nvimgcodec-whole where
    --nvimgcodec-whole says nvImageCodec's regions fail here (the hardware decoder is still
    measured, on whole images). -> (the flags, whole_images_note, or "")."""
    note = whole_images_note(args)
    if not note or "--gpu-decoder" not in flags:
        return flags, ""
    at = flags.index("--gpu-decoder") + 1
    if flags[at] != "nvimgcodec":
        return flags, ""
    return [*flags[:at], "nvimgcodec-whole", *flags[at + 1:]], note


def decoded_on_cpu(log: dict, warm: int) -> Tuple[int, int]:
    """(images torchvision decoded on the CPU, images trained) over a loader row's window: the
    log's running count of the pass (`cpu_decoded`, the gpu backend's records) at the window's
    end less at its start; (0, images) for a backend that does not count."""
    train = log.get("train", [])
    before = train[warm - 1].get("cpu_decoded", 0) if 0 < warm <= len(train) else 0
    after = train[-1].get("cpu_decoded", 0) if train else 0
    return after - before, sum(r["count"] for r in train[warm:])


def measure_loader(ctx: Context, unit: Unit, backend_flags: List[str]) -> List[dict]:
    """nd.py on generated JPEGs: images over seconds across LOADER_WINDOW log intervals of
    (workers x prefetch_factor) batches each, after the warm-up interval(s)."""
    args = ctx.args
    backend_flags, whole_note = whole_images_instead(args, backend_flags)
    backend = backend_flags[1]
    if backend.startswith("dali") and args.device != "cuda":
        raise Skip("dali-gpu decodes on a GPU: not with --device cpu")
    decoder = (backend_flags[backend_flags.index("--gpu-decoder") + 1]
               if "--gpu-decoder" in backend_flags else backend)
    module = LOADER_NEEDS.get(decoder)
    if module and not installed(module):
        raise Skip(f"{module} is not installed")
    cause = getattr(args, "skipped_decoders", {}).get(LOADER_DECODER.get(decoder, ""))
    if cause:
        raise Skip(f"{LOADER_DECODER[decoder]}: {cause}")
    workers, prefetch = loader_workers(args), prefetch_factor()
    per = workers * prefetch
    warm, steps = loader_steps(args)
    data = jpeg_set(args)
    flags = [*common_flags(args), *backend_flags, "-j", str(workers), "-p", str(per),
             "--steps-per-epoch", str(steps), str(data)]
    log, peak = run_entry(ctx, unit.name, "nd", flags)
    window = intervals(log)[warm:]
    counted = sum(i["steps"] for i in window)
    if counted < loader_window(args) * per:
        raise Failure(f"only {counted} batches after the warm-up, expected "
                      f"{loader_window(args) * per}")
    img_s = sum(i["images"] for i in window) / sum(i["seconds"] for i in window)
    label = ("thread" if backend.startswith("dali") else "worker") + "s" * (workers > 1)
    on_cpu, images = decoded_on_cpu(log, warm)
    row = new_row(unit.rows[0], unit.name,
                  f"train/nd.py {' '.join(backend_flags)}, generated JPEGs, {workers} loader "
                  f"{label}: {workload(args, 'O1', args.amp_dtype)}", img_s,
                  [i["img_s"] for i in window], reference=reference_of(unit.rows[0]),
                  peak_bytes=peak, workers=workers, prefetch_factor=prefetch,
                  warmup_batches=warm * per, window_batches=counted, data=str(data),
                  **({"decoder": LOADER_DECODER[decoder], "cpu_decoded": on_cpu,
                      "cpu_decoded_share": on_cpu / max(images, 1)}
                     if decoder in LOADER_DECODER else {}))
    row["note"] = whole_note
    return [row]


# --- decode capacity: bench.decode, in this process ---------------------------------------------
def measure_decode(ctx: Context, unit: Unit) -> List[dict]:
    """bench.decode's rows over the loader rows' JPEG set, at this tool's batch and size; the
    pytorch backend's row is its best -j, every -j's rate in its detail."""
    from imagenet_recipes.bench import decode

    args = ctx.args
    workers = getattr(args, "decode_workers", None)
    if workers == "default":
        workers = str(loader_workers(args))
    skipped = {f"gpu {name}": cause for name, cause in
               getattr(args, "skipped_decoders", {}).items()}
    # bench.decode's row measured for each row of this unit: nvImageCodec's whole images in
    # its place where --nvimgcodec-whole says its regions fail here
    measured_as = dict(zip(DECODE_ROWS, DECODE_ROWS))
    whole_note = whole_images_note(args)
    if whole_note:
        measured_as["gpu nvimgcodec"] = "gpu nvimgcodec-whole"
    dargs = argparse.Namespace(data=jpeg_set(args), device=args.device,
                               batch_size=args.batch_size, image_size=args.image_size,
                               batches=decode_timed(args),
                               only=",".join(measured_as[r] for r in DECODE_ROWS
                                             if r not in skipped),
                               workers=workers or (str(args.workers) if args.workers else None))
    measured = decode.measure(dargs) + [
        {"name": row, "backend": row, "status": "skipped", "detail": f"{row[4:]}: {cause}"}
        for row, cause in skipped.items()]
    rows = []
    for backend, name in DECODE_ROWS.items():
        found = [r for r in measured if r["backend"] in (backend, measured_as[backend])]
        ok = [r for r in found if r["status"] == "ok"]
        config = f"bench.decode {measured_as[backend]}: {args.batch_size} x {args.image_size} px"
        if not ok:
            status = found[0]["status"] if found else "skipped"
            rows.append(dict(new_row(name, unit.name, config), status=status,
                             note=found[0].get("detail", "") if found else ""))
            continue
        best = max(ok, key=lambda r: r["img_s"])
        on_cpu = ({"cpu_decoded": best["cpu_decoded"],
                   "cpu_decoded_share": best["cpu_decoded_share"]}
                  if best.get("cpu_decoded") is not None else {})
        row = new_row(name, unit.name, f"{config}, -j {best['workers']}", best["img_s"],
                      reference=reference_of(name), workers=best["workers"],
                      cores_busy=best["cores_busy"], jpeg_engines=best["jpeg_engines"],
                      by_workers={r["workers"]: round(r["img_s"], 1) for r in ok}, **on_cpu)
        row["note"] = whole_note if measured_as[backend] != backend else ""
        rows.append(row)
    return rows
