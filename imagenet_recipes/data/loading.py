"""What the backends built on torch's DataLoader (`pytorch`, `gpu`) share: the loader contract's
plumbing around their DataLoader, normalisation on the device, the guard their worker processes
run under, and how many workers a rank gets.

Both start their workers from the fork server of loader_server.py; the workers hand uint8 (or,
for `gpu`, the files' bytes) to the training process, which normalises on the device.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import threading
import time
from typing import Optional

import torch

from ..machine import cores_per_process
from .augment import IMAGENET_MEAN, IMAGENET_STD


class UInt8Normalizer:
    """uint8 NCHW batch -> normalised float32 on the device, in the requested memory format.

    Shared by every backend that hands over uint8 images, so they all meet the same contract
    (a float batch in 0..255, as the `gpu` backend's resize makes it, is normalised alike)."""

    def __init__(self, device: torch.device, channels_last: bool):
        shape = (1, 3, 1, 1)
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(shape) * 255
        self.inv_std = 1.0 / (torch.tensor(IMAGENET_STD, device=device).view(shape) * 255)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        # In place on the one float copy, made in the layout asked for whatever the batch's own
        # (the pytorch backend's training batches arrive channels-last): every new batch-sized
        # tensor is fresh memory that a CPU has to fault in (python -m
        # imagenet_recipes.bench.io, `pytorch backend` row).
        images = images.to(torch.float32, memory_format=self.memory_format, copy=True)
        return images.sub_(self.mean).mul_(self.inv_std)


class SampledLoader:
    """The loader contract (data/__init__.py) around a DataLoader and its ShardedSampler, but
    for `__iter__`, which each backend writes: what a batch becomes on the device."""

    def __init__(self, loader, sampler, device: torch.device, channels_last: bool):
        self.loader, self.sampler, self.device = loader, sampler, device
        self.normalize = UInt8Normalizer(device, channels_last)
        self.num_samples = len(sampler)  # this rank's share of the dataset
        self.skipped = 0  # unreadable files met in the current pass (this rank)
        self.workers = loader.num_workers

    def set_epoch(self, epoch: int, start_sample: int = 0) -> None:
        """Select the epoch; `start_sample`: global samples of it already trained on."""
        self.sampler.set_epoch(epoch, start_sample)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> None:
        """Nothing to save: each sample's augmentation (crop, flip, ...) is drawn from its own
        seed (SampleKey), so the sampler's position alone resumes it exactly."""
        return None

    def load_state_dict(self, state) -> None:
        pass

    def close(self) -> None:
        """Stop the persistent worker processes now rather than at interpreter exit."""
        shutdown_workers(self.loader)


def shutdown_workers(loader) -> None:
    """Stop a DataLoader's persistent worker processes now rather than at interpreter exit."""
    # DataLoader has no public close; its worker iterator shuts down cleanly on request.
    workers = getattr(loader, "_iterator", None)
    if workers is not None and hasattr(workers, "_shutdown_workers"):
        workers._shutdown_workers()
        loader._iterator = None


class WorkerGuard:
    """What DataLoader workers need to know of the trainer that owns them.

    Preemption: torchrun and SLURM deliver SIGTERM / SIGUSR1 to every process of the job, loader
    workers included; a worker killed by it makes the training process fail before it can write
    its preemption checkpoint. So workers ignore SIGUSR1, and ignore SIGTERM until the trainer
    starts exiting: multiprocessing stops daemonic workers at exit with SIGTERM, which must
    still work.

    A trainer that dies (SIGKILL, the OOM killer): started from the fork server, a worker's
    parent is that server, not the trainer, so DataLoader's own check (has my parent changed?)
    never fires, and the server lives as long as the workers do. Each worker therefore watches
    the trainer itself and ends within a second of it.
    """

    def __init__(self, context=None):
        self.trainer_pid = os.getpid()
        # shared memory, handed to each worker when it starts
        self.trainer_exiting = (context or multiprocessing).Value("b", 0, lock=False)
        # Registered after multiprocessing's own exit hook, so it runs before it.
        atexit.register(self._mark_exiting)

    def _mark_exiting(self) -> None:
        self.trainer_exiting.value = 1

    def worker_init(self, worker_id: int) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        threading.Thread(target=_exit_when_gone, args=(self.trainer_pid,), daemon=True,
                         name="trainer-watch").start()

    def _on_sigterm(self, signum, frame) -> None:
        if self.trainer_exiting.value:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


def _exit_when_gone(pid: int, interval: float = 1.0) -> None:
    while _running(pid):
        time.sleep(interval)
    os._exit(1)


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its own parent to collect it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as status:
            stat = status.read()
    except OSError:  # no procfs: a zombie counts as running
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def loader_workers(requested: int, local_world: int) -> int:
    """Loader processes per rank: -j as given, or where it is -1, default_workers'."""
    return requested if requested >= 0 else default_workers(local_world)


def default_workers(local_world: int, cores: Optional[int] = None) -> int:
    """Loader processes per rank: the rank's share of the cores (`cores`, else those this
    process may run on), one left for the rank itself. No fixed cap: JPEG decoding is what
    limits a GPU's rate (8 workers fed an H100 0.72x of what it trains, 15 about 0.95x)."""
    return max(1, cores_per_process(local_world, cores) - 1)
