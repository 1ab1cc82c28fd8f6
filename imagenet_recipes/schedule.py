"""Learning-rate schedule: linear scaling by global batch, a warm-up, then one decay shape.

  step       x --lr-gamma every --lr-step-size epochs (torchvision's StepLR)
  multistep  x --lr-gamma at each epoch of --lr-steps (Goyal et al.: 30, 60, 80)
  cosine     half a cosine from the peak down to --lr-min (NVIDIA's and torchvision V2's)
  linear     a straight line down to --lr-min
  poly       (1 - progress) ** --lr-power, down to --lr-min

The decay starts after the warm-up and ends at the last step of the last epoch. Everything is a
per-optimizer-step multiplier of the peak lr for LambdaLR, so the warm-up is smooth within an
epoch and the schedule is a pure function of the step: a resumed run (on any number of
processes) puts it where it belongs with `set_position`.
"""
from __future__ import annotations

import math
import warnings

import torch

from .options import OptimizerOptions, ScheduleOptions


def scaled_lr(cfg: OptimizerOptions, global_batch: int) -> float:
    """The classic linear scaling rule: --lr is the rate for a global batch of 256."""
    return cfg.lr if cfg.no_lr_scaling else cfg.lr * global_batch / 256


# What the warnings below look for. The published momentum-SGD recipes in recipes/ use 0.10-0.26
# per 256 images (Goyal et al. 0.1, FFCV 0.106, torchvision V2 0.125, NVIDIA 0.256): an --lr
# well above that is most likely torchvision's or timm's absolute lr of a larger batch.
# Goyal et al. needed a warm-up from a global batch of 2k on.
SGD_LR_PER_256_WARNING = 0.4
WARMUP_BATCH_WARNING = 2048
SGD_LIKE = ("sgd", "nesterov")


def lr_warnings(cfg: OptimizerOptions, warmup_epochs: float, global_batch: int,
                lr: float) -> list:
    """Lines warning of an --lr that looks given as torchvision's or timm's absolute one, and
    of a large global batch without a warm-up."""
    lines = []
    if (not cfg.no_lr_scaling and cfg.optimizer in SGD_LIKE and global_batch != 256
            and cfg.lr > SGD_LR_PER_256_WARNING):
        lines.append(f"warning: --lr {cfg.lr:g} is per 256 images here: at global batch "
                     f"{global_batch} the lr is {lr:.4g}. If {cfg.lr:g} is the lr itself (as "
                     f"in torchvision's and timm's commands), pass --lr "
                     f"{cfg.lr * 256 / global_batch:.4g} or --no-lr-scaling")
    if global_batch >= WARMUP_BATCH_WARNING and warmup_epochs == 0:
        lines.append(f"warning: global batch {global_batch} with no warm-up: large batches "
                     "diverge early without one (Goyal et al. warm up for 5 epochs); add "
                     "--warmup-epochs 5, or use a preset (--config goyal_8k)")
    return lines


class LrMultiplier:
    """step -> multiplier of the peak lr, a pure function of the optimizer step and the config.
    `peak_lr` (the scaled --lr) turns the absolute --lr-min into a fraction of it.

    Holds plain numbers only: LambdaLR puts a callable object's attributes in its state_dict,
    which checkpoints load with weights_only=True."""

    def __init__(self, cfg: ScheduleOptions, steps_per_epoch: int, peak_lr: float):
        self.schedule, self.gamma, self.power = cfg.lr_schedule, cfg.lr_gamma, cfg.lr_power
        self.milestones, self.step_size = tuple(cfg.lr_steps), cfg.lr_step_size
        self.warmup_method, self.warmup_start = cfg.warmup_method, cfg.warmup_start_factor
        self.steps_per_epoch = max(steps_per_epoch, 1)
        self.warmup_steps = int(round(cfg.warmup_epochs * self.steps_per_epoch))
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.floor = min(cfg.lr_min / peak_lr, 1.0) if peak_lr > 0 else 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            start = self.warmup_start
            if self.warmup_method == "constant":
                return start
            return start + (1.0 - start) * (step + 1) / self.warmup_steps
        if self.schedule in ("step", "multistep"):
            epoch = step / self.steps_per_epoch
            drops = (int(epoch // self.step_size) if self.schedule == "step"
                     else sum(epoch >= m for m in self.milestones))
            return self.gamma ** drops
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        if self.schedule == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:  # linear, poly
            shape = (1.0 - progress) ** (1.0 if self.schedule == "linear" else self.power)
        return self.floor + (1.0 - self.floor) * shape


class StepSchedule(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR over loop steps, the skipped ones included.

    float16 loss scaling skips the first optimizer step by design (GradScaler starts at 2**16,
    the gradients overflow, the scale halves), so torch's check that `optimizer.step()` ran
    before the first `scheduler.step()` warns of a bug that is not there. The schedule is a
    function of the loop's step, as apex's and NVIDIA's recipes count it, so it is not shifted
    to hide the skip: only that one warning, on the first step, is.
    """

    def step(self, epoch=None) -> None:
        if self._step_count != 1:  # torch checks the order on the first step only
            return super().step(epoch)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of "
                                    r"`lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")
            return super().step(epoch)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleOptions,
                    steps_per_epoch: int, peak_lr: float) -> StepSchedule:
    return StepSchedule(optimizer, LrMultiplier(cfg, steps_per_epoch, peak_lr))


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
