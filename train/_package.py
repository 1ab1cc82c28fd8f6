"""What the entry scripts import first: the installed imagenet_recipes package's entry
(imagenet_recipes.train.<entry>) to run, or, where the package is not installed in this
Python's environment, one line saying how to install it (exit status 2), not a traceback.

This file sits beside the scripts because Python puts a script's own folder first on sys.path:
it imports wherever the package does not.
"""
import importlib
import sys
from pathlib import Path


def run_entry(entry: str) -> None:
    """Run imagenet_recipes.train.<entry> as `python -m` would: its main(), on sys.argv."""
    try:
        module = importlib.import_module(f"imagenet_recipes.train.{entry}")
    except ModuleNotFoundError as error:
        if error.name != "imagenet_recipes":
            raise  # the package is there and something it needs is not: the traceback says what
        clone = Path(__file__).resolve().parents[1]
        print(f"{Path(sys.argv[0]).name}: the imagenet_recipes package is not installed for "
              f"{sys.executable}; install this clone into it with `{sys.executable} -m pip "
              f"install --no-deps -e {clone}`, or run the script through {clone}/launch/env.sh",
              file=sys.stderr)
        raise SystemExit(2)
    module.main()
