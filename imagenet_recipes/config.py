"""One typed config for every entry script, and the argparse CLI generated from it.

The flags follow pytorch/examples/imagenet (`-a -b -j --lr --wd -p -e --resume ...`) because that
is what users already type; everything else is an addition, never a rename.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .errors import UsageError
from .options import BACKEND_SECTIONS, SECTIONS, backend_groups, backend_section_title
from .options.data import selected_backend
from .options.fields import DATA, HELP_GROUPS, PRESETS, flag_of
from .peer_flags import ALIASES, add_refused_flags, refuse_other_projects_flags
from .presets import checkpoint_settings, config_file_defaults, preset_listing
from .registry import DATA_BACKENDS, ENTRIES, entries_providing


# A dataclass gathers its bases' fields last base first: reversed, the sections keep their order.
@dataclass(frozen=True)
class TrainConfig(*reversed(SECTIONS)):
    """Every option of an engine script: the union of the parts' sections (options/), one flat
    record as the command line, the presets and config.json spell it."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def step_hooks(self, rank: int, ranks: int, what: str = "processes") -> tuple:
        """What runs after each training step of process `rank` of `ranks` (a parameter-server
        worker: its index among the workers), each hook called as hook(epoch, seconds the step
        took). The product has none; a config built on it adds its own (the benchmarks'
        bench.slow_workers: a sleep that emulates a slower device). Each process asks once
        before it trains, so a setting that does not fit the processes stops every one of them
        first (UsageError)."""
        return ()

    def validate_extra(self) -> None:
        """Checks of a subclass's own fields (the parameter server's, say)."""

    def save(self, path: Path, **extra: Any) -> None:
        path.write_text(json.dumps({**self.to_dict(), **extra}, indent=2, sort_keys=True))


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def build_parser(description: str = "", defaults: Optional[dict] = None,
                 config_cls: type = TrainConfig, entry: Optional[str] = None
                 ) -> argparse.ArgumentParser:
    """The CLI of one entry script: its options in help groups. Options of other entries are
    parsed (so that `parse_args` can say where they belong) but left out of -h."""
    parser = _Parser(description=description, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # a backend's own options under its name, after the data options
    in_backend_group = backend_groups()
    after_data = HELP_GROUPS.index(DATA) + 1
    names = (*HELP_GROUPS[:after_data], *dict.fromkeys(in_backend_group.values()),
             *HELP_GROUPS[after_data:])
    groups = {name: parser.add_argument_group(f"{name} options") for name in names}
    groups[PRESETS].description = preset_listing()
    defaults = defaults or {}
    for f in dataclasses.fields(config_cls):
        meta = f.metadata
        default = defaults.get(f.name, f.default)
        shown = meta["needs"] is None or entry is None or ENTRIES[entry].provides(meta["needs"])
        unset = default is None or default is False  # nothing worth printing
        help_text = meta["help"] if unset else f"{meta['help']} (default: {default})"
        kwargs = dict(meta["argparse"], help=help_text if shown else argparse.SUPPRESS)
        if f.type in ("bool", "Optional[bool]"):
            # --x / --no-x: a preset may switch on what the command line switches off again
            # (a flag that is itself a negation, --no-lr-scaling, stays a plain switch)
            negated = meta["flags"][-1].startswith("--no-")
            kwargs["action"] = "store_true" if negated else argparse.BooleanOptionalAction
        elif "type" not in kwargs and "choices" not in kwargs:
            kwargs["type"] = _scalar_type(f.type)
        if meta["flags"][0].startswith("-"):
            kwargs["dest"] = f.name
        group = in_backend_group.get(f.name, meta["group"])
        if group not in groups:  # a subclass's own group (the parameter server's)
            groups[group] = parser.add_argument_group(f"{group} options")
        # the other projects' spellings go before ours: messages name a field by its last flag
        flags = (*meta["flags"][:-1], *ALIASES.get(f.name, ()), meta["flags"][-1])
        groups[group].add_argument(*flags, default=default, **kwargs)
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK instead. Accept both.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None,
                        help=argparse.SUPPRESS)
    add_refused_flags(parser)
    return parser


class _Parser(argparse.ArgumentParser):
    """An error is one line naming the problem (the usage block only with -h)."""

    def error(self, message: str):
        unknown = [w for w in message.split() if w.startswith("--")]
        if message.startswith("unrecognized arguments") and unknown:
            known = [s for action in self._actions for s in action.option_strings
                     if action.help != argparse.SUPPRESS]
            close = difflib.get_close_matches(unknown[0].split("=")[0], known, n=1, cutoff=0.8)
            message = f"unknown option {unknown[0]}" + (f"; did you mean {close[0]}?"
                                                         if close else "")
        self.exit(2, f"{self.prog}: error: {message} (see -h)\n")


