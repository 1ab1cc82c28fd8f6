"""The option sections (imagenet_recipes/options/): each field in one section, each bound
declared there refused, the config frozen, each backend's own section named by its registry
entry and shown under it in -h."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import imagenet_recipes
from imagenet_recipes.config import TrainConfig, build_parser, parse_args
from imagenet_recipes.errors import UsageError
from imagenet_recipes.options import BACKEND_SECTIONS, SECTIONS, DataOptions, GpuDecodeOptions
from imagenet_recipes.options.fields import flag_of
from imagenet_recipes.registry import DATA_BACKENDS


def test_every_option_is_declared_in_exactly_one_section():
    owners = {}
    for section in SECTIONS:
        for f in dataclasses.fields(section):
            owners.setdefault(f.name, []).append(section.__name__)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}
    assert sorted(owners) == sorted(f.name for f in dataclasses.fields(TrainConfig))


def _outside(bound):
    """A value just outside a bound (below its low end, else above its high end)."""
    if bound.low is not None:
        return bound.low if bound.low_open else bound.low - 1
    return bound.high if bound.high_open else bound.high + 1


BOUNDED = [(section, f) for section in SECTIONS for f in dataclasses.fields(section)
           if f.metadata.get("bound") is not None]


def test_the_sections_declare_the_bounds_that_validate_used_to_list():
    assert len(BOUNDED) >= 30, [f.name for _, f in BOUNDED]


def _selecting(section) -> list:
    """Arguments that select the backend whose own section this is (else the synthetic one)."""
    for name, backend in DATA_BACKENDS.items():
        if backend.options and BACKEND_SECTIONS[backend.options] is section:
            return ["--data-backend", name, "data"]
    return ["--dummy"]


@pytest.mark.parametrize("section, f", BOUNDED, ids=[f.name for _, f in BOUNDED])
def test_a_value_outside_a_declared_bound_is_refused_naming_its_flag(section, f):
    bad = _outside(f.metadata["bound"])
    argv = [*_selecting(section), flag_of(f), str(int(bad) if isinstance(f.default, int) else bad)]
    with pytest.raises(UsageError, match=f"^{flag_of(f)} "):
        parse_args(argv)
    edge = f.metadata["bound"].low if f.metadata["bound"].low is not None else None
    if edge is not None and not f.metadata["bound"].low_open:
        parse_args([*_selecting(section), flag_of(f), str(edge)])  # the closed end is accepted


def test_a_sections_own_rules_are_checked():
    with pytest.raises(UsageError, match="PowerSGD needs"):
        parse_args(["--dummy", "--ddp-comm-hook", "powersgd", "--powersgd-start-step", "1"])
    with pytest.raises(UsageError, match="the dataset path is missing"):
        parse_args([])
    with pytest.raises(UsageError, match="--progressive-resize"):
        parse_args(["--dummy", "--progressive-resize", "160", "128", "0", "2"])


def test_a_config_is_not_written_after_parsing():
    cfg = parse_args(["--dummy"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 8


def test_a_part_reads_its_section_of_the_config():
    cfg = parse_args(["--data-backend", "gpu", "--gpu-decoder", "nvimgcodec", "data"])
    assert GpuDecodeOptions.of(cfg) == GpuDecodeOptions(gpu_decoder="nvimgcodec",
                                                        gpu_hw_decoder_load=0.65)
    data = DataOptions.of(cfg)
    assert data.backend == "gpu" and data.data == "data"
    assert not isinstance(data, TrainConfig)


def test_each_backend_section_is_named_by_a_backend_and_shown_under_it():
    named = {backend.options for backend in DATA_BACKENDS.values()} - {""}
    assert named == set(BACKEND_SECTIONS)
    text = build_parser(entry="nd").format_help()
    for name, backend in DATA_BACKENDS.items():
        if backend.options:
            group = text[text.index(f"--data-backend {name} options:"):]
            group = group[:group.index("\n\n")]
            for f in dataclasses.fields(BACKEND_SECTIONS[backend.options]):
                assert flag_of(f) in group, (name, f.name)


@pytest.mark.parametrize("argv, message", [
    (["--gpu-decoder", "nvimgcodec", "data"],
     "--gpu-decoder is an option of --data-backend gpu, not of --data-backend pytorch"),
    (["--data-backend", "dali-cpu", "--dali-hw-decoder-load", "0.9", "data"],
     "--dali-hw-decoder-load is an option of --data-backend dali-gpu, not of --data-backend "
     "dali-cpu"),
    (["--data-backend", "gpu", "--synthetic-val-size", "8", "data"],
     "--synthetic-val-size is an option of --data-backend synthetic, not of --data-backend gpu"),
    (["--dummy", "--gpu-hw-decoder-load", "0.5"],
     "--gpu-hw-decoder-load is an option of --data-backend gpu, not of --data-backend synthetic"),
])
def test_an_option_of_a_backend_that_is_not_selected_is_refused(argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_args(argv)


def test_a_backends_own_options_are_accepted_with_it_and_a_presets_are_defaults():
    assert parse_args(["--data-backend", "gpu", "--gpu-decoder", "nvimgcodec",
                       "data"]).gpu_decoder == "nvimgcodec"
    assert parse_args(["--dummy", "--synthetic-val-size", "8"]).synthetic_val_size == 8
    assert parse_args(["--data-backend", "dali-gpu", "--dali-hw-decoder-load", "0.9",
                       "data"]).dali_hw_decoder_load == 0.9
    # a script's (or a preset's) default of another backend's option is no refusal
    assert parse_args(["data"], defaults={"gpu_decoder": "nvimgcodec"}).data_backend == "pytorch"


# --- who holds the whole config ---------------------------------------------------------------
# The composers build the parts from the whole config (config and ps.config define the two whole
# configs, the engine's and the parameter server's); every other product module takes its
# section, a bundle of sections (ps/options.py's ServerOptions, ...) or plain values.
COMPOSERS = {"config", "ps.config", "cli", "engine", "lifecycle", "ps.main"}
WHOLE = {"TrainConfig", "PSConfig"}


def _takes_the_whole_config(tree: ast.Module) -> bool:
    """A module imports the config module's TrainConfig, or has a function with a parameter
    named cfg/config that no section annotates."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("config") \
                and {a.name for a in node.names} & WHOLE:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                annotation = ast.unparse(arg.annotation) if arg.annotation else ""
                if annotation in WHOLE or (arg.arg in ("cfg", "config")
                                           and not annotation.endswith("Options")):
                    return True
    return False


