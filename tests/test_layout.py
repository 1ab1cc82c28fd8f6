"""The house rules of the code base, checked: the registry matches the entry scripts, the package
has no import cycle and no import from a lower layer to a higher one (the engine never imports the
tools), and nothing edits sys.path: everything imports the installed package."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from conftest import REPO, TRAIN

import imagenet_recipes
from imagenet_recipes.config import build_parser
from imagenet_recipes.registry import (CAPABILITIES, DATA_BACKENDS, ENTRIES, OPT_LEVELS,
                                       STRATEGIES, engine_strategies)


def test_registry_lists_every_entry_script_under_its_own_name():
    assert sorted(Path(e.script).name for e in ENTRIES.values()) == sorted(
        p.name for p in TRAIN.glob("[!_]*.py"))  # _package.py: what they import first
    package = Path(imagenet_recipes.__file__).parent / "train"
    assert sorted(p.name for p in package.glob("[!_]*.py")) == sorted(
        p.name for p in TRAIN.glob("[!_]*.py"))
    for entry in ENTRIES.values():
        shim = (REPO / entry.script).read_text()  # the clone's script runs the package's module
        assert f'run_entry("{entry.name}")' in shim, entry.script
        module = (package / f"{entry.name}.py").read_text()
        assert f'run(entry="{entry.name}", description=__doc__' in module, entry.name
        main = STRATEGIES[entry.strategy].main  # the loop that runs it
        assert f"from {main} import main as run" in module, entry.name
        assert "strategy" not in module.split("def main")[1], entry.name


def test_every_entry_names_a_strategy_class_that_exists():
    from imagenet_recipes.strategies import Strategy, strategy_class

    for name, spec in STRATEGIES.items():
        # the engine's strategies have a class; one with a loop of its own (the parameter
        # server) has none, and its loop's main
        assert bool(spec.path) == (name in engine_strategies()), name
        if spec.path:
            assert issubclass(strategy_class(name), Strategy), name
        assert callable(importlib.import_module(spec.main).main), name
    assert {entry.strategy for entry in ENTRIES.values()} <= set(STRATEGIES)


def test_the_cli_offers_what_the_registry_lists():
    parser = build_parser("", None)
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert choices["data_backend"] == tuple(DATA_BACKENDS)
    assert choices["opt_level"] == OPT_LEVELS


def test_options_name_what_they_need_not_which_scripts_have_them():
    """A strategy-specific option names a capability some strategy provides; no list of
    script names decides which script has which option."""
    import dataclasses

    from imagenet_recipes import config
    from imagenet_recipes.ps.config import PSConfig

    provided = set().union(*(spec.provides for spec in STRATEGIES.values()))
    assert provided == CAPABILITIES
    for f in dataclasses.fields(PSConfig):
        assert f.metadata["needs"] in CAPABILITIES | {None}, f.name
    sources = [Path(config.__file__), *(Path(config.__file__).parent / "options").glob("*.py")]
    for path in sources:
        source = path.read_text()
        assert not [name for name in ENTRIES if re.search(rf'"{name}"', source)], path


def test_no_code_decides_by_an_entry_or_strategy_name():
    """The package asks the registry what an entry or a strategy does (a capability, its
    launcher, the BASELINE) instead of comparing its name with a literal: a new strategy is a
    registry line, not a hunt for `== "ddp"`. Kept: the sweep page's sentence about DDP's row."""
    names = set(ENTRIES) | set(STRATEGIES)
    kept = {("bench/results.py", "r['entry'] == 'ddp'")}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            parts = [node.left, *node.comparators]
            literals = [p for p in parts if isinstance(p, ast.Constant) and p.value in names]
            literals += [e for p in parts if isinstance(p, (ast.Tuple, ast.List, ast.Set))
                         for e in p.elts if isinstance(e, ast.Constant) and e.value in names]
            named = [ast.unparse(p) for p in parts if not isinstance(p, ast.Constant)]
            where = (path.relative_to(PACKAGE).as_posix(), ast.unparse(node))
            if literals and any("entry" in n or "strategy" in n for n in named) and \
                    where not in kept:
                found.append(f"{where[0]}:{node.lineno}: {where[1]}")
    assert found == []


def _another_value(field):
    """A value of the option `field` other than its default."""
    choices = field.metadata.get("argparse", {}).get("choices")
    if choices:
        return next(c for c in choices if c != field.default)
    return not field.default if isinstance(field.default, bool) else field.default + 2


def _strategies_and_what_they_read():
    """(strategy class, the config class, the fields it must read): each registered engine
    strategy with the options that need a capability it implements itself; the local SGD
    experiment's with its own section."""
    import dataclasses

    from imagenet_recipes import registry
    from imagenet_recipes.config import TrainConfig
    from imagenet_recipes.experiments.local_sgd.config import LocalSGDConfig
    from imagenet_recipes.experiments.local_sgd.options import LocalSGDOptions
    from imagenet_recipes.experiments.local_sgd.strategy import LocalSGDStrategy
    from imagenet_recipes.strategies import strategy_class

    owned = {registry.SYNC_BN, registry.SHARE_GPUS, registry.DDP_COMM_HOOKS,
             registry.HOROVOD_COMPRESSION, registry.COLLECTIVE_TIMEOUT}
    for name in engine_strategies():
        provides = owned & STRATEGIES[name].provides
        yield strategy_class(name), TrainConfig, {
            f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("needs") in provides}
    yield LocalSGDStrategy, LocalSGDConfig, {f.name for f in dataclasses.fields(LocalSGDOptions)}


