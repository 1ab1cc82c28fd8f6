"""DDP with slow workers: train/ddp.py's run, where --worker-slowdown makes some processes
emulate slower devices (a sleep of (factor - 1) x each step's time), from --slowdown-from-epoch
on.

    torchrun --nproc_per_node=3 -m imagenet_recipes.bench.slow_workers.ddp \\
             --worker-slowdown 1,1,4 -a resnet18 data/synthetic

Every option of train/ddp.py works here; evaluate its checkpoints with train/ddp.py -e.
"""
from __future__ import annotations

from typing import Optional

from .options import SlowTrainConfig


def main(description: str = "", argv: Optional[list] = None) -> None:
    from ...cli import main as train

    train(entry="ddp", description=description, argv=argv, config_cls=SlowTrainConfig)


if __name__ == "__main__":
    main(description=__doc__)
