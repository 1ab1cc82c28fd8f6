#!/usr/bin/env python3
"""Generate a small synthetic ImageNet-style dataset of real JPEG files.

Layout (the same as a prepared ImageNet, so the training code needs no
special case for it)::

    root/
      train/n00000000/n00000000_0.JPEG ...
      val/n00000000/ILSVRC2012_val_00000001.JPEG ...
      .synthetic.json            # manifest, written last

Why synthetic data at all: the training recipes should be testable end to end
(decode -> augment -> train -> evaluate) on a laptop or in CI, where the real
ImageNet (~150 GB) is not available. The images are real JPEG files of varying
sizes so the *same* data-loading path is exercised as with ImageNet.

Why class-dependent content: a smoke test that only checks "the loss is a
number" misses most bugs (labels shuffled against images, broken
normalisation, eval on the wrong split...). Each class therefore gets its own
colour palette and stripe texture, so a small CNN reaches clearly-above-chance
accuracy within a few epochs, even after RandomResizedCrop + flip at 64 px.
Per-image jitter (hue, brightness, texture phase/angle/period, blob positions,
pixel noise) keeps it from being a trivial lookup and makes train and val
different images drawn from the same class distribution.

Usage::

    python data/make_synthetic.py OUT_DIR [--classes 10] [--train-per-class 100]
        [--val-per-class 20] [--min-size 160] [--max-size 500] [--seed 0]
        [--quality 90] [--workers N]
"""

from __future__ import annotations

import argparse
import colorsys
import json
import math
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

MANIFEST_NAME = ".synthetic.json"
# Bump when the generator's output changes for the same parameters, so that an
# old dataset on disk is regenerated instead of silently reused.
GENERATOR_VERSION = 1

# Fixed "stream ids" mixed into every seed. Keeping class parameters, train
# images and val images on separate random streams means that e.g. changing
# --val-per-class does not change any train image.
_STREAM_CLASS = 0
_STREAM_TRAIN = 1
_STREAM_VAL = 2


def wnid_for(class_index: int) -> str:
    """ImageNet-like WordNet id: 'n' + 8 digits (real ones look like n01440764)."""
    return f"n{class_index:08d}"


@dataclass(frozen=True)
class ClassStyle:
    """Everything that is shared by all images of one class."""

    hue: float  # base hue in [0, 1): the strongest, crop-proof cue
    sat_a: float  # saturation/value of the bright stripe colour
    val_a: float
    hue_b: float  # hue of the dark stripe colour (close to `hue`)
    sat_b: float
    val_b: float
    hue_accent: float  # blob colour, roughly complementary
    angle: float  # stripe orientation in radians
    period_frac: float  # stripe period as a fraction of the image's short side
    sharpness: float  # 1 = soft sine stripes, larger = hard-edged bars
    n_blobs: int  # how many accent blobs per image (on average)
    blob_frac: float  # blob radius as a fraction of the short side


def class_style(seed: int, class_index: int, num_classes: int) -> ClassStyle:
    rng = np.random.default_rng([seed, _STREAM_CLASS, class_index])
    # Spread the base hues evenly around the colour wheel (with a random
    # global rotation per seed) so that per-class mean colours are as far
    # apart as possible; with many classes hues get close and the texture
    # parameters below have to do more of the work.
    rotation = np.random.default_rng([seed, _STREAM_CLASS]).uniform()
    hue = (rotation + class_index / num_classes) % 1.0
    # Golden-ratio sequence: consecutive classes get very different stripe
    # angles. Angles stay within [0, pi) since stripes are symmetric.
    angle = math.pi * ((class_index * 0.6180339887) % 1.0)
    return ClassStyle(
        hue=hue,
        sat_a=float(rng.uniform(0.55, 0.9)),
        val_a=float(rng.uniform(0.75, 0.95)),
        hue_b=float((hue + rng.uniform(-0.06, 0.06)) % 1.0),
        sat_b=float(rng.uniform(0.4, 0.8)),
        val_b=float(rng.uniform(0.2, 0.45)),
        hue_accent=float((hue + 0.5 + rng.uniform(-0.1, 0.1)) % 1.0),
        angle=angle,
        # Period between 4% and 15% of the short side: even a small
        # RandomResizedCrop (scale 0.08 -> ~28% of the side) still shows about
        # two periods, while the largest periods remain visible at 64 px.
        period_frac=float(rng.uniform(0.04, 0.15)),
        sharpness=float(rng.choice([1.0, 2.5, 6.0])),
        n_blobs=int(rng.integers(0, 7)),
        blob_frac=float(rng.uniform(0.05, 0.15)),
    )


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0)),
                    dtype=np.float32)


