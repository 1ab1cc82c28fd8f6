"""Runs an entry script that stops after a chosen training step until the test lets it go on,
so a test signals or kills a run at the step it names, however fast or loaded the CPU:

    STEP_HOLD_AFTER=N STEP_HOLD_DIR=DIR python tests/step_hold.py SCRIPT ARGS...  (or torchrun)

After its Nth training step (counted in this process, from its start), each process writes
DIR/held-rank<RANK> and waits until DIR/release exists; a process that finds DIR/release
already there does not stop (a torchrun restart, a resumed run). The hold is one more of the
run's step hooks (TrainConfig.step_hooks), called after the step's compute and before its print
interval closes, so a stop signal that arrives while held is seen at step N itself (with -p 1).
SCRIPT may be another such wrapper (tests/sample_trace.py).

Imported, the module gives the tests' side of it: hold_env, wait_for, held, release.
"""
from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
# A run whose test is gone (killed, failed before releasing it) does not wait forever.
ORPHAN_TIMEOUT_S = 600


def hold_env(after: int, hold_dir: Path) -> dict:
    """The environment that holds a run started through this script after step `after`."""
    hold_dir.mkdir(parents=True, exist_ok=True)
    return {"STEP_HOLD_AFTER": str(after), "STEP_HOLD_DIR": str(hold_dir)}


def wait_for(condition: Callable[[], bool], what: str, proc=None, timeout: float = 300.0,
             output: Callable[[], str] = lambda: "") -> None:
    """Poll `condition` until it holds; fail (with `output()`) after `timeout` s or when `proc`
    (a Popen) has exited meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}:\n"
                                 f"{output()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s:\n{output()[-3000:]}")
        time.sleep(0.05)


def held(hold_dir: Path, ranks: int = 1) -> Callable[[], bool]:
    """Whether ranks 0 .. ranks-1 all wait at the hold."""
    return lambda: all((hold_dir / f"held-rank{r}").is_file() for r in range(ranks))


def release(hold_dir: Path) -> None:
    (hold_dir / "release").touch()


def _hold_after(step: int, hold_dir: Path) -> Callable[[int, float], None]:
    count = 0
    rank = os.environ.get("RANK", "0")

    def hold(epoch: int, seconds: float) -> None:
        nonlocal count
        count += 1
        released = hold_dir / "release"
        if count != step or released.exists():
            return
        (hold_dir / f"held-rank{rank}").touch()
        deadline = time.monotonic() + ORPHAN_TIMEOUT_S
        while not released.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"step_hold: rank {rank} not released after "
                                 f"{ORPHAN_TIMEOUT_S} s")
            time.sleep(0.02)
    return hold


def _main() -> None:
    from imagenet_recipes.config import TrainConfig

    hold = _hold_after(int(os.environ["STEP_HOLD_AFTER"]), Path(os.environ["STEP_HOLD_DIR"]))
    product_hooks = TrainConfig.step_hooks

    def step_hooks(self, rank: int, ranks: int, what: str = "processes") -> tuple:
        return (*product_hooks(self, rank, ranks, what), hold)

    TrainConfig.step_hooks = step_hooks
    script = sys.argv[1]
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _main()