def test_each_strategy_reads_the_options_its_capabilities_offer():
    """A strategy is built from its options bundle (StrategyOptions: the shared sections and
    its own); every option that needs a capability the strategy implements changes the
    arguments it gives its constructor, and its constructors accept each argument."""
    import dataclasses
    import inspect
    import types

    from imagenet_recipes.options import StrategyOptions

    checked = 0
    for cls, config, reads in _strategies_and_what_they_read():
        fields = {f.name: f for f in dataclasses.fields(config)}
        defaults = {name: getattr(config(), name) for name in fields}

        def arguments(**changed):
            values = types.SimpleNamespace(**{**defaults, **changed})
            return cls.arguments(StrategyOptions.of(values, cls.sections()))

        plain = arguments()
        accepted = {p for klass in cls.__mro__ if "__init__" in vars(klass)
                    for p in inspect.signature(klass.__init__).parameters}
        assert set(plain) <= accepted, (cls.__name__, set(plain) - accepted)
        for name in reads:
            assert arguments(**{name: _another_value(fields[name])}) != plain, (
                cls.__name__, name)
            checked += 1
    assert checked >= 10  # sync_bn x3, share_gpus, the hooks' 3, fp16_allreduce, local SGD's 4


PACKAGE = Path(imagenet_recipes.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The module a `from X import ...` reads, its leading dots resolved against `package`
    (the dotted folder of the importing file)."""
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _imports(path: Path, name: str) -> set:
    """The package's modules `path` imports, anywhere in it (lazy imports in functions count
    too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _from_module(node, package)
            if target.startswith("imagenet_recipes"):
                # `from . import checkpoint` imports a module; `from .data import Shard` a name
                found |= {target} | {f"{target}.{a.name}" for a in node.names}
    return found


def _strategy_modules() -> set:
    """The modules of the engine's strategies' classes."""
    return {f"imagenet_recipes.strategies.{STRATEGIES[name].path.split(':')[0]}"
            for name in engine_strategies()}


def _import_graph() -> dict:
    """The package's module -> the modules of it it imports, with the imports the registry makes
    by name (a data backend's module, an entry's strategy) as edges too."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: set(_imports(p, m) & modules.keys()) - {m} for m, p in modules.items()}
    graph["imagenet_recipes.data"] |= {b.path for b in DATA_BACKENDS.values()}
    graph["imagenet_recipes.cli"] |= _strategy_modules()
    return graph


def test_the_engine_package_has_no_import_cycle():
    graph = _import_graph()

    def cycle_from(start, path, seen):
        for nxt in sorted(graph[path[-1]]):
            if nxt == start:
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                found = cycle_from(start, path + [nxt], seen)
                if found:
                    return found
        return None

    cycles = [c for m in graph if (c := cycle_from(m, [m], set()))]
    assert not cycles, " -> ".join(cycles[0])


# The package's layers, lowest first: a module imports its own layer and those below, never one
# above (data never reaches for a strategy, a strategy never for the engine's loop, the engine
# never for a tool, the product and its tools never for an experiment, nothing but the lab for a
# study: ARCHITECTURE.md, "Product, tools, lab").
LAYERS = (
    ("foundations", ("imagenet_recipes", "nvjpeg_wheel", "errors", "registry", "machine",
                     "gpu_expected", "peer_flags",
                     "progress", "metrics", "compiled_graphs", "peers", "comm_hooks", "syncbn", "advice",
                     "ps.wire", "ps.state_service")),
    ("options", ("options", "presets")),
    ("config", ("config",)),
    ("parts", ("precision", "models", "optim", "schedule", "run_plan", "ema", "targets", "checkpoint",
               "runlog", "summary", "validation", "lifecycle", "data")),
    ("strategies", ("strategies",)),
    ("loops", ("engine", "ps")),
    ("command line", ("cli", "train")),
    ("tools", ("bench",)),
    ("experiments", ("experiments",)),
)


def _layer(module: str) -> int:
    name = module.removeprefix("imagenet_recipes.")
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS)
               for prefix in prefixes if name == prefix or name.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer of LAYERS"
    return max(matches)[1]


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
              for m, deps in sorted(_import_graph().items()) for d in sorted(deps)
              if _layer(d) > _layer(m)]
    assert upward == []


# --- the rooms -------------------------------------------------------------------------------
# Every Python file of the clone but the tests' is in one room, which its folder says (the most
# specific folder first); a room reaches (imports, or names by path or module in a string the
# code uses, such as a command it starts) only the rooms it may: ARCHITECTURE.md, "Rooms".
ROOMS = (("lab", "lab"), ("experiments", "imagenet_recipes/experiments"),
         ("tools", "imagenet_recipes/bench"), ("tools", "tools"),
         ("product", "imagenet_recipes"), ("product", "train"), ("product", "data"),
         ("product", "launch"))
MAY_REACH = {"product": {"product"}, "tools": {"product", "tools"},
             "experiments": {"product", "tools", "experiments"},
             "lab": {"product", "tools", "experiments", "lab"}}
NOT_A_ROOM = ("tests",)  # the tests may reach every room
# A folder or module of another room named in a string: lab/..., experiments/...,
# imagenet_recipes.experiments (or /experiments), imagenet_recipes.bench (or /bench).
_NAMED = re.compile(r"(?:^|(?<=[\s'\"=(]))(?P<folder>lab|experiments)(?=/|$)"
                    r"|imagenet_recipes[./](?P<package>experiments|bench)\b")
_LAB_NAMES = {"lab"} | {p.stem for p in (REPO / "lab").glob("*.py")}  # its scripts import each other


def room_of(path: str) -> str:
    """The room of a file (a path from the repository root), by its folder alone."""
    for room, folder in ROOMS:
        if path == folder or path.startswith(folder + "/"):
            return room
    return ""


def _room_of_module(name: str) -> str:
    if name == "imagenet_recipes" or name.startswith("imagenet_recipes."):
        return room_of(name.replace(".", "/"))
    return "lab" if name.split(".")[0] in _LAB_NAMES else ""


def rooms_reached(path: str, source: str) -> set:
    """(room, how) for each import of `source` (the file at `path`) and each folder or module
    of a room that one of its strings names (docstrings aside: they may point a reader
    anywhere)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    package = path.rsplit("/", 1)[0].replace("/", ".")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(_room_of_module(a.name), f"import {a.name}") for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            found |= {(_room_of_module(name), f"from {module} import {a.name}")
                      for a in node.names for name in (module, f"{module}.{a.name}")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docstrings:
            for m in _NAMED.finditer(node.value):
                room = {"bench": "tools"}.get(m["package"], m["folder"] or m["package"])
                found.add((room, f"the string {node.value!r}"))
    return {(room, how) for room, how in found if room}


def wrong_arrows(path: str, source: str) -> list:
    room = room_of(path)
    return [f"{path} ({room}) reaches {other}: {how}"
            for other, how in sorted(rooms_reached(path, source))
            if other not in MAY_REACH[room]]


def _python_files() -> list:
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*.py")
            if not {".git", "runs", "__pycache__"} & set(p.parts)
            and not str(p.relative_to(REPO)).startswith(NOT_A_ROOM)]


def test_every_module_is_in_one_room_by_its_folder():
    files = _python_files()
    assert len(files) > 100
    assert [path for path in files if not room_of(path)] == []


def test_no_room_reaches_a_room_it_may_not():
    assert [arrow for path in _python_files()
            for arrow in wrong_arrows(path, (REPO / path).read_text())] == []


def test_no_module_of_the_product_or_its_tools_is_over_600_lines():
    """A module long enough to need a map is split by job first (bench.gpu's groups)."""
    long = [(path, n) for path in _python_files()
            if room_of(path) in ("product", "tools")
            and (n := len((REPO / path).read_text().splitlines())) > 600]
    assert long == []


@pytest.mark.parametrize("path,planted", [
    # a tool starting an experiment's script or module
    ("imagenet_recipes/bench/hetero.py", 'SCRIPT = REPO / "experiments/local_sgd.py"'),
    ("imagenet_recipes/bench/jobs.py", 'CMD = ["-m", "imagenet_recipes.experiments.local_sgd"]'),
    ("imagenet_recipes/bench/ps.py", "from imagenet_recipes.experiments import local_sgd"),
    ("imagenet_recipes/bench/slow_workers/ddp.py", "from ...experiments.local_sgd import main"),
    # the product importing or reading the lab, or reaching for a tool
    ("imagenet_recipes/engine.py", "import layout"),
    ("imagenet_recipes/engine.py", "from lab import loop"),
    ("imagenet_recipes/config.py", 'RECORDS = REPO / "lab/records"'),
    ("imagenet_recipes/data/pytorch.py", "from ..bench.common import spread"),
    ("train/nd.py", 'subprocess.run([sys.executable, "-m", "imagenet_recipes.bench.gpu"])'),
    # an experiment reaching into the lab
    ("imagenet_recipes/experiments/local_sgd/strategy.py", "import hvd"),
])
def test_the_room_check_finds_a_planted_arrow(path, planted):
    """The check above would fail: the same function, on the file with one line planted."""
    source = (REPO / path).read_text() + "\n" + planted + "\n"
    assert wrong_arrows(path, source), planted


def shell_arrows(path: str, text: str) -> list:
    """The experiments and studies a shell script of launch/ or tools/ (or CI's) names outside
    its comments: it starts the product's jobs and the tools', never an experiment or a study."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [f"{path} names {m[0]!r}" for line in lines for m in _NAMED.finditer(line)
            if (m["folder"] or m["package"]) in ("lab", "experiments")]


def _shell_scripts() -> list:
    scripts = [p for folder in ("launch", "tools") for p in (REPO / folder).rglob("*")
               if p.suffix in (".sh", ".sbatch")]
    return [str(p.relative_to(REPO)) for p in scripts + [REPO / ".ci" / "run"]]


def test_no_launch_script_starts_an_experiment_or_a_study():
    scripts = _shell_scripts()
    assert len(scripts) > 10
    assert [arrow for path in scripts
            for arrow in shell_arrows(path, (REPO / path).read_text())] == []
    planted = "python -m imagenet_recipes.experiments.local_sgd\npython lab/hvd.py --steps 3\n"
    assert len(shell_arrows("tools/bench_cpu.sh", planted)) == 2
    assert shell_arrows("tools/bench_cpu.sh", "# see lab/README.md\n") == []


def _listed(readme: Path) -> set:
    """The files a folder's README lists in a table (rows that start with a `file.ext`)."""
    return set(re.findall(r"^\| `([^`]+\.[a-z]+)` \|", readme.read_text(), re.M))


def _files(folder: str) -> set:
    root = REPO / folder
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts}


