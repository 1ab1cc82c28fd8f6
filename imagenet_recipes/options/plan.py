"""What a run's plan (run_plan.py) is made from, as one bundle: the batch, optimizer, model,
precision and augmentation sections, and the preset the run started from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .augment import AugmentOptions
from .model import ModelOptions
from .optimization import BatchOptions, OptimizerOptions
from .precision import PrecisionOptions
from .run import RunOptions


@dataclass(frozen=True)
class PlanOptions:
    batch: BatchOptions          # -b, --grad-accum, --global-batch
    optimizer: OptimizerOptions  # --lr and its scaling rule
    model: ModelOptions          # --channels-last
    precision: PrecisionOptions  # what the memory layout suits (--opt-level, --float64)
    augment: AugmentOptions      # the largest train crop (the layout on a CPU)
    preset: Optional[str]        # --config: the preset whose published batch the plan may take

    @classmethod
    def of(cls, values: Any) -> "PlanOptions":
        """The bundle of a run's config (or of anything with the same fields)."""
        return cls(BatchOptions.of(values), OptimizerOptions.of(values), ModelOptions.of(values),
                   PrecisionOptions.of(values), AugmentOptions.of(values),
                   RunOptions.of(values).config)
