"""Slow workers: an emulated heterogeneous cluster on identical devices, the instrument of the
benchmarks that compare synchronous and asynchronous training (bench.ps, bench.esync,
bench.hetero). Each process's step is followed by a sleep of (factor - 1) x the time the step
took, so a process with factor 3 takes 3x as long per step as its device needs and leaves the
device idle meanwhile (a sleep, not a busy loop: an emulated slow worker takes no CPU from the
others on a shared machine).

ESync's point is what a fast worker does while a slow one finishes its step, so measuring it on
a machine of equal devices needs unequal ones emulated. The emulation plugs into the product's
seam for it, `TrainConfig.step_hooks` (called after each training step of the engine's loop and
of a parameter-server worker); the product itself has no such option.

    torchrun --nproc_per_node=3 -m imagenet_recipes.bench.slow_workers.ddp \\
             --worker-slowdown 1,1,4 --slowdown-from-epoch 3 -a resnet18 data/synthetic
    torchrun --nproc_per_node=4 -m imagenet_recipes.bench.slow_workers.ps --mode esync \\
             --worker-slowdown 1,1,3 -a resnet18 data/synthetic

    options.py   SlowWorkerOptions (the two options, mixed into an entry's config), Slowdown
                 (the step hook), SlowTrainConfig (train/ddp.py's options plus these)
    ddp.py       train/ddp.py's run with SlowTrainConfig
    ps.py        SlowPSConfig (train/ps.py's options plus these), train/ps.py's run with it
"""
from __future__ import annotations

from .options import Slowdown, SlowTrainConfig, SlowWorkerOptions, parse_factors

__all__ = ["Slowdown", "SlowTrainConfig", "SlowWorkerOptions", "parse_factors"]