def test_launch_holds_only_what_users_run_and_tools_what_the_project_runs():
    """launch/ is what users start: none of its scripts runs a tool (outside comments); the
    project's measuring scripts are in tools/. Each folder's README lists every file it holds."""
    tool = re.compile(r"imagenet_recipes[./]bench\b|(?:^|[\s\"'/])tools/")
    runs_a_tool = [f"launch/{name}" for name in sorted(_files("launch"))
                   if name.endswith((".sh", ".sbatch")) and any(
                       tool.search(line) for line in (REPO / "launch" / name).read_text()
                       .splitlines() if not line.lstrip().startswith("#"))]
    assert runs_a_tool == []
    assert _listed(REPO / "launch/README.md") == _files("launch")
    assert _listed(REPO / "tools/README.md") == _files("tools")
    assert tool.search("exec python -m imagenet_recipes.bench.gpu --group decode")
    assert tool.search('bash "$repo/tools/gpu_session.sh"')


def test_a_docstring_may_point_anywhere_and_the_lab_may_reach_everything():
    assert wrong_arrows("imagenet_recipes/engine.py",
                        '"""See lab/README.md and experiments/."""\n') == []
    assert wrong_arrows("lab/hetero.py", 'M = "imagenet_recipes.experiments.local_sgd"\n') == []


