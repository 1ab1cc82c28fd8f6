"""The local SGD experiment's options: train/ddp.py's, plus when to average and how, and the slow
workers' (local SGD is studied on workers of different speeds: lab/hetero.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...config import TrainConfig
from ...errors import UsageError
from ...bench.slow_workers.options import SlowWorkerOptions
from .options import LocalSGDOptions


@dataclass(frozen=True)
class LocalSGDConfig(LocalSGDOptions, SlowWorkerOptions, TrainConfig):
    """train/ddp.py's options, local SGD's section and the slow workers'."""

    def validate_extra(self) -> None:
        super().validate_extra()
        if self.local_sgd_outer_lr <= 0 or not 0 <= self.local_sgd_outer_momentum < 1:
            raise UsageError("--local-sgd-outer-lr must be > 0 and --local-sgd-outer-momentum "
                             "in [0, 1)")
        if (self.local_sgd_outer_lr != 1 or self.local_sgd_outer_momentum) and \
                not self.local_sgd_period:
            raise UsageError("--local-sgd-outer-lr and --local-sgd-outer-momentum shape local "
                             "SGD's averaging: give --local-sgd-period too")
        if self.local_sgd_period < 0 or self.local_sgd_warmup_steps < 0:
            raise UsageError("--local-sgd-period and --local-sgd-warmup-steps must be >= 0")
        if self.local_sgd_period and (self.opt_level in ("O2", "O3")
                                      or self.ddp_comm_hook != "none"):
            raise UsageError("--local-sgd-period works at O0 and O1 without --ddp-comm-hook: "
                             "O2's fp32 masters and O3's half weights are not averaged, and "
                             "after the warm-up no gradient is communicated for a hook to "
                             "compress")
