"""Distribution strategies: one small class each, in a module of its own, behind one interface
(`base.Strategy`, which is also the single-process strategy).

    base.py     Strategy (nd), pick_device
    dp.py       DataParallelStrategy
    ddp.py      DDPStrategy, free_port
    horovod.py  HorovodStrategy

The registry names each entry script's class (`Entry.strategy`); `strategy_class` resolves that
name.
"""
from __future__ import annotations

import importlib

from .base import Strategy, pick_device
from .ddp import DDPStrategy, free_port
from .dp import DataParallelStrategy
from .horovod import HorovodStrategy

__all__ = ["DDPStrategy", "DataParallelStrategy", "HorovodStrategy", "Strategy", "free_port",
           "pick_device", "strategy_class"]


def strategy_class(path: str) -> type:
    """'module:Class' of this package (a registry Entry's `strategy`) -> the class."""
    module, name = path.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