@pytest.mark.parametrize("room", ["lab", "imagenet_recipes/experiments",
                                  "imagenet_recipes/bench"])
def test_each_room_says_what_it_holds_who_may_import_it_and_what_its_tests_promise(room):
    readme = (REPO / room / "README.md").read_text()
    for part in ("What this folder holds.", "Who may import it.", "What its tests promise."):
        assert f"**{part}**" in readme, (room, part)


def test_each_experiment_has_its_page_and_its_command():
    """torchtitan's experiments/ contract: one tree, each experiment a folder with its README
    (what it is, its owner, its tests, when it joins the product or retires) and its command,
    `python -m imagenet_recipes.experiments.NAME`, run as an entry script is."""
    tree = PACKAGE / "experiments"
    experiments = sorted(p for p in tree.iterdir() if (p / "__init__.py").is_file())
    assert experiments and (tree / "README.md").is_file()
    for folder in experiments:
        readme = (folder / "README.md").read_text()
        assert "Owner" in readme and "tests/" in readme, folder
        command = (folder / "__main__.py").read_text()
        assert command.split('if __name__ == "__main__":')[1].strip() == \
            "main(description=__doc__)", folder


def test_data_backends_and_strategies_import_no_sibling():
    """A backend or a strategy reads on its own: what two share lives in a module they build on
    (data.sampling, data.augment, strategies.base, strategies.process_group), so a diff of two
    shows what one adds."""
    graph = _import_graph()
    backends = {b.path for b in DATA_BACKENDS.values()}
    strategies = _strategy_modules()
    strategies -= {"imagenet_recipes.strategies.base"}
    for group in (backends, strategies):
        for module in group:
            assert not graph[module] & (group - {module}), module


