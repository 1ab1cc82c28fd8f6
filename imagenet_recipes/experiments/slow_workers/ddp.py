"""DDP with slow workers: train/ddp.py's run, its options plus the slow workers'."""
from __future__ import annotations

from typing import Optional

from .options import SlowTrainConfig


def main(description: str = "", argv: Optional[list] = None) -> None:
    """experiments/slow_ddp.py's whole body."""
    from ...cli import main as train

    train(entry="ddp", description=description, argv=argv, config_cls=SlowTrainConfig)
