"""tests/step_hold.py's hold for runs a test does not start itself (a tool or a GPU-tier check
starts them with plain `python SCRIPT` or torchrun): with STEP_HOLD_AFTER=N and STEP_HOLD_DIR=DIR
(step_hold.plant_env), each training process stops after its Nth step, writes DIR/held-rank<RANK>
and waits until DIR/release exists (or it is killed).

    PYTHONPATH=tests/plants/step_hold STEP_HOLD_AFTER=6 STEP_HOLD_DIR=/tmp/hold \
        python -m imagenet_recipes.bench.gpu.processes ...

Python imports this file at start-up (`sitecustomize`) from PYTHONPATH, in every process that
gets the variables; it touches nothing until imagenet_recipes.config is imported, and then only
adds a step hook, which only a training process calls.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _install() -> None:
    # loaded from its file: the clone's folders stay off sys.path (tests/test_layout.py)
    spec = importlib.util.spec_from_file_location("step_hold", TESTS / "step_hold.py")
    step_hold = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_hold)
    step_hold.install()


class _HoldAfterImport(importlib.abc.MetaPathFinder):
    """Finds imagenet_recipes.config where Python would, and adds the hold once it has loaded."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "imagenet_recipes.config":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def load_held(module):
            load(module)
            _install()

        spec.loader.exec_module = load_held
        return spec


if os.environ.get("STEP_HOLD_AFTER") and os.environ.get("STEP_HOLD_DIR"):
    sys.meta_path.insert(0, _HoldAfterImport())
