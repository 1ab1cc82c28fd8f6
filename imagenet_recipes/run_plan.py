"""What a run's options come to once its process count and device are known, worked out once,
before anything is built, by the engine and the parameter server alike: the images per forward
pass and the micro-batches per step (--global-batch splits itself among the processes), the
global batch, the peak lr (the linear scaling rule), and the memory layout (--channels-last
left unset is decided by the device), from the options a PlanOptions bundles. The parsed config
is never written: the builders take the plan, and the run's records (config.json, the run
record, each checkpoint's config) show the config with the plan's values in it
(lifecycle.planned_config), as a run of an earlier version wrote them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from .errors import UsageError
from .options import PlanOptions
from .presets import global_batch_target, large_batch_refusal, split_global_batch
from .schedule import scaled_lr

# The smallest train crop at which channels_last pays on a CPU (see channels_last_for).
CPU_CHANNELS_LAST_MIN_CROP = 112


@dataclass(frozen=True)
class RunPlan:
    world_size: int     # processes (a parameter server: its workers)
    batch_size: int     # images per process per forward pass: -b, or --global-batch's share
    grad_accum: int     # micro-batches per optimizer step
    channels_last: bool
    lr: float           # the peak lr: --lr per 256 images, scaled to the global batch

    @property
    def global_batch(self) -> int:
        """Images per optimizer step, all processes together."""
        return self.batch_size * self.world_size * self.grad_accum

    def settings(self) -> Dict[str, Any]:
        """The config fields the plan decides, as it decided them."""
        return {"batch_size": self.batch_size, "grad_accum": self.grad_accum,
                "channels_last": self.channels_last}


def channels_last_for(options: PlanOptions, device_type: str) -> bool:
    """--channels-last, or where it is left unset, what suits the device. On a CPU, oneDNN's
    convolutions train faster in channels_last at ImageNet-like crops and slower at small ones
    (the lab's layout study, lab/README.md, "Memory layout on a CPU"), so a CPU run takes it
    when its largest train crop is at least CPU_CHANNELS_LAST_MIN_CROP. On a GPU, tensor cores
    prefer it with a half type at any size; fp32 on a GPU and float64 keep NCHW."""
    if options.model.channels_last is not None:
        return options.model.channels_last
    if options.precision.float64:
        return False
    if device_type == "cpu":
        return options.augment.largest_train_crop() >= CPU_CHANNELS_LAST_MIN_CROP
    return options.precision.opt_level != "O0"


def _plan(options: PlanOptions, world_size: int, device_type: str, batch_size: int,
          grad_accum: int) -> RunPlan:
    """The plan at this -b and --grad-accum: the layout for the device, the linear rule's lr."""
    global_batch = batch_size * world_size * grad_accum
    return RunPlan(world_size, batch_size, grad_accum, channels_last_for(options, device_type),
                   scaled_lr(options.optimizer, global_batch))


def plan_as_given(options: PlanOptions, world_size: int, device_type: str) -> RunPlan:
    """-b and --grad-accum as given, on `world_size` processes: the parameter server's, whose
    update rules set their own lr (ps/update_rules.py; `lr` here is the linear rule's for one
    round of every process's batch) and which has no --global-batch."""
    return _plan(options, world_size, device_type, options.batch.batch_size,
                 options.batch.grad_accum)


def plan_run(options: PlanOptions, world_size: int, device_type: str) -> RunPlan:
    """The plan of a run's options on `world_size` processes of `device_type`; a UsageError
    where the global batch cannot be split among them, or is too large for the preset's
    recipe."""
    batch_size, grad_accum = options.batch.batch_size, options.batch.grad_accum
    target = global_batch_target(options.batch, options.preset)
    if target is not None:  # -b is then the most one forward pass may take
        batch_size, grad_accum = split_global_batch(target, world_size, batch_size)
    plan = _plan(options, world_size, device_type, batch_size, grad_accum)
    too_large = large_batch_refusal(options.preset, options.batch, options.optimizer,
                                    plan.global_batch, plan.lr)
    if too_large:
        raise UsageError(too_large)
    return plan
