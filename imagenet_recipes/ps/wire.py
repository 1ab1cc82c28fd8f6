"""What travels between server and workers: flat lists of tensors in the model's own parameter
and buffer order (never modules or pickled objects with code), plus small dicts of numbers.
Both sides build the same architecture, so position i means the same tensor on each."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn as nn

SERVER = "ps"  # server 0, the coordinator


def server_name(server: int) -> str:
    return SERVER if server == 0 else f"{SERVER}{server}"


def worker_name(worker: int) -> str:
    return f"worker{worker}"


def parameters(model: nn.Module) -> List[torch.Tensor]:
    return [p for p in model.parameters()]


def buffers(model: nn.Module) -> List[torch.Tensor]:
    return [b for b in model.buffers()]


def snapshot(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """CPU copies, safe to send while the originals keep changing."""
    return [t.detach().to("cpu", copy=True) for t in tensors]


def clone_nested(obj):
    """A copy of a state dict's tensors (nested in dicts and lists), the rest as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_nested(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_nested(v) for v in obj]
    return obj


@torch.no_grad()
def load_buffers(model: nn.Module, bufs: Sequence[torch.Tensor]) -> None:
    """The server's BatchNorm statistics into the model (the parameters go through the
    precision plugin, which also sets O2's masters)."""
    for target, value in zip(model.buffers(), bufs):
        target.copy_(value)


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.no_grad()
def average_buffers(sums: List[torch.Tensor], new: Sequence[torch.Tensor], first: bool) -> None:
    """Accumulate BatchNorm buffers over a round: float ones are summed (divided by the worker
    count later), integer counters (num_batches_tracked) keep the largest."""
    for i, value in enumerate(new):
        if first:
            sums[i] = value.clone()
        elif value.is_floating_point():
            sums[i] += value
        else:
            torch.maximum(sums[i], value, out=sums[i])


def divide_float(tensors: List[torch.Tensor], n: int) -> None:
    for t in tensors:
        if t.is_floating_point():
            t /= n


def ping() -> bool:
    """Answered by any live process: the server's liveness probe of a silent worker."""
    return True


Reply = Tuple[List[torch.Tensor], List[torch.Tensor], dict]  # params, buffers, control
