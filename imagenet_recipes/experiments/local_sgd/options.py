"""When local SGD's ranks average their models, and how: the section that only
LocalSGDStrategy reads."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...options import Section, opt

LOCAL_SGD = "local SGD (experiment)"  # the help group of the options below


@dataclass(frozen=True)
class LocalSGDOptions(Section):
    """When the ranks average their models, and how (LocalSGDStrategy's own section)."""
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
