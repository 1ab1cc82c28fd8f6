"""Which samples a process reads, in which order: the shard description and the sampler.

Sharding always uses the GLOBAL rank and world size. Training shards are equal in size (padded
by wrapping around, like DistributedSampler, so every rank runs the same number of steps);
validation shards are NOT padded, so every validation image is counted exactly once.

Augmentation randomness is a function of (seed, epoch, sample index) only, not of the worker or
rank that happens to load the sample: that is what makes runs with different process counts (and
resumed runs) see the same crops.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch.utils.data import Sampler

from ..options import AugmentOptions
from .augment import progressive_crop


def _alone(obj: Any) -> List[Any]:
    return [obj]


@dataclass(frozen=True)
class Shard:
    """What a loader needs to know about the process it feeds (never the strategy itself)."""
    rank: int = 0                # the GLOBAL rank the data is sharded by
    world_size: int = 1
    local_world_size: int = 1    # processes on this node: sizes loader workers and DALI threads
    is_main: bool = True         # prints the notes meant for the user once
    # Every rank's object, in rank order (a collective on every rank): DALI's file check.
    gather: Callable[[Any], List[Any]] = _alone
    # Training-set indices this process may sample from, given every sample's label (None: all).
    # Only the parameter server's --split by-class restricts it.
    train_subset: Optional[Callable[[Sequence[int]], List[int]]] = None


def sample_seed(seed: int, epoch: int, index: int, copy: int = 0) -> int:
    """The augmentation seed of one sample in one epoch (independent of rank and worker);
    `copy`: which repetition of it under --ra-sampler (each gets its own crop)."""
    return (seed * 1_000_003 + epoch * 7_919 + index * 104_729 + copy * 15_485_863) % (2 ** 63)


class SampleKey(NamedTuple):
    """What the sampler hands the dataset for one sample."""
    index: int
    seed: int                # its augmentation randomness (sample_seed)
    crop: Optional[int]      # the train crop size of this epoch (None: the dataset's default)


class ShardedSampler(Sampler):
    """Yields a `SampleKey` for each sample of this rank's shard of one epoch.

    train: a permutation seeded by (seed, epoch) only, so every world size walks the same global
           order. Rank r of W takes positions r, r+W, r+2W, ... (padded to a multiple of W by
           wrapping around), so the union over ranks of the k-th batches is exactly the k-th
           global batch of a single-process run.
    val:   sequential, positions r, r+W, ...; no padding (shards may differ by one image).

    The position inside the epoch is counted in GLOBAL samples (`set_epoch(epoch, start)`: the
    first `start` samples of the global order are done), so a run stopped mid-epoch continues
    on any number of processes with no sample repeated or lost.

    Repeated augmentation (`repeats` > 1, train only): the global order lists each image of
    the permutation `repeats` times in a row, cut to the epoch's usual length, so consecutive
    copies land on different ranks (rank r takes r, r+W, ...) and the epoch keeps its number
    of steps; each copy has its own augmentation seed. (torchvision's RASampler does the same
    per rank; here it is one global order, so it keeps the properties above.)
    """

    def __init__(self, size: int, rank: int, world: int, shuffle: bool, seed: int,
                 subset: Optional[Sequence[int]] = None, repeats: int = 1,
                 crop_of_epoch: Optional[Callable[[int], Optional[int]]] = None):
        """`subset`: sample only these dataset indices (a parameter-server worker's classes);
        `crop_of_epoch`: epoch -> train crop size (progressive resizing)."""
        self.subset = list(subset) if subset is not None else None
        self.size = len(self.subset) if subset is not None else size
        self.rank, self.world = rank, world
        self.shuffle, self.seed, self.epoch, self.start = shuffle, seed, 0, 0
        self.repeats = repeats if shuffle else 1
        self.crop_of_epoch = crop_of_epoch

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch; `start`: global samples of it already trained on (by all ranks)."""
        self.epoch, self.start = epoch, start

    def _remaining_order(self) -> List[Tuple[int, int]]:
        """(position, copy) pairs of the epoch's global order from `start` on (train: padded
        to a multiple of W)."""
        if not self.shuffle:
            return [(p, 0) for p in range(self.size)][self.start:]
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = [(p, copy) for p in torch.randperm(self.size, generator=g).tolist()
                 for copy in range(self.repeats)][:self.size]
        rest = order[self.start:]
        padding = (-len(rest)) % self.world
        return rest + (order * math.ceil(padding / max(len(order), 1)))[:padding]

    def __iter__(self) -> Iterator[SampleKey]:
        crop = self.crop_of_epoch(self.epoch) if self.crop_of_epoch else None
        for position, copy in self._remaining_order()[self.rank::self.world]:
            index = self.subset[position] if self.subset is not None else position
            yield SampleKey(index, sample_seed(self.seed, self.epoch, index, copy), crop)

    def __len__(self) -> int:
        remaining = max(self.size - self.start, 0)
        if self.shuffle:
            return math.ceil(remaining / self.world)
        return len(range(self.rank, remaining, self.world))


def train_sampling(cfg: AugmentOptions, train: bool) -> dict:
    """The training sampler's recipe options: repeated augmentation, progressive resizing."""
    if not train:
        return {}
    crop_of_epoch = (functools.partial(progressive_crop, cfg) if cfg.progressive_resize
                     else None)
    return {"repeats": cfg.ra_reps if cfg.ra_sampler else 1, "crop_of_epoch": crop_of_epoch}
