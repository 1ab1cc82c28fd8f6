"""The small host tensors one batch needs on the device (gather indices, crop boxes, flips,
targets), sent with one copy.

`--data-backend gpu` builds them on the host, a few per group of crops. Each `.to(device)` of
its own is a host-to-device copy that, from pageable memory, waits until the copy is done; on
the side stream the batches are prepared on, that is behind whatever that stream was given
before, so the thread preparing batches spends its time waiting instead of decoding ahead. Here
they are packed, 8-byte aligned, into one pinned buffer and sent with one non-blocking copy on
the current stream; each comes back as a view of the copy, in its dtype and shape. PyTorch's
pinned-memory allocator does not hand the buffer out again before the copy has read it.
"""
from __future__ import annotations

from typing import List

import torch

_ALIGN = 8  # the largest element size packed here (int64): every view starts aligned


class HostBatch:
    def __init__(self, device: torch.device):
        self.device = device
        self.parts: List[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> int:
        """Keep a host tensor for the copy. -> its index in what send() returns."""
        assert tensor.device.type == "cpu", "only host tensors are packed"
        self.parts.append(tensor.contiguous())
        return len(self.parts) - 1

    def send(self) -> List[torch.Tensor]:
        """Every tensor added, on the device, after one copy (none where the device is the
        CPU: the tensors are returned as they are)."""
        if not packs(self.device):
            return list(self.parts)
        sizes = [_aligned(p.numel() * p.element_size()) for p in self.parts]
        host = torch.empty(sum(sizes), dtype=torch.uint8,
                           pin_memory=self.device.type == "cuda")
        at = 0
        for part, size in zip(self.parts, sizes):
            nbytes = part.numel() * part.element_size()
            host[at:at + nbytes].copy_(part.view(-1).view(torch.uint8))
            at += size
        sent = host.to(self.device, non_blocking=True)
        views, at = [], 0
        for part, size in zip(self.parts, sizes):
            nbytes = part.numel() * part.element_size()
            views.append(sent[at:at + nbytes].view(part.dtype).view(part.shape))
            at += size
        return views


def packs(device: torch.device) -> bool:
    """Whether tensors for `device` are packed and copied (not where they already are)."""
    return device.type != "cpu"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN
