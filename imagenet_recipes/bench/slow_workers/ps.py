"""The parameter server with slow workers: train/ps.py's run, where --worker-slowdown gives each
worker a step-time factor (a sleep of (factor - 1) x each step's time), from
--slowdown-from-epoch on: how sync, async and ESync behave when one worker is slower.

    torchrun --nproc_per_node=4 -m imagenet_recipes.bench.slow_workers.ps --mode esync \\
             --worker-slowdown 1,1,3 -a resnet18 data/synthetic

Every option of train/ps.py works here, --evaluator included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...ps.config import PSConfig
from .options import SlowWorkerOptions


@dataclass(frozen=True)
class SlowPSConfig(SlowWorkerOptions, PSConfig):
    """train/ps.py's options, plus the slow workers' (one factor per worker)."""


def main(description: str = "", argv: Optional[list] = None) -> None:
    from ...ps.main import main as run

    run("ps", description, argv, config_cls=SlowPSConfig)


if __name__ == "__main__":
    main(description=__doc__)