def test_only_the_composers_take_the_whole_config():
    package = Path(imagenet_recipes.__file__).parent
    holders = set()
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        if module.split(".")[0] in ("bench", "experiments", "options"):
            continue  # the tools and experiments compose runs of their own
        if _takes_the_whole_config(ast.parse(path.read_text())):
            holders.add(module)
    assert holders - COMPOSERS == set()
    planted = ast.parse("def build(cfg, n): pass\n")
    assert _takes_the_whole_config(planted)
    assert not _takes_the_whole_config(ast.parse("def build(cfg: AugmentOptions): pass\n"))


# --- what users typed before the options moved into sections --------------------------------------
# tests/options_838b197.json: every option that each entry script's -h showed at 838b197 (before
# the sections), as (its config field, its default), and the keys of config.json then.
BEFORE_SECTIONS = Path(__file__).parent / "options_838b197.json"


def _shown_options(entry: str) -> dict:
    """-> {flag: [config field, default]} of every option the entry's -h shows."""
    import argparse

    from imagenet_recipes.ps.config import PSConfig
    from imagenet_recipes.registry import ENTRIES

    parser = build_parser("", ENTRIES[entry].defaults,
                          config_cls=PSConfig if entry == "ps" else TrainConfig, entry=entry)
    shown = {}
    for action in parser._actions:
        if action.help != argparse.SUPPRESS:
            default = action.default
            if not isinstance(default, (int, float, str, bool, type(None))):
                default = repr(default)
            shown.update({flag: [action.dest, default] for flag in action.option_strings})
    return shown


@pytest.mark.parametrize("entry", ["nd", "dp", "ddp", "ddp_apex", "fsdp", "hvd", "ps"])
def test_every_option_an_entry_showed_before_the_sections_means_the_same(entry):
    """Each flag of the entry's -h at 838b197 is still shown, sets the same config field and
    has the same default (the entry's own where it has one); new flags may join."""
    import json

    before = json.loads(BEFORE_SECTIONS.read_text())["entries"][entry]
    now = _shown_options(entry)
    assert {flag: now.get(flag) for flag in before} == before


def test_config_json_keeps_its_keys():
    import json

    before = json.loads(BEFORE_SECTIONS.read_text())["config_keys"]
    assert sorted(TrainConfig().to_dict()) == before
