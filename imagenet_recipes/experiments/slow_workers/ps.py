"""The parameter server with slow workers: train/ps.py's options plus --worker-slowdown (one
factor per worker) and --slowdown-from-epoch, run as train/ps.py runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...ps.config import PSConfig
from .options import SlowWorkerOptions


@dataclass
class SlowPSConfig(SlowWorkerOptions, PSConfig):
    """train/ps.py's options, plus the slow workers' (one factor per worker)."""


def main(description: str = "", argv: Optional[list] = None) -> None:
    """experiments/slow_ps.py's whole body."""
    from ...ps.main import main as run

    run(argv, description, config_cls=SlowPSConfig)
