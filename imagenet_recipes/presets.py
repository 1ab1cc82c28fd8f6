"""`--config FILE`: a preset (recipes/*.toml) or a run's saved config as the defaults of every
option, which the command line then overrides.

A file is TOML, YAML or JSON; a folder means the run directory's `config.json`, so
`--config runs/ddp-resnet50-...` repeats that run. Keys are option names, written like the flag
(`lr-schedule`, `wd`, `train-crop-size`) or like the config field (`lr_schedule`,
`weight_decay`). What belongs to one invocation (--resume, --run-name, --evaluate,
--start-epoch, --config) is never taken from a file.

A preset may carry a `[reference]` table: what the published run was (top-1, epochs, global
batch, GPUs, peak lr, source). `-b` is per process and `--lr` is per 256 images, scaled
linearly by the global batch (Goyal et al.'s rule), so a preset adapts to any process count by
itself; `scaling_note` says what changed against the published run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import UsageError
from .options import BatchOptions, OptimizerOptions

PER_INVOCATION = ("config", "resume", "run_name", "evaluate", "start_epoch")
# Package data: an installed wheel has them (`--config NAME` from any folder, any environment);
# the clone's top-level recipes/ is a link to this folder
PRESETS = Path(__file__).resolve().parent / "recipes"


def preset_names() -> List[str]:
    """The presets in recipes/, by the name `--config NAME` takes."""
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def preset_listing() -> str:
    """`-h`'s lines on the presets: each name with the published run it follows."""
    lines = []
    for name in preset_names():
        ref = read_mapping(PRESETS / f"{name}.toml").get("reference") or {}
        what = f"{ref['name']}: {ref['top1']} % top-1 in {ref['epochs']} epochs" \
            if {"name", "top1", "epochs"} <= set(ref) else ""
        lines.append(f"  {name:18s}{what}")
    return "\n".join(["--config NAME takes a preset of recipes/:", *lines])


def config_path(text: str) -> Path:
    """What `--config TEXT` names: a file or run directory, else a preset of recipes/ by name
    (`torchvision_v2` or `torchvision_v2.toml`), wherever the command runs from."""
    path = Path(text)
    if path.exists() or path.parent != Path("."):
        return path
    preset = PRESETS / (text if path.suffix == ".toml" else f"{text}.toml")
    return preset if preset.is_file() else path


def read_mapping(path: Path) -> Dict[str, Any]:
    """The top-level table of a TOML, YAML or JSON file (a run dir: its config.json), or of a
    preset named as `config_path` finds it."""
    path = config_path(str(path))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UsageError(f"--config {path}: no such file or preset (presets: "
                         f"{', '.join(preset_names())}; a run's config: RUN_DIR)")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise UsageError(f"--config {path}: unknown format {suffix!r}; use .toml, .yaml, "
                             ".yml or .json")
    except UsageError:
        raise
    except Exception as err:  # the parsers' own errors name the line
        raise UsageError(f"--config {path}: {err}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a table of options at the top level")
    return data


def _field_names(config_cls: type) -> Dict[str, dataclasses.Field]:
    """Every spelling of an option -> its field: the field name and each long flag."""
    names = {}
    for f in dataclasses.fields(config_cls):
        names[f.name] = f
        for flag in f.metadata["flags"]:
            if flag.startswith("--"):
                names[flag[2:].replace("-", "_")] = f
    return names


def _coerce(path: Path, key: str, f: dataclasses.Field, value: Any) -> Any:
    """The file's value as the field's type, or a UsageError naming the key."""
    kind = f.type.replace("Optional[", "").rstrip("]")
    nullable = f.type.startswith("Optional[")
    if value is None and nullable:
        return None
    ok = {"bool": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": lambda v: isinstance(v, str),
          "tuple": lambda v: isinstance(v, (list, tuple))}[kind](value)
    choices = f.metadata["argparse"].get("choices")
    if not ok or (choices and value not in choices):
        expected = f"one of {', '.join(choices)}" if choices else f"a {kind}"
        raise UsageError(f"--config {path}: {key} = {value!r}: expected {expected}")
    if kind == "float":
        return float(value)
    if kind == "tuple":
        return tuple(value)
    return value


def config_file_defaults(path_text: str, config_cls: type) -> Dict[str, Any]:
    """field name -> value of every option the file sets (per-invocation ones left out)."""
    path = Path(path_text)
    data = read_mapping(path)
    data.pop("reference", None)
    names = _field_names(config_cls)
    defaults = {}
    for key, value in data.items():
        f = names.get(key.replace("-", "_"))
        if f is None:
            raise UsageError(f"--config {path}: unknown option {key!r} (the keys are option "
                             "names, e.g. lr-schedule = \"cosine\"; see -h)")
        if f.name not in PER_INVOCATION:
            defaults[f.name] = _coerce(path, key, f, value)
    return defaults


def reference_of(path_text: Optional[str]) -> Optional[Dict[str, Any]]:
    """The preset's [reference] table, if it has one."""
    if not path_text:
        return None
    reference = read_mapping(Path(path_text)).get("reference")
    return reference if isinstance(reference, dict) else None


