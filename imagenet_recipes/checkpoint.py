"""Checkpoints: atomic writes, weights_only loading, everything needed to continue exactly.

A checkpoint is a plain dict of tensors, numbers, strings and lists, so `torch.load(...,
weights_only=True)` reads it and a file that would need arbitrary unpickling is refused.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from .errors import UsageError

LATEST = "checkpoint.pth"
PREVIOUS = "checkpoint.prev.pth"  # the one before LATEST, kept in case LATEST is damaged
BEST = "model_best.pth"
BEST_EMA = "model_best_ema.pth"  # the --model-ema average's best, as the model of a checkpoint
DAMAGED = "checkpoint.damaged.pth"
REQUIRED_KEYS = ("model", "optimizer", "epoch", "arch")


def _atomic(path: Path, write) -> None:
    """Write via a temp file in the same folder, fsync, then rename over the target: a crash at
    any point leaves either the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        # make the rename itself durable (it is an entry of the directory)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


class CheckpointWriteError(Exception):
    """The new checkpoint could not be written (e.g. a full disk); the previous one is intact."""


def save(state: Dict[str, Any], run_dir: Path, is_best: bool, ema_is_best: bool = False,
         keep_as: Optional[str] = None) -> Path:
    """Write LATEST, keeping the previous LATEST as PREVIOUS. At every instant at least one
    complete checkpoint is on disk under one of the two names. `is_best`: also copy it to BEST;
    `ema_is_best`: write BEST_EMA, the same state with the moving average as its model (so
    `-e --resume` of it scores the average); `keep_as`: also keep it under that name (a hard
    link: no copy, and later saves leave it as it is)."""
    path = run_dir / LATEST
    try:
        if path.is_file():  # a hard link costs no space and is replaced atomically
            _atomic(run_dir / PREVIOUS, lambda tmp: os.link(path, tmp))
        _atomic(path, lambda tmp: torch.save(state, tmp))
        if is_best:
            _atomic(run_dir / BEST, lambda tmp: shutil.copyfile(path, tmp))
        if keep_as:
            _atomic(run_dir / keep_as, lambda tmp: os.link(path, tmp))
        if ema_is_best:
            average = {**state, "model": state["model_ema"]["model"], "model_ema": None}
            _atomic(run_dir / BEST_EMA, lambda tmp: torch.save(average, tmp))
    except (OSError, RuntimeError) as err:  # torch.save reports a full disk as RuntimeError
        raise CheckpointWriteError(f"could not write a checkpoint in {run_dir} ({err}); the "
                                   f"previous one, if any, is intact") from None
    return path


def export_weights(model_state: Dict[str, torch.Tensor], path: Path) -> None:
    """The model's weights alone, floating point ones as fp32, keyed as the bare torchvision
    model names them: `torchvision.models.get_model(arch).load_state_dict(torch.load(path))`."""
    weights = {k: v.float() if v.is_floating_point() else v for k, v in model_state.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic(path, lambda tmp: torch.save(weights, tmp))


def load(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"--resume {path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UsageError(f"--resume {path} is not a readable checkpoint "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    if not isinstance(state, dict) or not all(k in state for k in REQUIRED_KEYS):
        raise UsageError(f"--resume {path} is not a training checkpoint of this recipe "
                         f"(expected keys {REQUIRED_KEYS})")
    return state


def load_newest_valid(run_dir: Path) -> Optional[Dict[str, Any]]:
    """LATEST, or PREVIOUS if LATEST is missing or damaged (reported by path); None if neither."""
    for name in (LATEST, PREVIOUS):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            state = load(path)
        except UsageError as err:
            print(f"warning: {err}; trying the previous checkpoint", flush=True)
            continue
        state["path"] = path
        return state
    return None


def set_aside_damaged(run_dir: Path) -> None:
    """Rename a damaged LATEST out of the way, so the next save cannot link it over the good
    PREVIOUS. Called by the main rank only, after a fallback to PREVIOUS."""
    if (run_dir / LATEST).is_file():
        os.replace(run_dir / LATEST, run_dir / DAMAGED)


def find_latest_run(logdir: Path, run_name_prefix: str) -> Optional[Path]:
    """Run dir under `logdir` whose name starts with the prefix and whose checkpoint is newest."""
    candidates = [p for p in logdir.glob(run_name_prefix + "*")
                  if (p / LATEST).is_file() or (p / PREVIOUS).is_file()]

    def newest(run_dir: Path) -> float:
        return max(f.stat().st_mtime for f in (run_dir / LATEST, run_dir / PREVIOUS) if f.is_file())

    return max(candidates, key=newest, default=None)


# --- RNG state, as weights_only-loadable values --------------------------------------------------
def rng_state(cuda_devices: Sequence[torch.device] = ()) -> Dict[str, Any]:
    """This process's RNG states. `cuda_devices`: the GPUs this process drives (its own one;
    all of them for DataParallel), never every visible GPU: the job may resume with a
    different number of GPUs per node."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(d) for d in cuda_devices],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": random.getstate(),
    }


def set_rng_state(state: Dict[str, Any], cuda_devices: Sequence[torch.device] = ()) -> None:
    """Restore `rng_state`'s values; the saved CUDA states go to this process's GPUs in order
    (the stream belongs to the rank, whichever GPU index it has now)."""
    torch.set_rng_state(state["torch"])
    for device, cuda_state in zip(cuda_devices, state["cuda"]):
        torch.cuda.set_rng_state(cuda_state, device)
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
