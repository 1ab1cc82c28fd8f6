"""Post-local SGD and DiLoCo over DDP: `torchrun ... -m imagenet_recipes.experiments.local_sgd
--local-sgd-period H ...` (every option of train/ddp.py, plus the four below in config.py).

    config.py    LocalSGDConfig: the options (no torch import: the command line is read first)
    strategy.py  LocalSGD (when to communicate, what an average does) and LocalSGDStrategy,
                 the DDP strategy that keeps gradients on their rank and averages the models
"""
from __future__ import annotations

from typing import Optional

from .config import LocalSGDConfig

STRATEGY = "imagenet_recipes.experiments.local_sgd.strategy:LocalSGDStrategy"


def main(description: str = "", argv: Optional[list] = None) -> None:
    """The experiment's command (__main__.py): train/ddp.py's run, with this experiment's
    options and strategy."""
    from ...cli import main as train

    train(entry="ddp", description=description, argv=argv, config_cls=LocalSGDConfig,
          strategy=STRATEGY)
