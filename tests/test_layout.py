"""The house rules of the code base, checked: the registry matches the entry scripts, the package
has no import cycle and no import from a lower layer to a higher one (the engine never imports the
tools), and nothing edits sys.path: everything imports the installed package."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO, TRAIN

import imagenet_recipes
from imagenet_recipes.config import build_parser
from imagenet_recipes.registry import CAPABILITIES, DATA_BACKENDS, ENTRIES, OPT_LEVELS, STRATEGIES


def test_registry_lists_every_entry_script_under_its_own_name():
    assert sorted(Path(e.script).name for e in ENTRIES.values()) == sorted(
        p.name for p in TRAIN.glob("[!_]*.py"))  # _package.py: what they import first
    for entry in ENTRIES.values():
        text = (REPO / entry.script).read_text()
        assert entry.name == "ps" or f'main(entry="{entry.name}", description=__doc__)' in text
        assert "strategy" not in text.split('if __name__ == "__main__":')[1], entry.script


def test_every_entry_names_a_strategy_class_that_exists():
    from imagenet_recipes.strategies import Strategy, strategy_class

    for name, spec in STRATEGIES.items():
        if spec.path:  # "": the parameter server, which has a loop of its own (imagenet_recipes.ps)
            assert issubclass(strategy_class(name), Strategy), name
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
    source = Path(config.__file__).read_text()
    assert not [name for name in ENTRIES if re.search(rf'"{name}"', source)]


PACKAGE = Path(imagenet_recipes.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set:
    """The package's modules `path` imports, anywhere in it (lazy imports in functions count
    too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            # `from . import checkpoint` imports a module; `from .data import Shard` a name
            found |= {f"{target}.{a.name}" for a in node.names} | {target}
        elif isinstance(node, ast.ImportFrom) and \
                (node.module or "").startswith("imagenet_recipes"):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def _import_graph() -> dict:
    """The package's module -> the modules of it it imports, with the imports the registry makes
    by name (a data backend's module, an entry's strategy) as edges too."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: set(_imports(p, m) & modules.keys()) - {m} for m, p in modules.items()}
    graph["imagenet_recipes.data"] |= set(DATA_BACKENDS.values())
    graph["imagenet_recipes.cli"] |= {f"imagenet_recipes.strategies.{spec.path.split(':')[0]}"
                                      for spec in STRATEGIES.values() if spec.path}
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
    ("foundations", ("imagenet_recipes", "errors", "registry", "machine", "peer_flags", "presets",
                     "progress", "metrics", "peers", "comm_hooks", "syncbn", "advice",
                     "ps.wire", "ps.state_service")),
    ("config", ("config",)),
    ("parts", ("precision", "models", "optim", "schedule", "ema", "targets", "checkpoint",
               "runlog", "summary", "validation", "lifecycle", "data")),
    ("strategies", ("strategies",)),
    ("loops", ("engine", "ps")),
    ("command line", ("cli",)),
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


def test_an_experiment_script_runs_its_experiment_and_nothing_else():
    """experiments/NAME.py is to its experiment (imagenet_recipes.experiments.NAME, or a module
    of an experiment with several scripts) what train/X.py is to the registry's entry X: its
    documented command, and one call."""
    scripts = sorted((REPO / "experiments").glob("*.py"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        found = re.search(r"^from imagenet_recipes\.experiments\.([\w.]+) import main$", text,
                          re.MULTILINE)
        assert found, f"{script} imports no experiment's main"
        module = PACKAGE / "experiments" / found[1].replace(".", "/")
        assert module.is_dir() or module.with_suffix(".py").is_file(), script
        assert text.split('if __name__ == "__main__":')[1].strip() == \
            "main(description=__doc__)", script


def test_data_backends_and_strategies_import_no_sibling():
    """A backend or a strategy reads on its own: what two share lives in a module they build on
    (data.sampling, data.augment, strategies.base, strategies.process_group), so a diff of two
    shows what one adds."""
    graph = _import_graph()
    backends = set(DATA_BACKENDS.values())
    strategies = {f"imagenet_recipes.strategies.{spec.path.split(':')[0]}"
                  for spec in STRATEGIES.values() if spec.path}
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
    modules = sorted(p.stem for p in bench.glob("*.py") if not p.stem.startswith("_"))
    assert [m for m in modules if not re.search(rf"\b{m}\b", listing)] == []
