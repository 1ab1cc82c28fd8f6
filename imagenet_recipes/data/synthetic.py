"""`--data-backend synthetic` (or `--dummy`): one random batch kept on the device, to measure
compute with no input pipeline at all."""
from __future__ import annotations

import torch

from ..options import LoaderOptions
from ..run_plan import RunPlan
from .augment import val_sizes
from .sampling import Shard


class SyntheticLoader:
    """One random batch kept on the device: measures compute with no input pipeline at all."""

    def __init__(self, size: int, batch_size: int, num_classes: int, image_size: int,
                 rank: int, world: int, train: bool, device: torch.device, channels_last: bool,
                 seed: int):
        self.num_samples = (size // world) if train else len(range(rank, size, world))
        self.batch_size, self.train, self.skipped, self.start = batch_size, train, 0, 0
        self.world = world
        self.workers = 0  # nothing to load
        g = torch.Generator().manual_seed(seed * 31 + rank)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.to(device).contiguous(memory_format=memory_format)
        self.targets = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)

    def set_epoch(self, epoch: int, start_sample: int = 0) -> None:
        self.start = start_sample // (self.batch_size * self.world)  # in this rank's batches

    def close(self) -> None:
        pass

    def state_dict(self) -> None:
        return None  # the same batch every step: nothing to resume

    def load_state_dict(self, state) -> None:
        pass

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return (full if self.train or rest == 0 else full + 1) - self.start

    def __iter__(self):
        for step in range(self.start, self.start + len(self)):
            n = min(self.batch_size, self.num_samples - step * self.batch_size)
            yield self.images[:n], self.targets[:n]



def build(options: LoaderOptions, shard: Shard, device: torch.device, plan: RunPlan):
    sizes, augment = options.own, options.augment  # own: SyntheticOptions
    common = dict(batch_size=plan.batch_size, num_classes=sizes.synthetic_classes,
                  rank=shard.rank, world=shard.world_size,
                  device=device, channels_last=plan.channels_last, seed=options.seed)
    return (SyntheticLoader(sizes.synthetic_train_size, train=True, image_size=augment.image_size,
                            **common),
            SyntheticLoader(sizes.synthetic_val_size, train=False, image_size=val_sizes(augment)[1],
                            **common),
            sizes.synthetic_classes)
