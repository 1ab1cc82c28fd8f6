"""Shared memory for the batches of the `pytorch` backend's loader workers, written again once
the training process has let a batch go.

A worker hands a batch to the training process in shared memory. A fresh segment per batch
costs the worker a page fault for every 4 kB it writes: on a 2-core EPYC, collating 224 px
samples took 120 us per image into a fresh segment against 20 us into one written before,
about 7 % of a worker's time. So each worker keeps a few segments (`SLOTS`) and writes a batch
into one the training process has released. The handshake is a small shared table, one flag
per worker and slot: the worker sets it when it sends a batch from that slot, the training
process clears it once it has read the batch (made its float copy, or its pinned copy on a GPU
machine). A batch that is never released (an epoch left early) keeps its slot; a worker with no
slot free writes into a fresh segment, as DataLoader's own collate does. Nothing is ever
written into memory the training process may still read.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

SLOTS = 4  # per worker: its prefetch_factor (2) in flight, one being read, one spare

Tag = Optional[Tuple[int, int]]  # (worker, slot) of a batch's memory; None: a fresh segment


class BatchSlots:
    """The slots of one DataLoader's workers. Made in the training process; each worker gets a
    copy (pickled with the collate function) that shares the flags and keeps its own segments."""

    def __init__(self, workers: int, slots: int = SLOTS):
        self.in_use = torch.zeros((max(1, workers), slots), dtype=torch.int32).share_memory_()
        self.segments: List[Optional[torch.UntypedStorage]] = [None] * slots

    def __getstate__(self) -> dict:
        return {"in_use": self.in_use}  # a worker's segments are its own

    def __setstate__(self, state: dict) -> None:
        self.in_use = state["in_use"]
        self.segments = [None] * self.in_use.shape[1]

    def batch(self, shape: Tuple[int, ...], dtype: torch.dtype) -> Tuple[torch.Tensor, Tag]:
        """In a loader worker: an empty tensor for a batch in a released slot's segment, else in
        a fresh one; and the tag the training process releases it by."""
        nbytes = math.prod(shape) * dtype.itemsize
        worker = torch.utils.data.get_worker_info().id
        flags = self.in_use[worker]
        for slot, segment in enumerate(self.segments):
            if flags[slot].item() != 0:
                continue
            if segment is None or segment.nbytes() < nbytes:
                segment = self.segments[slot] = torch.UntypedStorage._new_shared(nbytes)
            flags[slot] = 1
            return _view(segment, shape, dtype), (worker, slot)
        return fresh_batch(shape, dtype), None

    def release(self, tag: Tag) -> None:
        """In the training process, once nothing will read the batch again."""
        if tag is not None:
            worker, slot = tag  # a pair whatever carried it (two indices, never a row list)
            self.in_use[worker, slot] = 0


def fresh_batch(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor for a batch in a new shared segment (what DataLoader's collate makes)."""
    nbytes = math.prod(shape) * dtype.itemsize
    return _view(torch.UntypedStorage._new_shared(nbytes), shape, dtype)


def _view(segment: torch.UntypedStorage, shape: Tuple[int, ...], dtype: torch.dtype
          ) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(segment, 0, shape)
