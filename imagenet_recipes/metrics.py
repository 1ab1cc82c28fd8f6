"""Accuracy, summed meters with cross-rank reduction, throughput.

Meters accumulate *sums and counts* as device tensors and are read only at print intervals, so
the hot loop never forces a device sync. Reducing sums (not averages) across ranks is what makes
distributed validation exact when shards differ in size.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, Tuple

import torch


def correct_topk(output: torch.Tensor, target: torch.Tensor, ks: Iterable[int] = (1, 5)
                 ) -> Tuple[torch.Tensor, ...]:
    """Number of samples whose target is in the top-k predictions, for each k."""
    ks = tuple(ks)
    maxk = min(max(ks), output.shape[1])
    pred = output.topk(maxk, dim=1).indices
    hit = pred.eq(target.view(-1, 1))
    return tuple(hit[:, :min(k, maxk)].any(dim=1).sum() for k in ks)


class SumMeter:
    """Sums of named quantities plus a sample count; `reduce` sums them over ranks."""

    def __init__(self, names: Iterable[str], device: torch.device):
        self.names = tuple(names)
        self.device = device
        self.reset()

    def reset(self) -> None:
        # float64 so that exact counts (up to 2**53) stay exact after the all-reduce
        self.sums = torch.zeros(len(self.names) + 1, dtype=torch.float64, device=self.device)

    def add(self, count: int, **values: torch.Tensor) -> None:
        update = torch.stack([values[n].detach().to(torch.float64).reshape(())
                              for n in self.names])
        self.sums[:-1] += update
        self.sums[-1] += count

    def reduce(self, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
               ) -> Dict[str, float]:
        """-> {'count', name: sum} summed over the ranks by `all_reduce_sum` (the strategy's;
        a collective: every rank must call it)."""
        total = all_reduce_sum(self.sums.clone()).tolist()
        return {"count": total[-1], **dict(zip(self.names, total[:-1]))}


def summarize(sums: Dict[str, float]) -> Dict[str, float]:
    """loss/top1/top5 means (top-k in %) from the reduced sums of `SumMeter`."""
    n = max(sums["count"], 1.0)
    return {"loss": sums["loss"] / n, "top1": 100.0 * sums["correct1"] / n,
            "top5": 100.0 * sums["correct5"] / n, "count": int(sums["count"])}


class Stopwatch:
    """Wall time since the last `lap()`, syncing the device first so GPU work is counted."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start = time.perf_counter()

    def lap(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        elapsed, self.start = now - self.start, now
        return elapsed
