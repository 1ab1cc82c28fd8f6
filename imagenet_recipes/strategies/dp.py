"""DataParallel: one process drives every visible GPU (`train/dp.py`)."""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from ..runlog import console
from .base import Strategy


class _InPrecisionContext(nn.Module):
    """Runs the wrapped module inside the precision's forward context (autocast for O1)."""

    def __init__(self, module: nn.Module, context):
        super().__init__()
        self.module, self.context = module, context

    def forward(self, *args, **kwargs):
        with self.context():
            return self.module(*args, **kwargs)


class DataParallelStrategy(Strategy):
    """One process drives every visible GPU; the batch is split across them each step."""

    name = "dp"

    def setup_environment(self) -> torch.device:
        device = super().setup_environment()
        if device.type == "cpu":
            console("note: DataParallel without GPUs runs the model on the CPU as a plain module")
        return device

    def replica_module(self, model: nn.Module) -> nn.Module:
        # DataParallel: each replica runs in a thread of its own, and autocast state is per
        # thread. parallel_apply re-enters autocast with only `enabled`, so the replicas would
        # run at the device's default half type (fp16 on CUDA, even for a bf16 run, with no
        # loss scaler): each replica enters the precision's own context instead.
        return _InPrecisionContext(model, self.precision.forward_context)

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        if self.device.type != "cuda":
            return model
        # DataParallel: replicate the module to all GPUs every step; gradients land on GPU 0.
        return nn.DataParallel(self.replica_module(model))

    @property
    def num_devices(self) -> int:
        return torch.cuda.device_count() if self.device.type == "cuda" else 1

    @property
    def cuda_devices(self) -> List[torch.device]:
        return [torch.device("cuda", i) for i in range(self.num_devices)
                ] if self.device.type == "cuda" else []
