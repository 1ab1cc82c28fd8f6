"""Runs an entry script that stops after a chosen training step until the test lets it go on,
so a test signals or kills a run at the step it names, however fast or loaded the CPU:

    STEP_HOLD_AFTER=N STEP_HOLD_DIR=DIR python tests/step_hold.py SCRIPT ARGS...  (or torchrun)

After its Nth training step (counted in this process, from its start), each process writes
DIR/held-rank<RANK> and waits until DIR/release exists; a process that finds DIR/release
already there does not stop (a torchrun restart, a resumed run). The hold is one more of the
run's step hooks (TrainConfig.step_hooks), called after the step's compute and before its print
interval closes, so a stop signal that arrives while held is seen at step N itself (with -p 1).
SCRIPT may be another such wrapper (tests/sample_trace.py).

Where the test does not start the entry script itself (a tool starts it: bench.gpu.processes, a
GPU-tier check), plant_env adds the plant tests/plants/step_hold to PYTHONPATH: every process of
the run that imports imagenet_recipes.config then holds the same way, whatever started it.

Imported, the module gives the tests' side of it: hold_env, plant_env, wait_for, held, release.
"""
from __future__ import annotations

import os
import runpy
import signal
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


def plant_env(after: int, hold_dir: Path, stop_releases: bool = False) -> dict:
    """hold_env for runs that a tool starts with plain `python SCRIPT` or torchrun: the plant
    (tests/plants/step_hold/sitecustomize.py) installs the hold in each process that imports
    imagenet_recipes.config (only a training process calls it). stop_releases: a SIGTERM ends
    the hold too (_hold_after)."""
    path = [str(HERE / "plants" / "step_hold"), os.environ.get("PYTHONPATH", "")]
    return {**hold_env(after, hold_dir), "PYTHONPATH": os.pathsep.join(p for p in path if p),
            **({"STEP_HOLD_STOP_RELEASES": "1"} if stop_releases else {})}


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


def _hold_after(step: int, hold_dir: Path,
                stop_releases: bool = False) -> Callable[[int, float], None]:
    """stop_releases (STEP_HOLD_STOP_RELEASES=1): a SIGTERM also ends the hold, once the
    handler the run had for it has seen it (a tool that stops its run with SIGTERM, then
    SIGKILL after a grace, has it stop at once)."""
    count = 0

    def hold(epoch: int, seconds: float) -> None:
        nonlocal count
        count += 1
        released = hold_dir / "release"
        if count != step or released.exists():
            return
        # read here, not when installed: a run forked from a server that installed the hold
        # (tests/forked_ranks.py, with the plant on its PYTHONPATH) gets its RANK after that
        rank = os.environ.get("RANK", "0")
        stopped = []
        if stop_releases:
            previous = signal.getsignal(signal.SIGTERM)

            def on_stop(signum, frame):
                stopped.append(signum)
                if callable(previous):
                    previous(signum, frame)
                elif previous == signal.SIG_DFL:
                    raise SystemExit(128 + signum)

            signal.signal(signal.SIGTERM, on_stop)
        (hold_dir / f"held-rank{rank}").touch()
        deadline = time.monotonic() + ORPHAN_TIMEOUT_S
        try:
            while not released.exists() and not stopped:
                if time.monotonic() > deadline:
                    raise SystemExit(f"step_hold: rank {rank} not released after "
                                     f"{ORPHAN_TIMEOUT_S} s")
                time.sleep(0.02)
        finally:
            if stop_releases:
                signal.signal(signal.SIGTERM, previous)
    return hold


def install() -> None:
    """Add the hold (STEP_HOLD_AFTER, STEP_HOLD_DIR) to TrainConfig's step hooks; once."""
    from imagenet_recipes.config import TrainConfig

    product_hooks = TrainConfig.step_hooks
    if getattr(product_hooks, "step_hold", False):
        return
    hold = _hold_after(int(os.environ["STEP_HOLD_AFTER"]), Path(os.environ["STEP_HOLD_DIR"]),
                       os.environ.get("STEP_HOLD_STOP_RELEASES") == "1")

    def step_hooks(self, rank: int, ranks: int, what: str = "processes") -> tuple:
        return (*product_hooks(self, rank, ranks, what), hold)

    step_hooks.step_hold = True
    TrainConfig.step_hooks = step_hooks


def _main() -> None:
    install()
    script = sys.argv[1]
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _main()
