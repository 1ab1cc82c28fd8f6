"""The slow workers' options and their step hook (no torch: the command line is read first)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Tuple

from ...config import TrainConfig
from ...options import opt
from ...errors import UsageError
from ...registry import PROCESSES

SLOW_WORKERS = "slow workers (emulated, bench.slow_workers)"  # the help group of the options below


def parse_factors(text: str) -> Tuple[float, ...]:
    """"1,1,3" -> (1.0, 1.0, 3.0); each factor >= 1 (1: full speed)."""
    try:
        factors = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--worker-slowdown takes comma-separated numbers, e.g. 1,1,3; got "
                         f"{text!r}") from None
    if not factors or any(f < 1.0 for f in factors):
        raise UsageError(f"--worker-slowdown factors must be >= 1 (1 = full speed), got {text!r}")
    return factors


class Slowdown:
    """A step hook: after each step of an epoch >= from_epoch, sleep (factor - 1) x its time."""

    def __init__(self, factor: float, from_epoch: int = 0):
        self.factor, self.from_epoch = factor, from_epoch

    def __call__(self, epoch: int, seconds: float) -> None:
        if epoch >= self.from_epoch:
            time.sleep((self.factor - 1) * seconds)


@dataclass(frozen=True)
class SlowWorkerOptions:
    """The options, mixed into an entry's config (before it: `class C(SlowWorkerOptions,
    TrainConfig)`), and the step hook they ask for."""
    worker_slowdown: Optional[str] = field(default=None, metadata=opt(
        SLOW_WORKERS, "--worker-slowdown",
        help="emulated heterogeneity: per-process step-time factors, e.g. 1,1,3 (the third "
             "process sleeps 2x its compute time after each step; default: all 1). On the "
             "parameter server, one factor per worker", needs=PROCESSES))
    slowdown_from_epoch: int = field(default=0, metadata=opt(
        SLOW_WORKERS, "--slowdown-from-epoch",
        help="--worker-slowdown takes effect from this epoch (counted from 0, as the log "
             "counts them); the epochs before it run at full speed: a worker that slows down "
             "midway", needs=PROCESSES))

    def validate_extra(self) -> None:
        super().validate_extra()
        if self.worker_slowdown is not None:
            parse_factors(self.worker_slowdown)
        if self.slowdown_from_epoch < 0:
            raise UsageError("--slowdown-from-epoch counts epochs from 0: give 0 or more")

    def step_hooks(self, rank: int, ranks: int, what: str = "processes") -> tuple:
        hooks = super().step_hooks(rank, ranks, what)
        if self.worker_slowdown is None:
            return hooks
        factors = parse_factors(self.worker_slowdown)
        if len(factors) != ranks:
            raise UsageError(f"--worker-slowdown has {len(factors)} factors but there are "
                             f"{ranks} {what}: give one factor each")
        if factors[rank] == 1:
            return hooks
        return (*hooks, Slowdown(factors[rank], self.slowdown_from_epoch))


@dataclass(frozen=True)
class SlowTrainConfig(SlowWorkerOptions, TrainConfig):
    """train/ddp.py's options, plus the slow workers'."""
