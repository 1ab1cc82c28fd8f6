"""Where a training sample's time goes in the `pytorch` backend, stage by stage, on one core.

    launch/env.sh python -m imagenet_recipes.bench.stages                 # generated sets
    launch/env.sh python -m imagenet_recipes.bench.stages /data/imagenet --images 500

Each stage runs alone over the same files, in one thread, the stages taking turns pass after pass
(a shared machine's drifts hit them alike); the figure is the median pass, in microseconds per
image. Without a folder it generates two sets (data/make_synthetic.py): ImageNet's sizes
(314-500 px) and large images (800-2,000 px), one column each.

  read                  the file's bytes (torchvision.io.read_file)
  decode whole          torchvision.io.decode_jpeg of the whole image (libjpeg-turbo)
    entropy (~)         Pillow's decode at 1/8 scale (Image.draft): every coefficient's entropy
                        decoding but only the DC term's transform, on 1/64 of the pixels; an
                        estimate of the entropy decoding alone (same libjpeg-turbo family)
    IDCT + colour (~)   Pillow's whole decode minus its 1/8 decode
  decode DCT-scaled     Pillow's whole decode at 1/2, 1/4 or 1/8 scale (Image.draft), the
                        smallest that leaves the crop's box at least --image-size on both sides
                        (1 where none does): what DCT-domain scaling alone would cost
  decode region         the crop's region alone (the default path's decoder,
                        jpeg_decoders.CropRegionReader; nvImageCodec's libjpeg-turbo)
  to tensor             the decoder's HWC array as a CHW tensor view
  crop                  the box cut from a whole decoded image (a view)
  resize                the region to --image-size, antialiased (torchvision, uint8)
  flip                  the horizontal flip of the output
  sample, whole         a training sample as ImageFolderUint8 makes it, decoding whole images
  sample, default       the same with the default region decoding (what the loader runs)
  collate               stacking a batch (per image)
  hand-over             a batch from one loader worker to the main process, per image (a
                        DataLoader whose dataset returns ready samples, minus collate): most of
                        it is writing each batch into a fresh shared-memory segment
  loader, 1 worker      the `pytorch` backend's training loader, one worker, end to end

The rows under "sample" are the sums the loader pays; the others say where they go. This is a
benchmark, not a test.
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch
import torchvision
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from imagenet_recipes.bench.common import machine, shown_command
from imagenet_recipes.bench.jobs import dataset_command, make_dataset

SETS = {"imagenet": (314, 500), "large": (800, 2000)}


def stage_functions(data: Path, images: int, size: int, batch: int):
    """-> ({stage: function running it once over every file}, number of files); the inputs of
    each stage made ahead."""
    from PIL import Image

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.data.folders import collate_uint8, image_folders
    from imagenet_recipes.data.jpeg_decoders import CropRegionReader
    from imagenet_recipes.options import AugmentOptions

    paths = sorted(str(p) for p in (data / "train").rglob("*") if p.is_file())[:images]
    files = [torchvision.io.read_file(p) for p in paths]
    raw = [bytes(f.numpy()) for f in files]
    whole = [torchvision.io.decode_jpeg(f) for f in files]
    crop = v2.RandomResizedCrop(size, antialias=True)
    torch.manual_seed(0)
    boxes = [crop.make_params([w]) for w in whole]
    boxes = [(b["top"], b["left"], b["height"], b["width"]) for b in boxes]
    reader = CropRegionReader() if CropRegionReader.available() else None
    codec = reader.codec if reader else None

    def region_array(i):
        top, left, height, width = boxes[i]
        stream = codec.CodeStream(files[i].numpy()).get_sub_code_stream(
            region=codec.Region(top, left, top + height, left + width))
        return np.asarray(reader.decoder.decode(stream, params=reader.params))

    def pil(i, scale):
        with Image.open(io.BytesIO(raw[i])) as image:
            if scale > 1:
                image.draft("RGB", (image.size[0] // scale, image.size[1] // scale))
            image.load()

    def scale(i):  # the largest of 8, 4, 2 leaving the box at least `size` on both sides
        _, _, height, width = boxes[i]
        return next((s for s in (8, 4, 2) if min(height, width) >= s * size), 1)

    def cut(i):
        top, left, height, width = boxes[i]
        return whole[i][:, top:top + height, left:left + width]

    arrays = [region_array(i) for i in range(len(files))] if reader else None
    regions = ([torch.from_numpy(a).permute(2, 0, 1) for a in arrays] if reader
               else [cut(i) for i in range(len(files))])
    outputs = [TF.resize(r, [size, size], antialias=True) for r in regions]

    cfg = parse_args(["-a", "resnet18", "--image-size", str(size), "-b", str(batch), "-j", "1",
                      "--data-backend", "pytorch", str(data)], entry="nd")
    train_set, _ = image_folders(cfg.data, AugmentOptions.of(cfg))
    index_of = {p: k for k, (p, _) in enumerate(train_set.samples)}
    keys = [(index_of[p], i, None) for i, p in enumerate(paths)]

    def samples(region: bool):
        def run():
            train_set.decode_regions = region and reader is not None
            for key in keys:
                train_set[key]
        return run

    def over(fn):
        return lambda: [fn(i) for i in range(len(files))]

    stages = {
        "read": over(lambda i: torchvision.io.read_file(paths[i])),
        "decode whole": over(lambda i: torchvision.io.decode_jpeg(files[i])),
        "  entropy (~)": over(lambda i: pil(i, 8)),
        "  Pillow decode whole": over(lambda i: pil(i, 1)),
        "decode DCT-scaled": over(lambda i: pil(i, scale(i))),
    }
    if reader:
        stages["decode region"] = over(region_array)
        stages["to tensor"] = over(lambda i: torch.from_numpy(arrays[i]).permute(2, 0, 1))
    stages.update({
        "crop": over(cut),
        "resize": over(lambda i: TF.resize(regions[i], [size, size], antialias=True)),
        "flip": over(lambda i: TF.horizontal_flip(outputs[i])),
        "sample, whole": samples(False),
    })
    if reader:
        stages["sample, default"] = samples(True)
    ready = [(o, 0, 0) for o in outputs]  # laid out as a sample is: resized HWC
    batches = [ready[k:k + batch] for k in range(0, len(ready) - batch + 1, batch)] or [ready]
    stages["collate"] = lambda: [collate_uint8(b) for b in batches]
    stages["hand-over + collate"] = handover(ready, batch)
    stages["loader, 1 worker"] = loader(cfg)
    return stages, len(files)


class _Ready(torch.utils.data.Dataset):
    """Samples made ahead, in one tensor: a list of tensors would reach a forkserver worker as
    one file descriptor each, more than it takes. Each comes out laid out as it went in: CHW
    views of HWC pixels, as the region path makes them."""

    def __init__(self, samples):
        self.images = torch.stack([image.permute(1, 2, 0) for image, _, _ in samples])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index].permute(2, 0, 1), 0, 0


def handover(ready: List, batch: int) -> Callable:
    from imagenet_recipes.data.folders import collate_uint8
    from imagenet_recipes.data.loader_server import loader_worker_context

    loader = torch.utils.data.DataLoader(_Ready(ready), batch_size=batch, num_workers=1,
                                         collate_fn=collate_uint8, persistent_workers=True,
                                         multiprocessing_context=loader_worker_context())
    return lambda: [b for b in loader]


def loader(cfg) -> Callable:
    from imagenet_recipes.bench.io import recipe_train_loader

    train = recipe_train_loader(Path(cfg.data), "pytorch", cfg.batch_size, cfg.image_size, 1,
                                torch.device("cpu"))
    state = {"epoch": 0}

    def one_pass():
        train.set_epoch(state["epoch"])
        state["epoch"] += 1
        return sum(len(t) for _, t in train)
    return one_pass


def measure(stages: Dict[str, Callable], count: int, passes: int) -> Dict[str, float]:
    """-> median microseconds per image of each stage, timed in turns."""
    for run in stages.values():
        run()  # warm-up
    times = {name: [] for name in stages}
    for _ in range(passes):
        for name, run in stages.items():
            start = time.perf_counter()
            done = run()
            per = done if isinstance(done, int) else count  # the loader says how many
            times[name].append(1e6 * (time.perf_counter() - start) / max(1, per))
    us = {name: statistics.median(t) for name, t in times.items()}
    if "  Pillow decode whole" in us:
        us["  IDCT + colour (~)"] = us["  Pillow decode whole"] - us["  entropy (~)"]
    us["hand-over"] = us.pop("hand-over + collate") - us["collate"]
    return us


ORDER = ["read", "decode whole", "  Pillow decode whole", "  entropy (~)",
         "  IDCT + colour (~)", "decode DCT-scaled", "decode region", "to tensor", "crop", "resize", "flip",
         "sample, whole", "sample, default", "collate", "hand-over", "loader, 1 worker"]


def table(columns: Dict[str, Dict[str, float]]) -> str:
    names = list(columns)
    head = "| stage | " + " | ".join(f"{n}: us/img | % of loader" for n in names) + " |"
    rows = [head, "|---" * (1 + 2 * len(names)) + "|"]
    for stage in [s for s in ORDER if any(s in c for c in columns.values())]:
        cells = []
        for n in names:
            us = columns[n].get(stage)
            total = columns[n]["loader, 1 worker"]
            cells += ["-", "-"] if us is None else [f"{us:.0f}", f"{100 * us / total:.0f}%"]
        rows.append(f"| {stage.strip()} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", nargs="*", help="ImageFolder roots with train/ (default: "
                        "generate the sets " + ", ".join(f"{k} ({a}-{b} px)"
                                                          for k, (a, b) in SETS.items()) + ")")
    parser.add_argument("--images", type=int, default=256, help="images per set")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    tmp = None
    folders = {Path(d).name: Path(d) for d in args.data}
    if not folders:
        tmp = tempfile.TemporaryDirectory(prefix="bench_stages_")
        for name, (low, high) in SETS.items():
            folders[name] = Path(tmp.name) / name
            make_dataset(dataset_command(folders[name], 4, -(-args.images // 4), 1, low, high,
                                         workers=None))
    columns = {}
    for name, folder in folders.items():
        stages, count = stage_functions(folder, args.images, args.image_size, args.batch_size)
        columns[name] = measure(stages, count, args.passes)
    print(f"{machine(gpu=False)}; one thread; crop {args.image_size}, batch "
          f"{args.batch_size}; {shown_command('stages', argv if argv is not None else sys.argv[1:])}")
    print(table(columns))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