def test_nothing_puts_the_clone_on_the_path():
    """The package is installed (launch/env.sh, or pip install -e .): no script, test or tool
    edits sys.path or gives a process a PYTHONPATH with the clone's folders in it, and no
    shell script sets PYTHONPATH."""
    clone_on_pythonpath = r"PYTHONPATH[\"']?\s*[:=].{0,80}(TRAIN|TESTS|REPO|[\"']train[\"'])"
    edits = [str(p.relative_to(REPO)) for p in REPO.rglob("*.py")
             if ".git" not in p.parts and p != Path(__file__)
             and re.search(rf"sys\.path\.(insert|append)|{clone_on_pythonpath}", p.read_text())]
    edits += [str(p.relative_to(REPO)) for p in REPO.rglob("*.sh")
              if ".git" not in p.parts and re.search(r"export PYTHONPATH|PYTHONPATH=",
                                                      p.read_text())]
    assert edits == []


def test_the_tools_package_names_each_of_its_modules():
    """imagenet_recipes.bench's docstring is its table of contents: every module in it."""
    import ast
    import re

    bench = Path(imagenet_recipes.__file__).parent / "bench"
    listing = ast.get_docstring(ast.parse((bench / "__init__.py").read_text()))
    modules = sorted([p.stem for p in bench.glob("*.py") if not p.stem.startswith("_")]
                     + [p.parent.name for p in bench.glob("*/__init__.py")])
    assert [m for m in modules if not re.search(rf"\b{m}\b", listing)] == []


# The names a parsed config goes by in the product (cfg, self.cfg, config)
CONFIG_NAMES = ("cfg", "self.cfg", "config")


def config_writes(source: str) -> list:
    """The lines of `source` that write an attribute of a parsed config: an assignment (plain,
    augmented, annotated, or into a tuple) to cfg.X / self.cfg.X / config.X, or setattr on one."""
    writes = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "setattr" and node.args):
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        else:
            continue
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if (isinstance(element, ast.Attribute)
                        and ast.unparse(element.value) in CONFIG_NAMES):
                    writes.append(node.lineno)
    return sorted(set(writes))


def test_nothing_writes_a_config_after_parsing():
    """The run is planned once (run_plan.py): what -b, --grad-accum, --global-batch and
    --channels-last come to is the plan's, and no module writes the parsed config (a copy
    with the plan's values, lifecycle.planned_config, is what the records show)."""
    package = Path(imagenet_recipes.__file__).parent
    writes = {str(p.relative_to(package)): config_writes(p.read_text())
              for p in package.rglob("*.py")}
    assert {path: lines for path, lines in writes.items() if lines} == {}
    planted = ("cfg.batch_size, cfg.grad_accum = 1, 2\nself.cfg.lr *= 2\n"
               "setattr(cfg, 'seed', 1)\nconfig.arch: str = 'x'\nother.cfg = cfg\n")
    assert config_writes(planted) == [1, 2, 3, 4]
