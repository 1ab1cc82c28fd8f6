"""The one list of what the project offers: entry scripts (strategies), opt levels, data backends.

The CLI's choices, the sweep, the plots and the RESULTS tables all read these tables instead of
keeping lists of their own, so adding a strategy or a data backend is one line here plus its
module. Plain data only (no torch import), so the tools can read it cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Tuple


@dataclass(frozen=True)
class Entry:
    """One entry script: which strategy it runs and how users launch it."""
    name: str                  # the `entry` field of every log record, e.g. "ddp_apex"
    script: str                # path from the repository root
    strategy: str              # "module:Class" in recipe.strategies ("" for the parameter server)
    label: str                 # how plots and tables name it
    launcher: str              # "python" | "torchrun" | "horovodrun"
    distributed: bool          # one process per device (scales with the process count)
    defaults: Dict[str, object] = field(default_factory=dict)  # config defaults it changes


ENTRIES: Dict[str, Entry] = {e.name: e for e in (
    Entry("nd", "train/nd.py", "base:Strategy", "nd", "python", distributed=False),
    Entry("dp", "train/dp.py", "dp:DataParallelStrategy", "DataParallel", "python",
          distributed=False),
    Entry("ddp", "train/ddp.py", "ddp:DDPStrategy", "DDP", "torchrun", distributed=True),
    Entry("ddp_apex", "train/ddp_apex.py", "ddp:DDPStrategy", "DDP (apex)", "torchrun",
          distributed=True, defaults={"opt_level": "O1"}),
    Entry("hvd", "train/hvd.py", "horovod:HorovodStrategy", "Horovod", "horovodrun",
          distributed=True),
    Entry("ps", "train/ps.py", "", "PS", "torchrun", distributed=True),  # parameter server
)}

# apex's opt levels, implemented on native torch.amp (precision.py says what each one does).
OPT_LEVELS: Tuple[str, ...] = ("O0", "O1", "O2", "O3")

# --data-backend choices -> the module of recipe.data that builds their loaders.
DATA_BACKENDS: Dict[str, str] = {
    "pytorch": "recipe.data.pytorch",
    "synthetic": "recipe.data.synthetic",
    "dali-cpu": "recipe.data.dali",
    "dali-gpu": "recipe.data.dali",
}