def refuse_other_entries_options(ns: dict, config_cls: type, entry: str) -> None:
    """UsageError for an option set on the command line that this entry script does not
    have, naming the scripts that do."""
    for f in dataclasses.fields(config_cls):
        needs = f.metadata["needs"]
        if needs is None or ENTRIES[entry].provides(needs) or ns[f.name] == f.default:
            continue
        scripts = ", ".join(ENTRIES[name].script for name in entries_providing(needs))
        hint = f"; {f.metadata['elsewhere']}" if f.metadata["elsewhere"] else ""
        raise UsageError(f"{f.metadata['flags'][-1]} is an option of {scripts}, not of "
                         f"{ENTRIES[entry].script}{hint}")


def refuse_other_backends_options(ns: dict, defaults: dict) -> None:
    """UsageError for an option of a data backend's own section set on the command line
    (a preset's value is a default, not refused) while another backend is selected."""
    backend = selected_backend(ns["dummy"], ns["data_backend"])
    for key, section in BACKEND_SECTIONS.items():
        if key == DATA_BACKENDS[backend].options:
            continue
        for f in dataclasses.fields(section):
            if ns[f.name] != defaults.get(f.name, f.default):
                raise UsageError(f"{flag_of(f)} is an option of {backend_section_title(key)}, not "
                                 f"of --data-backend {backend}: drop it, or select that backend")


def _early_options(argv: Optional[list]) -> argparse.Namespace:
    """--config, -e and --resume, read before the full parser is built: what they name
    gives the defaults."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--config")
    early.add_argument("--resume")
    early.add_argument("-e", "--evaluate", action="store_true")
    known, _ = early.parse_known_args(argv)
    return known


def _show_settings(settings: dict, cfg: "TrainConfig", defaults: dict) -> None:
    """Say which of the checkpoint's settings an evaluation took (once, on the main rank)."""
    taken = [_shown_option(k, v) for k, v in settings.items()
             if getattr(cfg, k) == v and v != defaults.get(k, _FIELDS[k].default)]
    if taken and os.environ.get("RANK", "0") == "0":
        print(f"=> -e: the checkpoint's run set {', '.join(taken)} (a flag on the command line "
              "overrides)", flush=True)


def _shown_option(name: str, value: Any) -> str:
    """An option as it is typed: `--arch resnet18`, `--model-ema`, `--no-channels-last`."""
    flag = _FIELDS[name].metadata["flags"][-1]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {' '.join(map(str, value)) if isinstance(value, tuple) else value}"


def _scalar_type(annotation: str):
    base = annotation.replace("Optional[", "").rstrip("]")
    return {"int": int, "float": float, "str": str}[base]


def parse_args(argv: Optional[list] = None, description: str = "",
               defaults: Optional[dict] = None, config_cls: type = TrainConfig,
               entry: Optional[str] = None) -> TrainConfig:
    """Parse and validate the command line of `entry` (a registry name; None: every option
    is accepted); raises UsageError on bad input. A subclass of TrainConfig adds its own
    fields (and checks, in its `validate_extra`)."""
    defaults = dict(defaults or {})
    script_defaults = dict(defaults)
    early, settings = _early_options(argv), {}
    if early.config:
        # the file's values sit between the script's defaults and the command line
        defaults.update(config_file_defaults(early.config, config_cls))
    elif early.evaluate and early.resume and early.resume != "auto":
        settings = checkpoint_settings(early.resume, [
            f.name for f in dataclasses.fields(config_cls) if f.metadata.get("evaluation")])
        defaults.update(settings)
    parser = build_parser(description, defaults, config_cls, entry)
    ns = vars(parser.parse_args(argv))
    ns.pop("local_rank")
    refuse_other_projects_flags(ns)
    if entry is not None:
        refuse_other_entries_options(ns, config_cls, entry)
    refuse_other_backends_options(ns, defaults)
    ns["lr_steps"] = tuple(ns["lr_steps"])
    if ns["progressive_resize"] is not None:
        ns["progressive_resize"] = tuple(ns["progressive_resize"])
    cfg = config_cls(**ns)
    validate(cfg)
    cfg.validate_extra()
    if settings:
        _show_settings(settings, cfg, script_defaults)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Checks that need no filesystem or device: each section's own (options/), then those
    between sections. The others live next to the code that uses them."""
    for section in SECTIONS:
        section.check(cfg)
    if cfg.start_epoch >= cfg.epochs and not cfg.evaluate:
        raise UsageError(f"--start-epoch {cfg.start_epoch} must be in [0, --epochs {cfg.epochs})")
    if cfg.evaluate and not (cfg.resume or cfg.pretrained):
        raise UsageError("-e/--evaluate needs weights to score: --resume CHECKPOINT (or a run "
                         "dir: its newest checkpoint; RUN_DIR/model_best.pth: its best), or "
                         "--pretrained FILE")
    if cfg.compile and cfg.sync_bn:
        raise UsageError("--compile with --sync-bn is refused: torch.compile fails on DDP with "
                         "SyncBatchNorm (pytorch#107372, open) and the cross-rank BatchNorm "
                         "that Horovod and gloo use is not tested compiled. Drop one of them")


def exit_on_usage_error(err: UsageError) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
