"""What a distribution strategy reads of a run's options, as one bundle: the device and
process-group section, the precision section, --compile and --seed, and the sections that only
the selected strategy reads (DDP's communication hooks, Horovod's compression, an experiment's
own)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Type

from .distribution import DistributionOptions
from .fields import Section
from .model import ModelOptions
from .precision import PrecisionOptions
from .run import RunOptions


@dataclass(frozen=True)
class StrategyOptions:
    distribution: DistributionOptions
    precision: PrecisionOptions
    compile: bool  # --compile: the strategy compiles the model it wraps
    seed: int      # --seed: what each rank seeds before the model is built
    # The strategy's own sections, by class (a strategy reads no other strategy's options)
    own: Dict[Type[Section], Section] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Any, own: Iterable[Type[Section]] = ()) -> "StrategyOptions":
        """The bundle of a run's config (or of anything with the same fields), with the
        sections `own` (a strategy class's `sections()`)."""
        return cls(DistributionOptions.of(values), PrecisionOptions.of(values),
                   ModelOptions.of(values).compile, RunOptions.of(values).seed,
                   {section: section.of(values) for section in own})

    def section(self, kind: Type[Section]) -> Any:
        """The strategy's own section of that class (a KeyError names a section the strategy
        did not declare)."""
        return self.own[kind]
