"""What every strategy over a torch.distributed process group shares (DDP, FSDP): who each
process is, the group's start-up (a rendezvous private to each torchrun restart, a peer watch),
the collectives, the explanation of a peer's failure, and the teardown."""
from __future__ import annotations

import datetime
import gc
import os
import socket
import sys
from typing import Any, List, NoReturn, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ..peers import PeerWatch, end_process_now
from ..options.strategy import StrategyOptions
from ..precision import Precision
from ..syncbn import check_plain_batchnorm, convert_to_cross_rank_bn
from .base import Strategy


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


# What gloo and NCCL errors say when the other end of a collective is gone or silent.
_PEER_FAILURE_SIGNS = ("connection reset by peer", "connection closed by peer", "broken pipe",
                       "timed out", "timeout", "nccl communicator was aborted")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store_for_this_attempt(rank: int, world_size: int,
                            timeout: datetime.timedelta) -> dist.Store:
    """The env:// rendezvous store, with keys private to this torchrun restart attempt.

    After `torchrun --max-restarts` restarts a group, the new workers share the agent's store
    with the dead ones, whose connection addresses are still in it: a new rank that reads them
    before its peers overwrite them connects to a dead port and fails (seen with torch 2.15 and
    gloo, about one restart in three). A prefix per attempt keeps the rounds apart."""
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"recipe_attempt_{attempt}", store)


class ProcessGroupStrategy(Strategy):
    """One process per device in a torch.distributed group (gloo on CPUs, NCCL on GPUs). A
    subclass wraps the model (`_wrap_and_share`) and says how gradients are reduced."""

    def __init__(self, precision: Optional[Precision] = None, *, sync_bn: bool = False,
                 seed: int = 0, dist_timeout: float = 600.0, share_gpus: bool = False,
                 **common):
        super().__init__(precision, **common)
        self.sync_bn, self.seed, self.timeout = sync_bn, seed, dist_timeout
        self.share_gpus = share_gpus
        self.wrapper: Optional[nn.Module] = None  # what holds the group besides torch itself

    @classmethod
    def arguments(cls, options: StrategyOptions) -> dict:
        shared = options.distribution
        return {**super().arguments(options), "sync_bn": shared.sync_bn, "seed": options.seed,
                "dist_timeout": shared.dist_timeout}

    def setup_environment(self) -> torch.device:
        # torchrun (or srun + env) tells each process who it is.
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if "RANK" not in os.environ:
            # Started with plain `python`: run as a world of one so the script still works.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        device = super().setup_environment()
        # NCCL moves CUDA tensors GPU-to-GPU; gloo is the CPU backend, and takes CUDA
        # tensors too where NCCL cannot (two ranks on one GPU).
        self.backend = "nccl" if device.type == "cuda" and not self.share_gpus else "gloo"
        timeout = datetime.timedelta(seconds=self.timeout)
        dist.init_process_group(
            backend=self.backend, rank=self.rank, world_size=self.world_size, timeout=timeout,
            store=_store_for_this_attempt(self.rank, self.world_size, timeout),
            device_id=device if self.backend == "nccl" else None)
        # A peer that dies is noticed within seconds even where NCCL would wait for its
        # watchdog (recipe/peers.py).
        self._peer_watch = PeerWatch.from_environment(self.rank, self.world_size)
        if self._peer_watch:
            self._peer_watch.start()
        return device

    def sync_bn_layer(self) -> Optional[str]:
        """With --sync-bn, BatchNorm statistics over the global batch instead of each rank's
        slice: torch's SyncBatchNorm where it runs (NCCL, one rank per GPU), CrossRankBatchNorm
        over gloo (CPUs, and ranks sharing a GPU, where SyncBatchNorm cannot run)."""
        if not self.sync_bn:
            return None
        return "SyncBatchNorm" if self.backend == "nccl" else "CrossRankBatchNorm"

    def _convert_module(self, model: nn.Module) -> nn.Module:
        layer = self.sync_bn_layer()
        if layer:
            check_plain_batchnorm(model)
        if layer == "SyncBatchNorm":
            return nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if layer == "CrossRankBatchNorm":
            return convert_to_cross_rank_bn(model)
        return model

    def share_buffers(self, module: nn.Module) -> None:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj: Any) -> List[Any]:
        out: List[Optional[Any]] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        dist.barrier()

    def describe(self) -> dict:
        return {**super().describe(), "backend": self.backend, "sync_bn": self.sync_bn_layer()}

    def explain_failure(self, err: BaseException) -> Optional[str]:
        text = str(err).strip()
        if not (isinstance(err, dist.DistError) or (
                isinstance(err, RuntimeError)
                and any(sign in text.lower() for sign in _PEER_FAILURE_SIGNS))):
            return None
        first_line = text.splitlines()[0] if text else type(err).__name__
        return (f"rank {self.rank} of {self.world_size}: communication with the other ranks "
                f"failed ({first_line}). Another process died, hung or never started; a silent "
                f"peer is waited for at most --dist-timeout {self.timeout:g} s. The first error "
                "in the other ranks' output is the cause. Continue with --resume auto "
                "(torchrun --max-restarts=K does that automatically).")

    def teardown(self) -> None:
        # A wrapper (DDP's reducer, FSDP's state) holds the process group too, and
        # destroy_process_group only drops torch.distributed's own references. A group still
        # alive when the interpreter exits is destroyed during its shutdown, where gloo aborts
        # the process now and then ("terminate called without an active exception"). So:
        # wrapper first, then group. (The trainer has dropped its reference before this; under
        # FSDP the bare module is the wrapper.)
        self.wrapper = self.model = self.module = None
        gc.collect()
        if getattr(self, "_peer_watch", None):
            self._peer_watch.finish()
        if dist.is_initialized():
            dist.destroy_process_group()

    def abandon(self) -> None:
        if getattr(self, "_peer_watch", None):
            self._peer_watch.stop()

    def end_failed_process(self, code: int) -> NoReturn:
        if not dist.is_initialized():
            sys.exit(code)
        # The group cannot be left (a peer is gone) and the peer watch may be inside a store
        # call. Python's shutdown would destroy the one and end the other in the middle of C++
        # code, and either aborts the process now and then ("terminate called without an
        # active exception", exit -6 instead of 1). Nothing is left to clean up: the logs are
        # closed and the loader workers stopped.
        end_process_now(code)