def scaling_note(preset: Optional[str], lr_per_256: float, plan) -> List[str]:
    """Lines telling how this run (its run_plan.RunPlan) differs from the `preset`'s (--config)
    published one in scale, and what the linear scaling rule made of --lr `lr_per_256`; []
    without a [reference] table."""
    ref = reference_of(preset)
    if not ref:
        return []
    world_size, global_batch, lr = plan.world_size, plan.global_batch, plan.lr
    lines = [f"recipe {ref.get('name', preset)}: published {ref['top1']} % top-1 in "
             f"{ref['epochs']} epochs on {ref['gpus']} GPUs, global batch "
             f"{ref['global_batch']}, peak lr {ref['lr']:g} ({ref.get('source', '')})"]
    if global_batch == ref["global_batch"]:
        lines.append(f"this run: {world_size} process(es) x -b {plan.batch_size} x --grad-accum "
                     f"{plan.grad_accum} = the published global batch; peak lr {lr:.4g}")
        return lines
    lines.append(f"this run: {world_size} process(es) x -b {plan.batch_size} x --grad-accum "
                 f"{plan.grad_accum} = global batch {global_batch}, so the peak lr is "
                 f"{lr:.4g} (--lr {lr_per_256:g} per 256 images, scaled linearly)")
    accumulate = ref["global_batch"] / (plan.batch_size * world_size)
    if accumulate > 1 and accumulate == math.floor(accumulate):
        lines.append(f"to train with the published global batch on {world_size} process(es), "
                     f"add --grad-accum {int(accumulate)}")
    return lines



# Beyond this multiple of a preset's published global batch, momentum SGD is outside what the
# recipe was validated at: the published large-batch recipes get there with their own warm-up
# and schedule (Goyal et al.'s 8k, the goyal_8k preset) or with LARS / LAMB
LARGE_BATCH_FACTOR = 4
LARGE_BATCH_OPTIMIZERS = ("lars", "lamb")


def global_batch_target(batch: BatchOptions, preset: Optional[str]) -> Optional[int]:
    """--global-batch as a number of images (published: the --config `preset`'s); None
    without it. (BatchOptions has refused any other value.)"""
    if batch.global_batch is None:
        return None
    if batch.global_batch != "published":
        return int(batch.global_batch)
    ref = reference_of(preset)
    if not ref:
        raise UsageError("--global-batch published needs a --config preset with a published "
                         "run ([reference] with global_batch); give a number instead")
    return int(ref["global_batch"])


def split_global_batch(target: int, world_size: int, most_per_process: int) -> Tuple[int, int]:
    """(-b, --grad-accum) that make `target` images per step on `world_size` processes with at
    most `most_per_process` images in one forward pass: the fewest micro-batches that fit."""
    if target % world_size:
        raise UsageError(f"--global-batch {target} does not divide among {world_size} processes: "
                         f"use a multiple of {world_size}")
    per_process = target // world_size
    accumulate = max(1, math.ceil(per_process / most_per_process))
    while per_process % accumulate:
        accumulate += 1
    return per_process // accumulate, accumulate


def large_batch_refusal(preset: Optional[str], batch: BatchOptions, optimizer: OptimizerOptions,
                        global_batch: int, lr: float) -> Optional[str]:
    """Why the --config `preset` is not trained at `global_batch` (more than LARGE_BATCH_FACTOR x
    its published one with an optimizer that was not made for it), or None."""
    ref = reference_of(preset)
    if (not ref or batch.allow_large_batch or optimizer.optimizer in LARGE_BATCH_OPTIMIZERS
            or global_batch <= LARGE_BATCH_FACTOR * ref["global_batch"]):
        return None
    return (f"global batch {global_batch} is {global_batch / ref['global_batch']:.2f}x the "
            f"published {ref['global_batch']} of {ref.get('name', preset)} (peak lr "
            f"{lr:.4g} by the linear rule): outside what the recipe was validated at, and "
            f"momentum SGD that far beyond it needs a recipe of its own (goyal_8k's warm-up, or "
            f"--opt lars / lamb). Keep the recipe on any number of processes with --global-batch "
            f"published; or --allow-large-batch to train at {global_batch} anyway")


def checkpoint_settings(resume: str, names: Sequence[str]) -> Dict[str, Any]:
    """The settings `names` (the config's evaluation fields: what decides a checkpoint's score)
    of the run that wrote `resume` (a checkpoint file or a run dir):
    from the run dir's config.json, else from the checkpoint's own copy of its config; {} when
    neither can be read (the checkpoint's loading then says what is wrong)."""
    path = Path(resume)
    config = (path if path.is_dir() else path.parent) / "config.json"
    try:
        saved = json.loads(config.read_text())
    except (OSError, ValueError):
        if not path.is_file():
            return {}
        import torch  # only for a checkpoint kept away from its run dir

        try:
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True
                               ).get("config") or {}
        except Exception:
            return {}
    settings = {k: saved[k] for k in names if k in saved}
    if settings.get("progressive_resize") is not None:
        settings["progressive_resize"] = tuple(settings["progressive_resize"])
    return settings
