"""The house rules of the code base, checked: the registry matches the entry scripts, the engine
package has no import cycle, and nothing outside entry scripts and tests edits sys.path."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO, TRAIN
from recipe.config import build_parser
from recipe.registry import DATA_BACKENDS, ENTRIES, OPT_LEVELS


def test_registry_lists_every_entry_script_under_its_own_name():
    assert sorted(Path(e.script).name for e in ENTRIES.values()) == sorted(
        p.name for p in TRAIN.glob("*.py"))
    for entry in ENTRIES.values():
        text = (REPO / entry.script).read_text()
        assert entry.name == "ps" or f'entry="{entry.name}"' in text, entry.script


def test_the_cli_offers_what_the_registry_lists():
    parser = build_parser("", None)
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert choices["data_backend"] == tuple(DATA_BACKENDS)
    assert choices["opt_level"] == OPT_LEVELS


def test_every_strategy_specific_option_names_real_entry_scripts():
    import dataclasses

    from recipe.ps.config import PSConfig

    for f in dataclasses.fields(PSConfig):
        assert set(f.metadata["only"] or ()) <= set(ENTRIES), f.name


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TRAIN).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set:
    """recipe modules `path` imports, anywhere in it (lazy imports in functions count too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            # `from . import checkpoint` imports a module; `from .data import Shard` a name
            found |= {f"{target}.{a.name}" for a in node.names} | {target}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("recipe"):
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_engine_package_has_no_import_cycle():
    modules = {_module_name(p): p for p in (TRAIN / "recipe").rglob("*.py")}
    graph = {m: sorted((_imports(p, m) & modules.keys()) - {m}) for m, p in modules.items()}

    def cycle_from(start, path, seen):
        for nxt in graph[path[-1]]:
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


def test_only_entry_scripts_and_tests_edit_sys_path():
    edits = [str(p.relative_to(REPO)) for p in REPO.rglob("*.py")
             if ".git" not in p.parts and p.parent not in (TRAIN, REPO / "tests")
             and re.search(r"sys\.path\.(insert|append)", p.read_text())]
    assert edits == []