def render_image(style: ClassStyle, width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """Draw one RGB image of the given class style.

    Pure function of its arguments, so the result is identical no matter which
    worker process renders it (that is what makes the dataset deterministic).

    The image is built channel-planar, shape (3, H, W): every per-pixel
    operation then runs on contiguous 2-D planes, which is several times
    faster in NumPy than broadcasting over a trailing axis of length 3.
    """
    # Per-image colour jitter: small enough that classes stay separable by
    # colour, large enough that images of one class are not identical.
    dh = rng.uniform(-0.025, 0.025)
    bright = rng.uniform(0.85, 1.15)
    col_a = _hsv(style.hue + dh, style.sat_a + rng.uniform(-0.1, 0.1), style.val_a * bright)
    col_b = _hsv(style.hue_b + dh, style.sat_b + rng.uniform(-0.1, 0.1), style.val_b * bright)
    col_acc = _hsv(style.hue_accent + rng.uniform(-0.03, 0.03), 0.85, 0.9 * bright)

    short = min(width, height)
    # Stripes: a 1-D wave along a (jittered) class direction. ogrid keeps the
    # coordinate arrays 1-D so broadcasting builds the 2-D field cheaply.
    angle = style.angle + rng.uniform(-0.17, 0.17)  # +-10 degrees
    period = max(3.0, style.period_frac * short * rng.uniform(0.8, 1.25))
    yy, xx = np.ogrid[0:height, 0:width]
    yy = yy.astype(np.float32)
    xx = xx.astype(np.float32)
    t = xx * np.float32(math.cos(angle)) + yy * np.float32(math.sin(angle))
    wave = np.sin(t * np.float32(2 * math.pi / period) + np.float32(rng.uniform(0, 2 * math.pi)))
    # Sharpness turns a sine into near-square bars: another class cue that a
    # CNN picks up from edge statistics rather than from colour alone.
    mix = np.clip(wave * np.float32(style.sharpness * 0.5) + np.float32(0.5), 0.0, 1.0)

    img = np.empty((3, height, width), dtype=np.float32)
    for ch in range(3):
        np.multiply(mix, col_a[ch] - col_b[ch], out=img[ch])
        img[ch] += col_b[ch]

    # Accent blobs at random places: class-specific count/size, but their
    # positions vary per image so no fixed pixel location identifies a class.
    n_blobs = max(0, style.n_blobs + int(rng.integers(-1, 2)))
    for _ in range(n_blobs):
        r = style.blob_frac * short * rng.uniform(0.7, 1.3)
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        # Only touch the blob's bounding box instead of the whole image.
        x0, x1 = max(0, int(cx - r)), min(width, int(cx + r) + 1)
        y0, y1 = max(0, int(cy - r)), min(height, int(cy + r) + 1)
        if x0 >= x1 or y0 >= y1:
            continue
        by = (np.arange(y0, y1, dtype=np.float32) - cy)[:, None]
        bx = (np.arange(x0, x1, dtype=np.float32) - cx)[None, :]
        inside = (bx * bx + by * by) <= r * r
        for ch in range(3):
            img[ch, y0:y1, x0:x1][inside] = col_acc[ch]

    # Smooth illumination gradient, like uneven lighting in photos: stops the
    # network from relying on exact absolute pixel values.
    g_angle = rng.uniform(0, 2 * math.pi)
    g_strength = rng.uniform(0.0, 0.25)
    ramp = ((xx / np.float32(width) - np.float32(0.5)) * np.float32(g_strength * math.cos(g_angle))
            + (yy / np.float32(height) - np.float32(0.5)) * np.float32(g_strength * math.sin(g_angle))
            + np.float32(1.0))
    img *= ramp  # (H, W) broadcasts over the leading channel axis

    # Pixel noise (sensor-like). Uniform noise from raw random bytes is several
    # times cheaper than Gaussian noise and looks the same after JPEG.
    sigma = rng.uniform(0.02, 0.06)
    noise = np.frombuffer(rng.bytes(img.size), dtype=np.uint8).reshape(img.shape).astype(np.float32)
    noise -= np.float32(127.5)
    noise *= np.float32(sigma * 1.7 / 127.5)  # uniform on [-a, a] has std a/sqrt(3)
    img += noise

    np.clip(img, 0.0, 1.0, out=img)
    img *= np.float32(255.0)
    img += np.float32(0.5)  # round to nearest instead of truncating
    planes = img.astype(np.uint8)
    # Merging single-band images avoids an (H, W, 3) transpose copy.
    return Image.merge("RGB", [Image.fromarray(planes[ch]) for ch in range(3)])


# One unit of work for a worker: (output path, seed list, style, w, h, quality).
_Job = tuple


def _render_and_save(job: _Job) -> None:
    path, seed_seq, style, width, height, quality = job
    rng = np.random.default_rng(seed_seq)
    image = render_image(style, width, height, rng)
    # Write to a temporary name and rename: an interrupted run never leaves a
    # truncated JPEG under a final name.
    tmp = path + ".tmp"
    # No EXIF/timestamps are written by PIL here, so bytes are reproducible.
    image.save(tmp, format="JPEG", quality=quality)
    os.replace(tmp, path)


def _params_dict(num_classes, train_per_class, val_per_class, min_size, max_size, seed, quality) -> dict:
    return {
        "generator_version": GENERATOR_VERSION,
        "num_classes": num_classes,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "min_size": min_size,
        "max_size": max_size,
        "seed": seed,
        "quality": quality,
    }


def _count_jpegs(split_dir: Path) -> int:
    if not split_dir.is_dir():
        return 0
    return sum(1 for p in split_dir.glob("*/*.JPEG"))


def _existing_is_complete(root: Path, params: dict) -> bool:
    """True if root holds a finished dataset generated with exactly `params`.

    The manifest is only written after every image has been saved, so its
    presence with `complete: true` means a finished run. The file counts are
    re-checked as a cheap guard against someone deleting images afterwards.
    """
    manifest = root / MANIFEST_NAME
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    if not data.get("complete") or data.get("params") != params:
        return False
    n = params["num_classes"]
    return (_count_jpegs(root / "train") == n * params["train_per_class"]
            and _count_jpegs(root / "val") == n * params["val_per_class"])


def make_synthetic_imagefolder(
    root,
    num_classes: int = 10,
    train_per_class: int = 100,
    val_per_class: int = 20,
    min_size: int = 160,
    max_size: int = 500,
    seed: int = 0,
    quality: int = 90,
    workers: int | None = None,
    overwrite: bool = False,
    verbose: bool = True,
) -> dict:
    """Write a synthetic ImageFolder dataset under `root` and return a summary.

    Width and height of each image are drawn independently and uniformly from
    [min_size, max_size], giving varied sizes and aspect ratios like ImageNet
    (whose typical images are ~500x375 / 375x500). Tests pass small sizes
    (e.g. 32..64) to run fast.

    Idempotent: if `root` already holds a complete dataset with the same
    parameters it is left untouched and ``summary["skipped"]`` is True. A
    dataset previously generated by this tool with other parameters (or an
    interrupted run) is replaced. A non-empty train/ or val/ that this tool did
    not create is never deleted unless ``overwrite=True``.

    `workers`: number of processes; None = all CPUs (small jobs run in-process
    because starting processes would cost more than it saves).
    """
    if num_classes < 1 or train_per_class < 0 or val_per_class < 0:
        raise ValueError("need num_classes >= 1 and non-negative image counts")
    if not (8 <= min_size <= max_size):
        raise ValueError(f"need 8 <= min_size <= max_size, got {min_size}, {max_size}")
    if not (1 <= quality <= 100):
        raise ValueError(f"JPEG quality must be in 1..100, got {quality}")

    root = Path(root)
    params = _params_dict(num_classes, train_per_class, val_per_class, min_size, max_size, seed, quality)
    summary = {
        "root": str(root),
        "params": params,
        "train_images": num_classes * train_per_class,
        "val_images": num_classes * val_per_class,
        "skipped": False,
        "seconds": 0.0,
    }
    log = print if verbose else (lambda *a, **k: None)

    if _existing_is_complete(root, params):
        log(f"{root}: complete synthetic dataset with the same parameters already present; skipping.")
        summary["skipped"] = True
        return summary

    manifest = root / MANIFEST_NAME
    ours = manifest.exists()
    for split in ("train", "val"):
        d = root / split
        if d.exists() and any(d.iterdir()):
            # Only delete directories we can prove we made (manifest present),
            # so pointing this tool at a real dataset by mistake is harmless.
            if not (ours or overwrite):
                raise FileExistsError(
                    f"{d} is not empty and has no {MANIFEST_NAME} manifest; refusing to overwrite "
                    "(pass overwrite=True / --overwrite to replace it)")
            shutil.rmtree(d)

    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    # Mark the directory as ours *before* writing images: if the run is
    # interrupted, the next run knows it may clean up the partial output.
    manifest.write_text(json.dumps({"complete": False, "params": params}, indent=2) + "\n")

    jobs: list[_Job] = []
    val_counter = 0  # ImageNet numbers val images globally: ILSVRC2012_val_00000001...
    for c in range(num_classes):
        style = class_style(seed, c, num_classes)
        wnid = wnid_for(c)
        for split, stream, count in (("train", _STREAM_TRAIN, train_per_class),
                                     ("val", _STREAM_VAL, val_per_class)):
            out_dir = root / split / wnid
            out_dir.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                seed_seq = [seed, stream, c, i]
                # Size comes from its own small stream so it is fixed by
                # (seed, split, class, index) alone.
                size_rng = np.random.default_rng(seed_seq + [7])
                w, h = (int(v) for v in size_rng.integers(min_size, max_size + 1, size=2))
                if split == "train":
                    name = f"{wnid}_{i}.JPEG"
                else:
                    val_counter += 1
                    name = f"ILSVRC2012_val_{val_counter:08d}.JPEG"
                jobs.append((str(out_dir / name), seed_seq, style, w, h, quality))

    if workers is None:
        workers = os.cpu_count() or 1
    # Rough cost model: below ~100 images process start-up dominates.
    if workers > 1 and len(jobs) >= 100:
        # 'fork' when available: workers inherit the already-imported module,
        # so this also works when the module was loaded by file path (tests)
        # and is not importable by name in a fresh interpreter.
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        with ctx.Pool(workers) as pool:
            # Chunks amortise IPC; results are only "done" markers.
            for _ in pool.imap_unordered(_render_and_save, jobs, chunksize=16):
                pass
    else:
        for job in jobs:
            _render_and_save(job)

    summary["seconds"] = round(time.perf_counter() - t0, 3)
    manifest.write_text(json.dumps({
        "complete": True,
        "params": params,
        "classes": [wnid_for(c) for c in range(num_classes)],
        "train_images": summary["train_images"],
        "val_images": summary["val_images"],
    }, indent=2) + "\n")
    log(f"wrote {summary['train_images']} train + {summary['val_images']} val JPEGs "
        f"({num_classes} classes, {min_size}-{max_size} px, seed {seed}) to {root} "
        f"in {summary['seconds']:.1f}s")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("out_dir", help="dataset root; train/ and val/ are created inside")
    ap.add_argument("--classes", type=int, default=10, help="number of classes")
    ap.add_argument("--train-per-class", type=int, default=100)
    ap.add_argument("--val-per-class", type=int, default=20)
    ap.add_argument("--min-size", type=int, default=160, help="smallest image side in px")
    ap.add_argument("--max-size", type=int, default=500, help="largest image side in px")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a non-empty train/ or val/ that has no manifest")
    args = ap.parse_args(argv)
    try:
        make_synthetic_imagefolder(
            args.out_dir, num_classes=args.classes, train_per_class=args.train_per_class,
            val_per_class=args.val_per_class, min_size=args.min_size, max_size=args.max_size,
            seed=args.seed, quality=args.quality, workers=args.workers, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
