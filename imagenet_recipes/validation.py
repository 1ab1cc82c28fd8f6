"""The one validation routine: the engine's end-of-epoch validation, the parameter server's
background evaluations and the stand-alone evaluator all call `evaluate`.

Exact over any number of ranks: every rank evaluates its own unpadded shard and the sums (not
the means) are all-reduced, so each image counts exactly once.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn as nn

from .metrics import Stopwatch, SumMeter, correct_topk, summarize


def _no_reduction(sums: torch.Tensor) -> torch.Tensor:
    return sums


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, criterion: nn.Module,
             all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = _no_reduction
             ) -> Dict[str, float]:
    """-> loss, top1, top5 (%), count, seconds and img_s over the whole validation set.

    `model`: a float32 model, or one in its precision (the strategy's `eval_model`, whose
    output is in the loss's dtype). `all_reduce_sum`: the strategy's, when each rank holds one
    shard (collective: every rank must call `evaluate`)."""
    model.eval()
    meter = SumMeter(("loss", "correct1", "correct5"), device)
    watch = Stopwatch(device)
    for images, targets in loader:
        output = model(images)
        loss = criterion(output, targets)
        correct1, correct5 = correct_topk(output, targets)
        meter.add(len(targets), loss=loss * len(targets), correct1=correct1, correct5=correct5)
    stats = summarize(meter.reduce(all_reduce_sum))
    seconds = watch.lap()
    return {**stats, "seconds": seconds, "img_s": stats["count"] / max(seconds, 1e-9)}
