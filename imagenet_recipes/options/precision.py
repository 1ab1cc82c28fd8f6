"""The precision options: apex-style opt levels on native torch.amp."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import UsageError
from ..registry import ENGINE_LOOP, OPT_LEVELS
from .fields import OPTIMIZATION, POSITIVE, PRECISION, Section, opt


@dataclass(frozen=True)
class PrecisionOptions(Section):
    """The opt level, the half type, loss scaling, and the gradient clipping that needs the
    unscaled gradients."""
    opt_level: str = field(default="O0", metadata=opt(
        PRECISION, "--opt-level",
        help="apex-style mixed precision level on native torch.amp: O0 fp32, O1 autocast + "
             "dynamic loss scaling, O2 half model with fp32 master weights and fp32 "
             "BatchNorm, O3 pure half", choices=OPT_LEVELS, evaluation=True))
    amp_dtype: str = field(default="auto", metadata=opt(
        PRECISION, "--amp-dtype", help="half type of O1-O3 (auto: float16 on GPU, bfloat16 on CPU)",
        choices=("auto", "float16", "bfloat16"), evaluation=True))
    loss_scale: Optional[str] = field(default=None, metadata=opt(
        PRECISION, "--loss-scale",
        help="'dynamic' or a fixed number (apex's loss_scale). Default: the level's own, "
             "dynamic for O1/O2 with float16, none otherwise; refused with bfloat16, which "
             "needs none"))
    float64: bool = field(default=False, metadata=opt(
        PRECISION, "--float64", help="run O0 in float64 (model, inputs, loss): slow, for "
                                     "checking that strategies compute exactly the same thing",
        evaluation=True))
    clip_grad_norm: Optional[float] = field(default=None, metadata=opt(
        OPTIMIZATION, "--clip-grad-norm", help="clip the global gradient norm to this "
        "(measured on the reduced, unscaled gradients)", needs=ENGINE_LOOP, bound=POSITIVE,
        elsewhere="the parameter server does not clip"))

    @classmethod
    def rules(cls, values) -> None:
        if values.loss_scale not in (None, "dynamic"):
            try:
                if float(values.loss_scale) <= 0:
                    raise ValueError
            except ValueError:
                raise UsageError(f"--loss-scale must be 'dynamic' or a positive number, "
                                 f"got {values.loss_scale!r}") from None
