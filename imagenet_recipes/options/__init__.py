"""The options of a run, one frozen section per part, each beside the rules of its own fields.

config.TrainConfig is their union (every flag, one flat `to_dict()`); a part reads its section
(`DataOptions.of(cfg)`). A registry entry names the section that only it reads
(`DataBackend.options`): the parser refuses that section's options when the entry is not
selected, and `-h` shows them under the entry's name."""
from __future__ import annotations

import dataclasses

from ..registry import DATA_BACKENDS
from .augment import AugmentOptions
from .data import BACKEND_SECTIONS, DaliOptions, DataOptions, GpuDecodeOptions, SyntheticOptions
from .distribution import DdpOptions, DistributionOptions, HorovodOptions
from .fields import Bound, Section, opt
from .loader import LoaderOptions
from .plan import PlanOptions
from .strategy import StrategyOptions
from .model import ModelOptions
from .optimization import BatchOptions, EmaOptions, LossOptions, OptimizerOptions, ScheduleOptions
from .precision import PrecisionOptions
from .run import RunOptions

# The sections of every entry script, in the order -h lists their options within a group.
SECTIONS = (DataOptions, SyntheticOptions, GpuDecodeOptions, DaliOptions, AugmentOptions,
            ModelOptions, BatchOptions, OptimizerOptions, ScheduleOptions, LossOptions,
            EmaOptions, PrecisionOptions, DistributionOptions, DdpOptions, HorovodOptions,
            RunOptions)

def backend_section_title(key: str) -> str:
    """`--data-backend NAME`: the backends whose registry entries name the section `key` (its
    -h group, and what a refusal of its options names)."""
    names = [name for name, backend in DATA_BACKENDS.items() if backend.options == key]
    return f"--data-backend {' / '.join(names)}"


def backend_groups() -> dict:
    """The -h group of each backend section's fields."""
    return {f.name: backend_section_title(key) for key, section in BACKEND_SECTIONS.items()
            for f in dataclasses.fields(section)}


__all__ = ["SECTIONS", "BACKEND_SECTIONS", "Bound", "LoaderOptions", "PlanOptions", "Section",
           "StrategyOptions",
           "opt", *(
    s.__name__ for s in SECTIONS)]
