"""Run one entry script exactly as `python train/X.py ARGS` runs it, then leave its peak CUDA
memory in a file: how bench.gpu measures the entry scripts' rows. Not a tool of its own.

    python -m imagenet_recipes.bench.gpu_entry train/nd.py ARGS
    python -m torch.distributed.run --nproc_per_node=1 -m imagenet_recipes.bench.gpu_entry train/ddp.py ARGS

The script runs as `__main__` from its own file (runpy), so what it does (the loader workers'
fork server preloading `__main__`, its strategy, its flags) is what a user's run does. With
BENCH_GPU_PEAK=PATH set, a run that finishes writes {"peak_bytes": ...} to PATH.<rank>:
torch.cuda.max_memory_allocated, which only the process itself can read; null on a CPU.

It also asks Linux to kill this process when its parent dies (PR_SET_PDEATHSIG): the benchmark
kills its children when it ends, but a parent killed with SIGKILL (a machine's time limit) cannot,
and torchrun starts its ranks in sessions of their own, where a kill of its group does not reach.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import sys


def die_with_parent() -> None:
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the benchmark's own clean-up must do
        return
    if os.getppid() == 1:  # the parent died before the request: nobody is left to report to
        os._exit(1)


def write_peak(path: str) -> None:
    import torch  # the script has imported it already

    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
    with open(f"{path}.{os.environ.get('RANK', '0')}", "w") as out:
        json.dump({"peak_bytes": peak}, out)


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m imagenet_recipes.bench.gpu_entry SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    die_with_parent()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]  # what the script sees when started as `python SCRIPT ARGS`
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # and its folder first, not ours
    runpy.run_path(script, run_name="__main__")
    if os.environ.get("BENCH_GPU_PEAK"):
        write_peak(os.environ["BENCH_GPU_PEAK"])


if __name__ == "__main__":
    main()
