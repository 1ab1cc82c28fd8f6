"""DistributedDataParallel: one process per device (`train/ddp.py`, `train/ddp_apex.py`)."""
from __future__ import annotations

from typing import Optional

import torch.nn as nn

from ..comm_hooks import LossScaledPowerSGD, powersgd_hook
from ..options.distribution import DdpOptions
from ..options.strategy import StrategyOptions
from ..precision import Precision
from .process_group import ProcessGroupStrategy


class DDPStrategy(ProcessGroupStrategy):
    """One process per device; gradients all-reduced in buckets, overlapped with backward."""

    name = "ddp"
    SECTIONS = (DdpOptions,)

    def __init__(self, precision: Optional[Precision] = None, *, comm_hook: str = "none",
                 powersgd_rank: int = 1, powersgd_start_step: int = 10, **common):
        super().__init__(precision, **common)
        self.comm_hook = comm_hook
        self.powersgd_rank, self.powersgd_start_step = powersgd_rank, powersgd_start_step
        self.powersgd: Optional[LossScaledPowerSGD] = None  # --ddp-comm-hook powersgd's state

    @classmethod
    def arguments(cls, options: StrategyOptions) -> dict:
        hooks = options.section(DdpOptions)
        return {**super().arguments(options), "share_gpus": options.distribution.share_gpus,
                "comm_hook": hooks.ddp_comm_hook, "powersgd_rank": hooks.powersgd_rank,
                "powersgd_start_step": hooks.powersgd_start_step}

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        # DDP: broadcasts rank 0's parameters and buffers at construction, then all-reduces
        # gradient buckets during backward.
        ids = [self.device.index] if self.device.type == "cuda" else None
        one_bucket = self.comm_hook == "powersgd" and self.backend == "gloo"
        # DDP: PowerSGD chains a second all-reduce onto each bucket's first one, in a callback.
        # gloo completes buckets in any order, so ranks would issue those second all-reduces in
        # different orders and mismatch (pytorch#58467): on gloo PowerSGD gets one bucket per
        # dtype (O2 has two: half weights, fp32 norm layers), and the hook finishes each
        # bucket before DDP hands it the next (LossScaledPowerSGD's `synchronous`).
        # gradient_as_bucket_view: each .grad is a view into its all-reduce bucket, so the
        # averaged bucket is the gradient (no copy back into .grad after every all-reduce, one
        # gradient-sized allocation less); the values are the same (test_parity, float64).
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=1e5 if one_bucket else None,
            gradient_as_bucket_view=True)
        self._register_comm_hook(ddp)
        self.wrapper = ddp
        return ddp

    def _register_comm_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """DDP: replace the plain bucket all-reduce by one of PyTorch's built-in hooks."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.comm_hook == "fp16":
            # Half the bytes on the wire; the averaged bucket is cast back to the grad dtype.
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.comm_hook == "powersgd":
            # Rank-r factors instead of full gradient matrices; the compression error is fed
            # back into the next step. Its error-feedback state is not checkpointed: after a
            # resume it starts again from zero (one step of slightly different compression).
            # The hook sees loss-scaled gradients: the wrapper keeps PowerSGD's memories in
            # the current scale's units and free of an overflow's inf/NaN (comm_hooks.py).
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.powersgd_start_step, random_seed=self.seed)
            self.powersgd = LossScaledPowerSGD(state, self.precision.loss_scale,
                                               synchronous=self.backend == "gloo")
            ddp.register_comm_hook(self.powersgd, powersgd_hook)

    def eval_model(self) -> nn.Module:
        # DDP: validate with the plain module (the wrapper would broadcast in every forward, and
        # shards differ in length), but first give every rank rank 0's buffers: each rank has
        # updated its BatchNorm running stats with its own batches since the last broadcast,
        # and the checkpoint holds rank 0's, so that is the model validation must score.
        self.share_buffers(self.module)
        return self.precision.wrap(self.module)

    def _no_sync(self):
        # DDP: skip the gradient all-reduce on accumulation micro-steps.
        return self.wrapper.no_sync()

    def describe(self) -> dict:
        return {**super().describe(), "comm_hook": self.comm_hook}
