"""Learning-rate schedule: linear scaling by global batch, linear warm-up, then step or cosine.

Implemented as a per-optimizer-step multiplier for LambdaLR, so warm-up is smooth within an epoch
and the scheduler's position is part of the checkpoint.
"""
from __future__ import annotations

import math

import torch

from .config import TrainConfig


def scaled_lr(cfg: TrainConfig, global_batch: int) -> float:
    """The classic linear scaling rule: --lr is the rate for a global batch of 256."""
    return cfg.lr if cfg.no_lr_scaling else cfg.lr * global_batch / 256


class LrMultiplier:
    """step -> multiplier of the base lr, a pure function of the optimizer step and the config."""

    def __init__(self, cfg: TrainConfig, steps_per_epoch: int):
        self.schedule = cfg.lr_schedule
        self.milestones = tuple(cfg.lr_steps)
        self.steps_per_epoch = max(steps_per_epoch, 1)
        self.warmup_steps = int(round(cfg.warmup_epochs * self.steps_per_epoch))
        self.total_steps = cfg.epochs * self.steps_per_epoch

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "cosine":
            span = max(self.total_steps - self.warmup_steps, 1)
            progress = min((step - self.warmup_steps) / span, 1.0)
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        epoch = step / self.steps_per_epoch
        return 0.1 ** sum(epoch >= m for m in self.milestones)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int):
    multiplier = LrMultiplier(cfg, steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def set_position(scheduler, step: int) -> None:
    """Put the schedule at optimizer step `step` of the CURRENT configuration.

    Used on resume instead of loading the old scheduler state, which would bring back the old
    run's base lr (another --lr, -b or world size) and count steps of another epoch length.
    """
    scheduler.last_epoch = step
    for group, base, multiplier in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                       scheduler.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * multiplier(step)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
