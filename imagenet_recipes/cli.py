"""The command line of the engine's entry scripts: read it, start the loader workers' fork
server, and only then import torch, the entry's strategy and the engine, and train.

The order is the point. Importing torch and torchvision takes seconds, and the `pytorch`
backend's DataLoader workers start from a fork server that imports the same modules once for all
of them (`data.loader_server` says why they start that way). Started here, the server imports
them on another core while this process imports its own copy; started when the loaders are
built, the first batch waits for it (2.5 s on a 2-core VM). So this module imports nothing
heavier than the config: no torch.
"""
from __future__ import annotations

import importlib
from typing import Optional

from .config import TrainConfig, exit_on_usage_error, parse_args
from .data.loader_server import start_loader_server
from .errors import UsageError
from .registry import ENTRIES


def main(entry: str, description: str = "", argv: Optional[list] = None,
         config_cls: type = TrainConfig, strategy: Optional[str] = None) -> None:
    """An entry script's whole body: `entry` names it in the registry (registry.py), which
    holds its strategy and its defaults. Something built on an entry (an experiment) passes its
    own subclasses: `config_cls` of TrainConfig, and `strategy` ("module:Class", imported only
    once the loader server has started) of the entry's strategy."""
    try:
        cfg = parse_args(argv, description, ENTRIES[entry].defaults, config_cls=config_cls,
                         entry=entry)
    except UsageError as err:
        exit_on_usage_error(err)
    start_loader_server(cfg)
    from . import engine, strategies  # torch, from here on
    if strategy is None:
        strategy_cls = strategies.strategy_class(ENTRIES[entry].strategy)
    else:
        module, name = strategy.split(":")
        strategy_cls = getattr(importlib.import_module(module), name)
    engine.run(strategy_cls, entry, cfg)
