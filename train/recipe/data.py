"""Data loaders behind one factory: `build_loaders(cfg, strategy, device)`.

Every backend yields the same thing to the engine: `(images, targets)` already on the device,
images as normalised float32 NCHW (channels_last when asked), targets as int64. The `pytorch`
backend decodes to uint8 and batches uint8 (4x less to copy than float), and normalises on the
device, as fast ImageNet recipes do.

Sharding always uses the GLOBAL rank and world size. Training shards are equal in size (padded
by wrapping around, like DistributedSampler, so every rank runs the same number of steps);
validation shards are NOT padded, so every validation image is counted exactly once.

Augmentation randomness is a function of (seed, epoch, sample index) only, not of the worker or
rank that happens to load the sample: that is what makes runs with different process counts (and
resumed runs) see the same crops.
"""
from __future__ import annotations

import atexit
import math
import multiprocessing
import os
import signal
import warnings
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torchvision
from torch.utils.data import DataLoader, Sampler
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from .config import TrainConfig, UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_CROP_RATIO = 0.875  # 224 crop out of a 256 resize


def val_resize_size(image_size: int) -> int:
    return int(round(image_size / VAL_CROP_RATIO))


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of one sample in one epoch (independent of rank and worker)."""
    return (seed * 1_000_003 + epoch * 7_919 + index * 104_729) % (2 ** 63)


# --- sampling ------------------------------------------------------------------------------------
class ShardedSampler(Sampler):
    """Yields `(index, augmentation_seed)` keys for this rank's shard of one epoch.

    train: a permutation seeded by (seed, epoch), padded to a multiple of the world size by
           wrapping around, then rank r takes positions r, r+W, r+2W, ... so the union over ranks
           of the k-th batches is exactly the k-th global batch of a single-process run.
    val:   sequential, positions r, r+W, ...; no padding (shards may differ by one image).
    """

    def __init__(self, size: int, rank: int, world: int, shuffle: bool, seed: int,
                 subset: Optional[Sequence[int]] = None):
        """`subset`: sample only these dataset indices (a parameter-server worker's classes)."""
        self.subset = list(subset) if subset is not None else None
        self.size = len(self.subset) if subset is not None else size
        self.rank, self.world = rank, world
        self.shuffle, self.seed, self.epoch, self.start = shuffle, seed, 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch; `start` skips this rank's first samples (mid-epoch resume)."""
        self.epoch, self.start = epoch, start

    def _order(self) -> List[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        padding = (-len(order)) % self.world
        return order + (order * math.ceil(padding / max(len(order), 1)))[:padding]

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        for position in self._order()[self.rank::self.world][self.start:]:
            index = self.subset[position] if self.subset is not None else position
            yield index, sample_seed(self.seed, self.epoch, index)

    def __len__(self) -> int:
        if self.shuffle:
            return max(math.ceil(self.size / self.world) - self.start, 0)
        return len(range(self.rank, self.size, self.world)[self.start:])


# --- the pytorch backend -------------------------------------------------------------------------
def read_image_uint8(path: str) -> torch.Tensor:
    """Decode a file to uint8 CHW RGB (grayscale and CMYK are converted)."""
    return decode_image(torchvision.io.read_file(path), mode=ImageReadMode.RGB)


class ImageFolderUint8(torchvision.datasets.ImageFolder):
    """ImageFolder whose samples are uint8 tensors, keyed by (index, augmentation seed).

    A file that cannot be decoded never raises in a worker (that would kill this rank and leave
    the others waiting). Training replaces it with the next readable sample, so every batch keeps
    its size and every rank its step count; validation drops it (returns None), so no image is
    counted twice. Either way the collate function counts it.
    """

    def __init__(self, root: str, transform, replace_unreadable: bool):
        super().__init__(root, transform=transform, loader=read_image_uint8)
        self.replace_unreadable = replace_unreadable

    def __getitem__(self, key):
        index, seed = key
        for unreadable in range(len(self.samples)):
            path, target = self.samples[(index + unreadable) % len(self.samples)]
            try:
                # Per-sample augmentation randomness (see the module docstring); default_generator
                # rather than torch.manual_seed, which also reseeds every CUDA device and costs
                # ~100x more. fork_rng restores the CPU RNG for a loader in the main process.
                with torch.random.fork_rng(devices=[]):
                    torch.random.default_generator.manual_seed(seed)
                    return self.transform(self.loader(path)), target, unreadable
            except Exception as err:  # corrupt, truncated or not an image
                warnings.warn(f"skipping unreadable image {path}: {err}")
                if not self.replace_unreadable:
                    return None
        raise RuntimeError(f"no readable image at all in {self.root}")


def collate_uint8(batch: Sequence) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """-> (uint8 images, int64 targets, number of unreadable files met for this batch)."""
    good = [b for b in batch if b is not None]
    skipped = (len(batch) - len(good)) + sum(unreadable for _, _, unreadable in good)
    if not good:
        return torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64), skipped
    images = torch.stack([img for img, _, _ in good])
    targets = torch.tensor([t for _, t, _ in good], dtype=torch.int64)
    return images, targets, skipped


def train_transform(image_size: int):
    return v2.Compose([v2.RandomResizedCrop(image_size, antialias=True),
                       v2.RandomHorizontalFlip()])


def val_transform(image_size: int):
    return v2.Compose([v2.Resize(val_resize_size(image_size), antialias=True),
                       v2.CenterCrop(image_size)])


class UInt8Normalizer:
    """uint8 NCHW batch -> normalised float32 on the device, in the requested memory format.

    Shared by every backend that hands over uint8 images, so they all meet the same contract."""

    def __init__(self, device: torch.device, channels_last: bool):
        shape = (1, 3, 1, 1)
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(shape) * 255
        self.inv_std = 1.0 / (torch.tensor(IMAGENET_STD, device=device).view(shape) * 255)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = (images.float() - self.mean) * self.inv_std
        return images.contiguous(memory_format=self.memory_format)


class DeviceLoader:
    """Wraps a uint8 DataLoader: moves batches to the device and normalises them there."""

    def __init__(self, loader: DataLoader, sampler: ShardedSampler, device: torch.device,
                 channels_last: bool):
        self.loader, self.sampler, self.device = loader, sampler, device
        self.normalize = UInt8Normalizer(device, channels_last)
        self.num_samples = len(sampler)  # this rank's share of the dataset
        self.skipped = 0  # unreadable files met in the current pass (this rank)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch and the batch to start from (mid-epoch resume)."""
        self.sampler.set_epoch(epoch, start_batch * self.loader.batch_size)

    def __len__(self) -> int:
        return len(self.loader)

    def close(self) -> None:
        """Stop the persistent worker processes now rather than at interpreter exit."""
        # DataLoader has no public close; its worker iterator shuts down cleanly on request.
        workers = getattr(self.loader, "_iterator", None)
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()
            self.loader._iterator = None

    def __iter__(self):
        self.skipped = 0
        for images, targets, skipped in self.loader:
            self.skipped += skipped
            if images.numel() == 0:  # validation batch of only unreadable files
                continue
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            yield self.normalize(images), targets


class StopSignalShield:
    """Keeps DataLoader workers alive through a preemption signal meant for the trainer.

    torchrun and SLURM deliver SIGTERM / SIGUSR1 to every process of the job, loader workers
    included; a worker killed by it makes the training process fail before it can write its
    preemption checkpoint. So workers ignore SIGUSR1, and ignore SIGTERM until their parent
    starts exiting: multiprocessing stops daemonic workers at exit with SIGTERM, which must
    still work. (Workers also end on their own when their parent dies.)
    """

    def __init__(self):
        self.parent_exiting = multiprocessing.Value("b", 0, lock=False)  # inherited by workers
        # Registered after multiprocessing's own exit hook, so it runs before it.
        atexit.register(self._mark_exiting)

    def _mark_exiting(self) -> None:
        self.parent_exiting.value = 1

    def worker_init(self, worker_id: int) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        if self.parent_exiting.value:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def cores_per_process(local_world: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores // max(local_world, 1))


def default_workers(local_world: int) -> int:
    """Loader processes per rank: the rank's share of the cores, one left for the rank itself."""
    return max(1, min(8, cores_per_process(local_world) - 1))


def _image_folder(root: Path, transform, replace_unreadable: bool) -> ImageFolderUint8:
    if not root.is_dir():
        raise UsageError(f"{root} does not exist: the dataset needs train/ and val/ folders of "
                         "class sub-folders (see data/prepare_imagenet_val.py)")
    try:
        return ImageFolderUint8(str(root), transform, replace_unreadable)
    except (FileNotFoundError, RuntimeError) as err:
        raise UsageError(f"{root}: {err}. Expected one sub-folder per class holding images "
                         "(e.g. make one with: python data/make_synthetic.py DIR)") from None


def image_folders(cfg: TrainConfig) -> Tuple[ImageFolderUint8, ImageFolderUint8]:
    """The train/ and val/ ImageFolders of --data, checked: both exist, no class folder is
    empty, and both have the same classes (so label i means the same class in both)."""
    root = Path(cfg.data)
    if not root.is_dir():
        raise UsageError(f"data folder {root} does not exist")
    train_set = _image_folder(root / "train", train_transform(cfg.image_size), True)
    val_set = _image_folder(root / "val", val_transform(cfg.image_size), False)
    if val_set.classes != train_set.classes:
        missing = sorted(set(train_set.classes) ^ set(val_set.classes))[:5]
        raise UsageError(f"{root}: val/ and train/ class folders differ (e.g. {missing})")
    return train_set, val_set


def local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def build_pytorch_loaders(cfg: TrainConfig, strategy, device: torch.device):
    train_set, val_set = image_folders(cfg)
    rank, world = strategy.shard()
    workers = cfg.workers if cfg.workers >= 0 else default_workers(local_world_size())
    seed = cfg.seed or 0
    shield = StopSignalShield()

    def make(dataset, shuffle: bool, drop_last: bool, subset=None) -> DeviceLoader:
        sampler = ShardedSampler(len(dataset), rank, world, shuffle=shuffle, seed=seed,
                                 subset=subset)
        loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                            num_workers=workers, collate_fn=collate_uint8,
                            pin_memory=device.type == "cuda", drop_last=drop_last,
                            persistent_workers=workers > 0, worker_init_fn=shield.worker_init)
        return DeviceLoader(loader, sampler, device, cfg.channels_last)

    # Training drops the last partial batch so every step has the same size on every rank.
    train_subset = strategy.train_subset(train_set.targets)
    return (make(train_set, True, True, train_subset), make(val_set, False, False),
            len(train_set.classes))


# --- the synthetic backend -----------------------------------------------------------------------
class SyntheticLoader:
    """One random batch kept on the device: measures compute with no input pipeline at all."""

    def __init__(self, size: int, batch_size: int, num_classes: int, image_size: int,
                 rank: int, world: int, train: bool, device: torch.device, channels_last: bool,
                 seed: int):
        self.num_samples = (size // world) if train else len(range(rank, size, world))
        self.batch_size, self.train, self.skipped, self.start = batch_size, train, 0, 0
        g = torch.Generator().manual_seed(seed * 31 + rank)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.to(device).contiguous(memory_format=memory_format)
        self.targets = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.start = start_batch

    def close(self) -> None:
        pass

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return (full if self.train or rest == 0 else full + 1) - self.start

    def __iter__(self):
        for step in range(self.start, self.start + len(self)):
            n = min(self.batch_size, self.num_samples - step * self.batch_size)
            yield self.images[:n], self.targets[:n]


def build_synthetic_loaders(cfg: TrainConfig, strategy, device: torch.device):
    rank, world = strategy.shard()
    common = dict(batch_size=cfg.batch_size, num_classes=cfg.synthetic_classes,
                  image_size=cfg.image_size, rank=rank, world=world, device=device,
                  channels_last=cfg.channels_last, seed=cfg.seed or 0)
    return (SyntheticLoader(cfg.synthetic_train_size, train=True, **common),
            SyntheticLoader(cfg.synthetic_val_size, train=False, **common),
            cfg.synthetic_classes)


def build_dali_loaders(cfg: TrainConfig, strategy, device: torch.device):
    from .dali import build_dali_loaders as build  # DALI is optional: import only when asked
    return build(cfg, strategy, device)


BACKENDS = {
    "pytorch": build_pytorch_loaders,
    "synthetic": build_synthetic_loaders,
    "dali-cpu": build_dali_loaders,
    "dali-gpu": build_dali_loaders,
}


def build_loaders(cfg: TrainConfig, strategy, device: torch.device):
    """-> (train_loader, val_loader, num_classes); loaders yield (images, targets) on device."""
    return BACKENDS[cfg.backend](cfg, strategy, device)
