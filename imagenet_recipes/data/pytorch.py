"""`--data-backend pytorch`: torchvision decoding in DataLoader workers, uint8 batches,
normalisation on the device.

Batches travel as uint8 (4x less to copy than float) and are normalised on the device, as fast
ImageNet recipes do.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.data import DataLoader

from ..options import LoaderOptions
from ..run_plan import RunPlan
from .batch_memory import BatchSlots
from .folders import collate_uint8, image_folders, say_if_whole_decoding
from .loader_server import ensure_loader_server, loader_worker_context
from .loading import SampledLoader, WorkerGuard, loader_workers
from .sampling import Shard, ShardedSampler, train_sampling


class DeviceLoader(SampledLoader):
    """Wraps a uint8 DataLoader: moves batches to the device and normalises them there."""

    def __init__(self, loader, sampler, device: torch.device, channels_last: bool,
                 slots: BatchSlots):
        super().__init__(loader, sampler, device, channels_last)
        self.slots = slots

    def __iter__(self):
        self.skipped = 0
        for images, targets, skipped, tag in self.loader:
            self.skipped += skipped
            if images.numel() == 0:  # validation batch of only unreadable files
                continue
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            normalized = self.normalize(images)
            # Read: the float copy on a CPU; on a GPU the batch was pinned (copied) before it
            # got here. Its worker may write the next batch into this memory.
            self.slots.release(tag)
            yield normalized, targets


def build(options: LoaderOptions, shard: Shard, device: torch.device, plan: RunPlan):
    workers = loader_workers(options.data.workers, shard.local_world_size)
    start_method = loader_worker_context() if workers > 0 else None
    if start_method is not None:
        # Already running when an entry script started it (imagenet_recipes.cli); otherwise started
        # now, it imports the data modules while this process builds the model.
        ensure_loader_server()
    train_set, val_set = image_folders(options.data.data, options.augment)
    if shard.is_main:
        say_if_whole_decoding(train_set)
    seed = options.seed
    guard = WorkerGuard(start_method)

    def make(dataset, shuffle: bool, drop_last: bool, subset=None) -> DeviceLoader:
        sampler = ShardedSampler(len(dataset), shard.rank, shard.world_size, shuffle=shuffle,
                                 seed=seed, subset=subset,
                                 **train_sampling(options.augment, shuffle))
        slots = BatchSlots(workers)
        loader = DataLoader(dataset, batch_size=plan.batch_size, sampler=sampler,
                            num_workers=workers,
                            collate_fn=functools.partial(collate_uint8, slots=slots),
                            pin_memory=device.type == "cuda", drop_last=drop_last,
                            persistent_workers=workers > 0, worker_init_fn=guard.worker_init,
                            multiprocessing_context=start_method)
        return DeviceLoader(loader, sampler, device, plan.channels_last, slots)

    # Training drops the last partial batch so every step has the same size on every rank.
    train_subset = shard.train_subset(train_set.targets) if shard.train_subset else None
    return (make(train_set, True, True, train_subset), make(val_set, False, False),
            len(train_set.classes))
