"""Distribution strategies: one small class each, behind one interface.

The engine only ever calls these methods, so reading two strategies side by side shows exactly
what each one changes. Strategy-specific lines are marked `# DDP: ...` / `# DataParallel: ...`,
the way Horovod's own examples mark theirs.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
from typing import Any, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import TrainConfig, UsageError
from .syncbn import convert_to_cross_rank_bn


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    """CUDA if present (or asked for), else CPU; a GPU request on a GPU-less host is an error."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was requested but no CUDA GPU is visible "
                         "(check CUDA_VISIBLE_DEVICES / the driver), or use --device cpu")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise UsageError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} "
                         "visible. Launch at most one process per GPU (--nproc_per_node).")
    return torch.device("cuda", local_rank)


class Strategy:
    """Single process, single device. The base class is also the 'no distribution' strategy."""

    name = "nd"
    rank, world_size, local_rank = 0, 1, 0

    def setup(self, cfg: TrainConfig) -> torch.device:
        self.device = pick_device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return self.device

    # --- model and optimizer ---------------------------------------------------------------------
    def convert_model(self, model: nn.Module, cfg: TrainConfig) -> nn.Module:
        """Changes made before precision casting and wrapping (e.g. SyncBatchNorm)."""
        if cfg.sync_bn:
            print(f"note: --sync-bn has no effect with the {self.name} strategy (one process)")
        return model

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap(self, model: nn.Module) -> nn.Module:
        model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
        return getattr(model, "module", model)

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The model to run validation with: it must not communicate, because validation
        shards differ in size and a collective in forward would wait forever."""
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, named_parameters: list,
                       cfg: TrainConfig) -> torch.optim.Optimizer:
        """The optimizer the engine steps (Horovod wraps it to all-reduce gradients)."""
        if cfg.fp16_allreduce:
            raise UsageError("--fp16-allreduce is Horovod's gradient compression (train/hvd.py); "
                             "DDP's counterpart is --ddp-comm-hook fp16")
        if cfg.ddp_comm_hook != "none" and not isinstance(self, DDPStrategy):
            raise UsageError(f"--ddp-comm-hook is a DDP option; the {self.name} strategy has no "
                             "DDP gradient all-reduce to hook")
        return optimizer

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def no_sync(self, model: nn.Module):
        """Context for micro-steps of gradient accumulation that must not communicate."""
        return contextlib.nullcontext()

    def synchronized_step(self, optimizer: torch.optim.Optimizer):
        """Context around the optimizer step, entered after the step's last backward: on entry
        every gradient is fully reduced (DDP reduces during backward, so nothing to do)."""
        return contextlib.nullcontext()

    # --- collectives -----------------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def gather_objects(self, obj: Any) -> List[Any]:
        """Every rank's `obj`, in rank order (all ranks receive the list)."""
        return [obj]

    def barrier(self) -> None:
        pass

    # --- bookkeeping -----------------------------------------------------------------------------
    def shard(self) -> tuple:
        """(rank, world size) that data sharding must use: always the GLOBAL rank."""
        return self.rank, self.world_size

    def train_subset(self, targets: List[int]) -> Optional[List[int]]:
        """Training-set indices this process may sample from before sharding (None: all).
        Only the parameter server's non-IID split restricts it."""
        return None

    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_devices(self) -> int:
        """Devices one process drives (DataParallel drives several)."""
        return 1

    def describe(self) -> dict:
        return {"strategy": self.name, "world_size": self.world_size,
                "devices_per_process": self.num_devices, "backend": None}

    def explain_failure(self, err: BaseException) -> Optional[str]:
        """A one-paragraph explanation if `err` means a peer process died or hung, else None."""
        return None

    def teardown(self) -> None:
        pass


