"""DistributedDataParallel: one process per device (`train/ddp.py`, `train/ddp_apex.py`)."""
from __future__ import annotations

import datetime
import gc
import os
import socket
from typing import Any, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ..comm_hooks import LossScaledPowerSGD, powersgd_hook
from ..config import TrainConfig
from ..peers import PeerWatch
from ..precision import Precision
from ..syncbn import convert_to_cross_rank_bn
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


class DDPStrategy(Strategy):
    """One process per device; gradients all-reduced in buckets, overlapped with backward."""

    name = "ddp"

    def __init__(self, precision: Optional[Precision] = None, *, sync_bn: bool = False,
                 comm_hook: str = "none", powersgd_rank: int = 1, powersgd_start_step: int = 10,
                 seed: int = 0, dist_timeout: float = 600.0, share_gpus: bool = False,
                 **common):
        super().__init__(precision, **common)
        self.sync_bn, self.comm_hook, self.share_gpus = sync_bn, comm_hook, share_gpus
        self.powersgd_rank, self.powersgd_start_step = powersgd_rank, powersgd_start_step
        self.seed, self.timeout = seed, dist_timeout
        self.powersgd: Optional[LossScaledPowerSGD] = None  # --ddp-comm-hook powersgd's state

    @classmethod
    def options_from(cls, cfg: TrainConfig) -> dict:
        return dict(super().options_from(cfg), sync_bn=cfg.sync_bn, comm_hook=cfg.ddp_comm_hook,
                    share_gpus=cfg.share_gpus,
                    powersgd_rank=cfg.powersgd_rank,
                    powersgd_start_step=cfg.powersgd_start_step,
                    seed=cfg.seed, dist_timeout=cfg.dist_timeout)

    def setup_environment(self) -> torch.device:
        # DDP: torchrun (or srun + env) tells each process who it is.
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if "RANK" not in os.environ:
            # Started with plain `python`: run as a world of one so the script still works.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        device = super().setup_environment()
        # DDP: NCCL moves CUDA tensors GPU-to-GPU; gloo is the CPU backend, and takes CUDA
        # tensors too where NCCL cannot (two ranks on one GPU).
        self.backend = "nccl" if device.type == "cuda" and not self.share_gpus else "gloo"
        timeout = datetime.timedelta(seconds=self.timeout)
        dist.init_process_group(
            backend=self.backend, rank=self.rank, world_size=self.world_size, timeout=timeout,
            store=_store_for_this_attempt(self.rank, self.world_size, timeout),
            device_id=device if self.backend == "nccl" else None)
        # DDP: a peer that dies is noticed within seconds even where NCCL would wait for its
        # watchdog (recipe/peers.py).
        self._peer_watch = PeerWatch.from_environment(self.rank, self.world_size)
        if self._peer_watch:
            self._peer_watch.start()
        return device

    def _convert_module(self, model: nn.Module) -> nn.Module:
        if self.sync_bn:
            # DDP: BatchNorm statistics over the global batch instead of each rank's slice.
            # torch's SyncBatchNorm needs NCCL; CrossRankBatchNorm does the same over gloo.
            if self.backend == "nccl":
                return nn.SyncBatchNorm.convert_sync_batchnorm(model)
            return convert_to_cross_rank_bn(model)
        return model

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        # DDP: broadcasts rank 0's parameters and buffers at construction, then all-reduces
        # gradient buckets during backward.
        ids = [self.device.index] if self.device.type == "cuda" else None
        one_bucket = self.comm_hook == "powersgd" and self.backend == "gloo"
        # DDP: PowerSGD chains a second all-reduce onto each bucket's first one, in a callback.
        # gloo completes buckets in any order, so ranks would issue those second all-reduces in
        # different orders and mismatch (pytorch#58467): on gloo PowerSGD gets one bucket per
        # dtype (O2 has two: half weights, fp32 norm layers), and the hook finishes each
        # bucket before DDP hands it the next (LossScaledPowerSGD's `synchronous`).
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=1e5 if one_bucket else None)
        self._register_comm_hook(ddp)
        self._ddp = ddp
        return ddp

    def _register_comm_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """DDP: replace the plain bucket all-reduce by one of PyTorch's built-in hooks."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.comm_hook == "fp16":
            # Half the bytes on the wire; the averaged bucket is cast back to the grad dtype.
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif self.comm_hook == "powersgd":
            # Rank-r factors instead of full gradient matrices; the compression error is fed
            # back into the next step. Its error-feedback state is not checkpointed: after a
            # resume it starts again from zero (one step of slightly different compression).
            # The hook sees loss-scaled gradients: the wrapper keeps PowerSGD's memories in
            # the current scale's units and free of an overflow's inf/NaN (comm_hooks.py).
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.powersgd_start_step, random_seed=self.seed)
            self.powersgd = LossScaledPowerSGD(state, self.precision.loss_scale,
                                               synchronous=self.backend == "gloo")
            ddp.register_comm_hook(self.powersgd, powersgd_hook)

    def eval_model(self) -> nn.Module:
        # DDP: validate with the plain module (the wrapper would broadcast in every forward, and
        # shards differ in length), but first give every rank rank 0's buffers: each rank has
        # updated its BatchNorm running stats with its own batches since the last broadcast,
        # and the checkpoint holds rank 0's, so that is the model validation must score.
        self.share_buffers(self.module)
        return self.precision.wrap(self.module)

    def share_buffers(self, module: nn.Module) -> None:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)

    def _no_sync(self):
        # DDP: skip the gradient all-reduce on accumulation micro-steps.
        return self._ddp.no_sync()

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
        return {**super().describe(), "backend": self.backend, "comm_hook": self.comm_hook}

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
        # DDP's reducer holds the process group too, and destroy_process_group only drops
        # torch.distributed's own references. A group still alive when the interpreter exits
        # is destroyed during its shutdown, where gloo aborts the process now and then
        # ("terminate called without an active exception"). So: wrapper first, then group.
        # (The trainer has dropped its reference to the wrapper before calling this.)
        self._ddp = self.model = None
        gc.collect()
        if getattr(self, "_peer_watch", None):
            self._peer_watch.finish()
        if dist.is_initialized():
            dist.destroy_process_group()
