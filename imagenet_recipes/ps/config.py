"""PSConfig: every engine flag, plus the parameter server's own (ParameterServerOptions)."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import TrainConfig
from ..errors import UsageError
from .options import ParameterServerOptions


# The engine's sections first, the parameter server's after them (a dataclass gathers its bases'
# fields last base first).
@dataclass(frozen=True)
class PSConfig(ParameterServerOptions, TrainConfig):
    def validate_extra(self) -> None:
        ParameterServerOptions.check(self)
        if self.evaluator:
            return
        if self.split == "by-class" and self.backend == "synthetic":
            raise UsageError("--split by-class needs a real dataset (the synthetic backend has "
                             "no classes to split)")
