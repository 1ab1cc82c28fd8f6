"""Distribution strategies: one small class each, in a module of its own, behind one interface
(`base.Strategy`, which is also the single-process strategy).

    base.py           Strategy (nd), pick_device
    dp.py             DataParallelStrategy
    process_group.py  ProcessGroupStrategy: what DDP and FSDP share (torch.distributed), free_port
    ddp.py            DDPStrategy
    fsdp.py           FSDPStrategy (FSDP2: fully_shard)
    horovod.py        HorovodStrategy

The registry lists them (`registry.STRATEGIES`: the class and the capabilities it provides, from
which the command line derives the options each entry script shows and accepts);
`strategy_class` resolves an entry's strategy to its class.
"""
from __future__ import annotations

import importlib

from ..registry import STRATEGIES
from .base import Strategy, pick_device
from .ddp import DDPStrategy
from .dp import DataParallelStrategy
from .fsdp import FSDPStrategy
from .horovod import HorovodStrategy
from .process_group import ProcessGroupStrategy, free_port

__all__ = ["DDPStrategy", "DataParallelStrategy", "FSDPStrategy", "HorovodStrategy",
           "ProcessGroupStrategy", "Strategy", "free_port", "pick_device", "strategy_class"]


def strategy_class(strategy: str) -> type:
    """A key of registry.STRATEGIES (an Entry's `strategy`) -> its class."""
    module, name = STRATEGIES[strategy].path.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
