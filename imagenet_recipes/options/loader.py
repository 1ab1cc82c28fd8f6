"""What a data backend reads of a run's options, as one bundle: the data and augmentation
sections, the selected backend's own section, and the two run settings a loader follows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..registry import DATA_BACKENDS
from .augment import AugmentOptions
from .data import BACKEND_SECTIONS, DataOptions
from .fields import Section
from .run import RunOptions


@dataclass(frozen=True)
class LoaderOptions:
    data: DataOptions
    augment: AugmentOptions
    # The selected backend's own section (the one its registry entry names), None where it has
    # none: a backend reads no other backend's options.
    own: Optional[Section]
    seed: int             # --seed: the sampling order and every augmentation draw
    steps_per_epoch: int  # --steps-per-epoch: a loader that sizes its own passes (DALI) stops there

    @classmethod
    def of(cls, values: Any) -> "LoaderOptions":
        """The bundle of a run's config (or of anything with the same fields)."""
        data = DataOptions.of(values)
        key = DATA_BACKENDS[data.backend].options
        run = RunOptions.of(values)
        return cls(data, AugmentOptions.of(values),
                   BACKEND_SECTIONS[key].of(values) if key else None,
                   run.seed, run.steps_per_epoch)

    @property
    def backend(self) -> str:
        """The --data-backend the run uses (--dummy: synthetic)."""
        return self.data.backend
