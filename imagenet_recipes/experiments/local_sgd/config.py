"""The local SGD experiment's options: train/ddp.py's, plus when to average and how, and the slow
workers' (local SGD is studied on workers of different speeds: lab/hetero.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...config import TrainConfig
from ...options import opt
from ...errors import UsageError
from ...bench.slow_workers.options import SlowWorkerOptions

LOCAL_SGD = "local SGD (experiment)"  # the help group of the options below


@dataclass(frozen=True)
class LocalSGDConfig(SlowWorkerOptions, TrainConfig):
    local_sgd_period: int = field(default=0, metadata=opt(
        LOCAL_SGD, "--local-sgd-period",
        help="post-local SGD: after --local-sgd-warmup-steps of plain DDP, each process steps "
             "on its own gradients and the models are averaged every H optimizer steps (0: "
             "off, plain DDP; 1: the same updates as DDP, by averaging weights instead of "
             "gradients)"))
    local_sgd_warmup_steps: int = field(default=0, metadata=opt(
        LOCAL_SGD, "--local-sgd-warmup-steps",
        help="optimizer steps of plain DDP (gradients all-reduced) before the local steps "
             "begin (Lin et al.'s post-local SGD starts after the first lr decay)"))
    local_sgd_outer_lr: float = field(default=1.0, metadata=opt(
        LOCAL_SGD, "--local-sgd-outer-lr",
        help="an outer SGD step on each average, DiLoCo-style (Douillard et al., 2023): the "
             "weights move by this times the ranks' mean change (with "
             "--local-sgd-outer-momentum, Nesterov momentum over those changes). 1 with "
             "momentum 0: plain averaging (default); DiLoCo: 0.7 with momentum 0.9"))
    local_sgd_outer_momentum: float = field(default=0.0, metadata=opt(
        LOCAL_SGD, "--local-sgd-outer-momentum",
        help="Nesterov momentum of the outer step (default 0: none)"))

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
