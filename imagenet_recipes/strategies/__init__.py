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

# Names the package offers, from the module that defines them, imported on first use (PEP 562):
# an entry script imports only its own strategy's module (FSDP's imports alone take 0.2 s).
_EXPORTS = {
    "Strategy": "base", "pick_device": "base", "DataParallelStrategy": "dp",
    "ProcessGroupStrategy": "process_group", "free_port": "process_group",
    "DDPStrategy": "ddp", "FSDPStrategy": "fsdp", "HorovodStrategy": "horovod",
}
__all__ = sorted(_EXPORTS) + ["strategy_class"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def strategy_class(strategy: str) -> type:
    """A key of registry.STRATEGIES (an Entry's `strategy`) -> its class."""
    module, name = STRATEGIES[strategy].path.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