class DataParallelStrategy(Strategy):
    """One process drives every visible GPU; the batch is split across them each step."""

    name = "dp"

    def setup(self, cfg: TrainConfig) -> torch.device:
        device = super().setup(cfg)
        if device.type == "cpu":
            print("note: DataParallel without GPUs runs the model on the CPU as a plain module")
        return device

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if self.device.type != "cuda":
            return model
        # DataParallel: replicate the module to all GPUs every step; gradients land on GPU 0.
        return nn.DataParallel(model)

    @property
    def num_devices(self) -> int:
        return torch.cuda.device_count() if self.device.type == "cuda" else 1


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

    def setup(self, cfg: TrainConfig) -> torch.device:
        # DDP: torchrun (or srun + env) tells each process who it is.
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        if "RANK" not in os.environ:
            # Started with plain `python`: run as a world of one so the script still works.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        self.device = pick_device(cfg.device, self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.timeout = cfg.dist_timeout
        self.cfg = cfg
        # DDP: NCCL moves CUDA tensors GPU-to-GPU; gloo is the CPU backend.
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=cfg.dist_timeout)
        dist.init_process_group(
            backend=self.backend, rank=self.rank, world_size=self.world_size, timeout=timeout,
            store=_store_for_this_attempt(self.rank, self.world_size, timeout),
            device_id=self.device if self.backend == "nccl" else None)
        return self.device

    def convert_model(self, model: nn.Module, cfg: TrainConfig) -> nn.Module:
        if cfg.sync_bn:
            # DDP: BatchNorm statistics over the global batch instead of each rank's slice.
            # torch's SyncBatchNorm is GPU-only; CrossRankBatchNorm does the same over gloo.
            if self.device.type == "cuda":
                return nn.SyncBatchNorm.convert_sync_batchnorm(model)
            return convert_to_cross_rank_bn(model)
        return model

    def wrap_model(self, model: nn.Module) -> nn.Module:
        # DDP: broadcasts rank 0's parameters and buffers at construction, then all-reduces
        # gradient buckets during backward.
        ids = [self.device.index] if self.device.type == "cuda" else None
        one_bucket = self.cfg.ddp_comm_hook == "powersgd" and self.backend == "gloo"
        # DDP: PowerSGD chains a second all-reduce onto each bucket's first one, in a callback.
        # gloo completes buckets in any order, so ranks would issue those second all-reduces in
        # different orders and mismatch (pytorch#58467): on gloo PowerSGD gets one bucket.
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=1e5 if one_bucket else None)
        self._register_comm_hook(ddp)
        return ddp

    def _register_comm_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """DDP: replace the plain bucket all-reduce by one of PyTorch's built-in hooks."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        cfg = self.cfg
        if cfg.ddp_comm_hook == "fp16":
            # Half the bytes on the wire; the averaged bucket is cast back to the grad dtype.
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif cfg.ddp_comm_hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif cfg.ddp_comm_hook == "powersgd":
            # Rank-r factors instead of full gradient matrices; the compression error is fed
            # back into the next step. Its error-feedback state is not checkpointed: after a
            # resume it starts again from zero (one step of slightly different compression).
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                start_powerSGD_iter=cfg.powersgd_start_step,
                random_seed=cfg.seed if cfg.seed is not None else 0)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # DDP: validate with the plain module (the wrapper would broadcast in every forward, and
        # shards differ in length), but first give every rank rank 0's buffers: each rank has
        # updated its BatchNorm running stats with its own batches since the last broadcast,
        # and the checkpoint holds rank 0's, so that is the model validation must score.
        module = self.unwrap(model)
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)
        return module

    def no_sync(self, model: nn.Module):
        # DDP: skip the gradient all-reduce on accumulation micro-steps.
        return model.no_sync()

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
        return {**super().describe(), "backend": self.backend,
                "comm_hook": self.cfg.ddp_comm_hook}

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
        if dist.is_initialized():
            dist.destroy_process_group()


class HorovodStrategy(Strategy):
    """One process per device, launched by horovodrun; gradients all-reduced by Horovod's
    DistributedOptimizer (gloo on CPU, NCCL on GPU), everything else through hvd collectives."""

    name = "hvd"

    def setup(self, cfg: TrainConfig) -> torch.device:
        try:
            import horovod.torch as hvd
        except ImportError as err:
            raise UsageError(f"train/hvd.py needs Horovod built with PyTorch support ({err}): "
                             "run `launch/env.sh bash launch/install_horovod.sh` (see README)")
        self.hvd = hvd
        hvd.init()  # Horovod: ranks, sizes and the controller come from horovodrun
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.device = pick_device(cfg.device, self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # Horovod: one GPU per process, by local rank
        if cfg.sync_bn:
            raise UsageError("--sync-bn is not supported with train/hvd.py; use train/ddp.py")
        return self.device

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, named_parameters: list,
                       cfg: TrainConfig) -> torch.optim.Optimizer:
        hvd = self.hvd
        if cfg.ddp_comm_hook != "none":
            raise UsageError("--ddp-comm-hook is DDP's; Horovod's gradient compression is "
                             "--fp16-allreduce")
        if any(p.dtype == torch.bfloat16 for _, p in named_parameters):
            raise UsageError("Horovod 0.28 cannot all-reduce bfloat16 gradients (O3 with "
                             "bfloat16): use --opt-level O1 or O2, or float16 on a GPU")
        # Horovod: all-reduce (average) each gradient as soon as backward produces it, after
        # every --batches-per-allreduce backward passes; fp16 compression halves the traffic.
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=named_parameters,
            compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
            backward_passes_per_step=cfg.grad_accum, op=hvd.Average)

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # Horovod: every rank starts from rank 0's weights and buffers, and after a resume from
        # its optimizer state (momentum buffers). A fresh optimizer has no state to send, and
        # hvd.broadcast_optimizer_state would first create some with one SGD step on zero
        # gradients, which weight decay turns into a real update: so only when there is state.
        self._broadcast_from_rank0(model.state_dict().items())
        if optimizer.state_dict()["state"]:
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # Horovod: like DDP, validate with rank 0's BatchNorm running statistics.
        self._broadcast_from_rank0(model.named_buffers())
        return model

    def _broadcast_from_rank0(self, named_tensors) -> None:
        """In place, like hvd.broadcast_parameters, but Horovod 0.28 has no bfloat16
        collectives: those tensors travel as float32 (exact: bf16 -> fp32 -> bf16)."""
        for name, tensor in named_tensors:
            wire = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
            self.hvd.broadcast_(wire, root_rank=0, name=f"recipe.broadcast.{name}")
            if wire is not tensor:
                tensor.copy_(wire)

    def synchronized_step(self, optimizer: torch.optim.Optimizer):
        # Horovod: wait for the gradient all-reduce here, so that unscaling, the overflow check
        # and the update see reduced gradients, then step without a second synchronize.
        optimizer.synchronize()
        return optimizer.skip_synchronize()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor.copy_(self.hvd.allreduce(tensor, op=self.hvd.Sum))
        return tensor

    # Horovod names a collective after the object's type by default; ranks passing objects of
    # different types (a path on one, None on another) would then wait for each other forever.
    def broadcast_object(self, obj: Any) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=0, name="recipe.broadcast_object")

    def gather_objects(self, obj: Any) -> List[Any]:
        return self.hvd.allgather_object(obj, name="recipe.gather_objects")

    def barrier(self) -> None:
        self.hvd.barrier()

    def describe(self) -> dict:
        backend = "nccl" if self.hvd.nccl_built() and self.device.type == "cuda" else "gloo"
        return {**super().describe(), "backend": backend}

    def explain_failure(self, err: BaseException) -> Optional[str]:
        if not hasattr(self, "hvd"):
            return None
        from horovod.common.exceptions import HorovodInternalError
        if not isinstance(err, HorovodInternalError):
            return None
        return (f"rank {self.rank} of {self.world_size}: a Horovod collective failed ({err}). "
                "Another process died or stopped responding; the first error in the other "
                "ranks' output is the cause. Continue with --resume auto.")

    def teardown(self) -> None:
        if hasattr(self, "hvd"):
            self.hvd.shutdown()
