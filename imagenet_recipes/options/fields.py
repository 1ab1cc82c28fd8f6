"""How an option is declared: its help group, flags and help (`opt`), and the range its value
must be in (`Bound`), checked where the field is declared. Torch-free, as every section is: the
parser and the tools read the options without starting torch."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UsageError

# Help groups, in the order `-h` shows them (presets first: --config and what it can name).
PRESETS = "presets"
DATA, AUGMENTATION, MODEL, OPTIMIZATION, REGULARIZATION, PRECISION, DISTRIBUTION = (
    "data", "augmentation", "model", "optimization", "regularization", "precision",
    "distribution")
CHECKPOINTING, LOGGING = "checkpointing", "logging"
HELP_GROUPS = (PRESETS, DATA, AUGMENTATION, MODEL, OPTIMIZATION, REGULARIZATION, PRECISION,
               DISTRIBUTION, CHECKPOINTING, LOGGING)


@dataclass(frozen=True)
class Bound:
    """The values a number option accepts: `low`/`high` (None: no limit), each end open or
    closed; `integer` says 'a positive integer' for the common case of counts. None as a value
    is always accepted (the option's 'unset')."""
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    says: str = ""  # how the message names the range, where the generic wording is unclear

    def refusal(self, flag: str, value: Any) -> Optional[str]:
        if value is None:
            return None
        below = self.low is not None and (value < self.low or self.low_open and value == self.low)
        above = self.high is not None and (value > self.high
                                           or self.high_open and value == self.high)
        if not (below or above):
            return None
        return f"{flag} {self.says or 'must be ' + self._range()}, got {value}"

    def _range(self) -> str:
        if self.integer and self.low == 1 and self.high is None:
            return "a positive integer"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'}")


POSITIVE_COUNT = Bound(low=1, integer=True)
POSITIVE = Bound(low=0, low_open=True)
NOT_NEGATIVE = Bound(low=0)
FRACTION = Bound(low=0, high=1)  # a probability or a share, both ends included


def opt(group: str, *flags: str, help: str, needs: Optional[str] = None,
        elsewhere: str = "", evaluation: bool = False, bound: Optional[Bound] = None,
        **argparse_kwargs: Any) -> dict:
    """Field metadata: the help group, CLI flags and help of one option. `needs`: the
    capability (registry.CAPABILITIES) a script's strategy must provide for the option to
    mean something (default: none, every script has it); the other scripts leave it out of
    -h and refuse it, adding `elsewhere` (where to look instead) to the message. `evaluation`:
    the field decides a checkpoint's score, so `-e --resume CHECKPOINT` takes it from the run
    that wrote the checkpoint (the command line still overrides). `bound`: the values it
    accepts, checked by its section."""
    return {"group": group, "flags": flags, "help": help, "needs": needs,
            "elsewhere": elsewhere, "evaluation": evaluation, "bound": bound,
            "argparse": argparse_kwargs}


def flag_of(f: dataclasses.Field) -> str:
    """The flag a message names a field by: its first long one (--wd, --grad-accum, --print-freq
    for -p), the spelling users type."""
    return next((flag for flag in f.metadata["flags"] if flag.startswith("--")),
                f.metadata["flags"][-1])


class Section:
    """One part's options, a frozen dataclass beside the code that owns them. A run's config is
    the union of the sections (config.TrainConfig); `Section.of(cfg)` is this part's view of
    it, and `check` refuses values out of the section's declared bounds and its own rules."""

    @classmethod
    def of(cls, cfg: Any):
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def check(cls, values: Any) -> None:
        """UsageError for a field of this section (read from `values`: the section or the whole
        config) outside its bound; a section adds its own rules in `rules`."""
        for f in dataclasses.fields(cls):
            bound = f.metadata.get("bound")
            if bound is not None:
                message = bound.refusal(flag_of(f), getattr(values, f.name))
                if message:
                    raise UsageError(message)
        cls.rules(values)

    @classmethod
    def rules(cls, values: Any) -> None:
        """Checks between this section's fields."""
