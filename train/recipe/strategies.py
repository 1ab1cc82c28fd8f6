"""Distribution strategies: one small class each, behind one interface.

The engine only ever calls these methods, so reading two strategies side by side shows exactly
what each one changes. Strategy-specific lines are marked `# DDP: ...` / `# DataParallel: ...`,
the way Horovod's own examples mark theirs.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .comm_hooks import LossScaledPowerSGD, powersgd_hook
from .config import TrainConfig, UsageError
from .data import Shard
from .peers import PeerWatch
from .precision import Precision
from .syncbn import convert_to_cross_rank_bn


def pick_device(requested: str, local_rank: int = 0, share_gpus: bool = False) -> torch.device:
    """CUDA if present (or asked for), else CPU; a GPU request on a GPU-less host is an error.
    `share_gpus`: local ranks beyond the GPU count wrap around onto the same GPUs."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was requested but no CUDA GPU is visible "
                         "(check CUDA_VISIBLE_DEVICES / the driver), or use --device cpu")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if share_gpus:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if local_rank >= torch.cuda.device_count():
        raise UsageError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} "
                         "visible. Launch at most one process per GPU (--nproc_per_node), "
                         "or add --share-gpus to try several processes on one GPU.")
    return torch.device("cuda", local_rank)


class Strategy:
    """Single process, single device. The base class is also the 'no distribution' strategy.

    The strategy owns the model and optimizer lifecycle, in this order: `setup_environment`
    (process group, device) -> `setup_module` (convert, place, cast, share rank 0's weights,
    make O2 masters, wrap) -> `setup_optimizer` -> per step `micro_step` / `backward` /
    `optimizer_step` -> `module_state_dict` / `load_module_state_dict` for checkpoints.
    Precision is a plugin it calls (`self.precision`); the plugin never calls back.
    """

    name = "nd"
    rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
    share_gpus = False  # several local ranks on one GPU (DDP's --share-gpus)

    def __init__(self, precision: Optional[Precision] = None, *, device: str = "auto",
                 channels_last: bool = False, compile: bool = False):
        self.precision = precision or Precision()
        self.device_request, self.channels_last, self.compile = device, channels_last, compile

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> "Strategy":
        """The strategy with the options of `cfg` it understands (config.parse_args has
        refused the options of other entry scripts)."""
        return cls(Precision.from_config(cfg), **cls.options_from(cfg))

    @classmethod
    def options_from(cls, cfg: TrainConfig) -> dict:
        return dict(device=cfg.device, channels_last=cfg.channels_last, compile=cfg.compile)

    # --- environment -----------------------------------------------------------------------------
    def setup_environment(self) -> torch.device:
        self.device = pick_device(self.device_request, self.local_rank, self.share_gpus)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.precision.bind(self.device, notice=print if self.is_main() else _silent)
        return self.device

    # --- model -----------------------------------------------------------------------------------
    def setup_module(self, model: nn.Module) -> nn.Module:
        """The model to train: converted, on its device, cast, identical on every rank and
        wrapped. `self.module` keeps the bare model (state dicts, validation)."""
        model = self._convert_module(model)
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        model = self.precision.convert_module(model.to(self.device, memory_format=memory_format))
        self.module = model
        wrapped = self._wrap_and_share(model)
        # After the broadcast, so that every rank's fp32 masters are rank 0's weights.
        self.precision.setup_masters(model)
        self.model = torch.compile(wrapped) if self.compile else wrapped
        return self.model

    def _convert_module(self, model: nn.Module) -> nn.Module:
        """Changes made before placing and casting (e.g. SyncBatchNorm)."""
        return model

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        """Wrap the model for training and give every rank rank 0's weights and buffers."""
        return model

    def eval_model(self) -> nn.Module:
        """The model to run validation with: it must not communicate, because validation
        shards differ in size and a collective in forward would wait forever."""
        return self.model

    def share_buffers(self, module: nn.Module) -> None:
        """Give every rank rank 0's buffers of `module` (collective). Each rank updates its
        BatchNorm running statistics with its own batches, and checkpoints hold rank 0's."""

    def module_state_dict(self) -> dict:
        """Called on every rank (a sharding strategy would gather here)."""
        return self.precision.module_state_dict(self.module)

    def load_module_state_dict(self, state: dict) -> None:
        """Every rank loads the same checkpoint: no broadcast needed afterwards."""
        self.precision.load_module_state_dict(self.module, state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        """Called on every rank (a sharding strategy would gather here)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(state)

    # --- optimizer and step ----------------------------------------------------------------------
    def named_optimizer_params(self) -> List[Tuple[str, torch.Tensor]]:
        """What the optimizer must update (fp32 masters under O2), named after the model's
        parameters (for parameter groups)."""
        return self.precision.named_optimizer_params(self.module)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def micro_step(self, last: bool):
        """Context for one micro-batch's forward and backward. With gradient accumulation the
        micro-batches before the last skip the gradient reduction, except under O2: there each
        micro-batch's reduced half gradients are summed in the fp32 masters (as apex with
        torch DDP), so every one is reduced."""
        if last or self.precision.has_masters:
            return contextlib.nullcontext()
        return self._no_sync()

    def _no_sync(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)
        if self.precision.has_masters:
            self._reduce_gradients()
            self.precision.accumulate_grads()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscaling, the overflow check and the update see fully reduced gradients, so every
        rank skips (or takes) the same steps."""
        if not self.precision.has_masters:  # O2 reduced and moved them in `backward`
            self._reduce_gradients()
        self.precision.optimizer_step(optimizer)

    def _reduce_gradients(self) -> None:
        """Wait until every gradient is averaged over the ranks (DDP does it in backward)."""

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
    def data_shard(self) -> Shard:
        """What the data loaders need to know of this process (sharded by the GLOBAL rank)."""
        return Shard(rank=self.rank, world_size=self.world_size,
                     local_world_size=self.local_world_size, is_main=self.is_main(),
                     gather=self.gather_objects)

    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_devices(self) -> int:
        """Devices one process drives (DataParallel drives several)."""
        return 1

    @property
    def cuda_devices(self) -> List[torch.device]:
        """The GPUs this process drives: their RNG states go into its checkpoints."""
        return [self.device] if self.device.type == "cuda" else []

    def describe(self) -> dict:
        return {"strategy": self.name, "world_size": self.world_size,
                "devices_per_process": self.num_devices, "backend": None}

    def explain_failure(self, err: BaseException) -> Optional[str]:
        """A one-paragraph explanation if `err` means a peer process died or hung, else None."""
        return None

    def teardown(self) -> None:
        pass


def _silent(message: str) -> None:
    pass


class _InPrecisionContext(nn.Module):
    """Runs the wrapped module inside the precision's forward context (autocast for O1)."""

    def __init__(self, module: nn.Module, context):
        super().__init__()
        self.module, self.context = module, context

    def forward(self, *args, **kwargs):
        with self.context():
            return self.module(*args, **kwargs)


class DataParallelStrategy(Strategy):
    """One process drives every visible GPU; the batch is split across them each step."""

    name = "dp"

    def setup_environment(self) -> torch.device:
        device = super().setup_environment()
        if device.type == "cpu":
            print("note: DataParallel without GPUs runs the model on the CPU as a plain module")
        return device

    def replica_module(self, model: nn.Module) -> nn.Module:
        # DataParallel: each replica runs in a thread of its own, and autocast state is per
        # thread. parallel_apply re-enters autocast with only `enabled`, so the replicas would
        # run at the device's default half type (fp16 on CUDA, even for a bf16 run, with no
        # loss scaler): each replica enters the precision's own context instead.
        return _InPrecisionContext(model, self.precision.forward_context)

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        if self.device.type != "cuda":
            return model
        # DataParallel: replicate the module to all GPUs every step; gradients land on GPU 0.
        return nn.DataParallel(self.replica_module(model))

    @property
    def num_devices(self) -> int:
        return torch.cuda.device_count() if self.device.type == "cuda" else 1

    @property
    def cuda_devices(self) -> List[torch.device]:
        return [torch.device("cuda", i) for i in range(self.num_devices)
                ] if self.device.type == "cuda" else []


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
        return self.module

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


class _HorovodWire:
    """A tensor as Horovod 0.28 can send it: contiguous (channels_last tensors travel as a
    contiguous copy), and of a dtype it has collectives for (bfloat16 travels as float32, exact
    both ways). With `fp16` (--fp16-allreduce) every floating tensor travels as float16, as
    Horovod's own fp16 compression does. DistributedOptimizer calls it as its gradient
    'compression'; the broadcasts use it too. `decompress` gives the tensor back in its own
    dtype and layout."""

    def __init__(self, fp16: bool = False):
        self.fp16 = fp16

    def compress(self, tensor: torch.Tensor):
        dtype = tensor.dtype
        if self.fp16 and tensor.is_floating_point():
            dtype = torch.float16
        elif dtype == torch.bfloat16:
            dtype = torch.float32
        # One conversion for both, and none (the tensor itself) when neither is needed.
        wire = tensor.to(dtype=dtype, memory_format=torch.contiguous_format)
        return wire, (tensor.dtype, _memory_format(tensor))

    @staticmethod
    def decompress(wire: torch.Tensor, ctx) -> torch.Tensor:
        dtype, memory_format = ctx
        return wire.to(dtype=dtype, memory_format=memory_format)


def _memory_format(tensor: torch.Tensor) -> torch.memory_format:
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(
            memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class _HorovodGatherRows(torch.autograd.Function):
    """hvd.allgather of one row per rank whose backward SUMS the gradients over ranks, as
    torch.distributed's differentiable all-gather does. (hvd.allgather's own backward
    averages them, which under-weights the cross-rank terms of SyncBN's statistics by the
    world size.)"""

    @staticmethod
    def forward(ctx, row: torch.Tensor) -> torch.Tensor:
        import horovod.torch as hvd
        return hvd.allgather(row)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        import horovod.torch as hvd
        return hvd.allreduce(grad, op=hvd.Sum)[hvd.rank():hvd.rank() + 1]


class HorovodStrategy(Strategy):
    """One process per device, launched by horovodrun; gradients all-reduced by Horovod's
    DistributedOptimizer (gloo on CPU, NCCL on GPU), everything else through hvd collectives."""

    name = "hvd"

    def __init__(self, precision: Optional[Precision] = None, *, sync_bn: bool = False,
                 fp16_allreduce: bool = False, backward_passes_per_step: int = 1, **common):
        super().__init__(precision, **common)
        self.sync_bn, self.fp16_allreduce = sync_bn, fp16_allreduce
        self.backward_passes_per_step = backward_passes_per_step

    @classmethod
    def options_from(cls, cfg: TrainConfig) -> dict:
        return dict(super().options_from(cfg), sync_bn=cfg.sync_bn,
                    fp16_allreduce=cfg.fp16_allreduce, backward_passes_per_step=cfg.grad_accum)

    def setup_environment(self) -> torch.device:
        try:
            import horovod.torch as hvd
        except ImportError as err:
            raise UsageError(f"train/hvd.py needs Horovod built with PyTorch support ({err}): "
                             "run `launch/env.sh bash launch/install_horovod.sh` (see README)")
        self.hvd = hvd
        hvd.init()  # Horovod: ranks, sizes and the controller come from horovodrun
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.local_world_size = hvd.local_size()  # horovodrun sets no LOCAL_WORLD_SIZE
        return super().setup_environment()  # Horovod: one GPU per process, by local rank

    def _convert_module(self, model: nn.Module) -> nn.Module:
        if self.sync_bn:
            # Horovod: BatchNorm statistics over the global batch, gathered by Horovod (the
            # statistics' gradients flow back to every rank).
            return convert_to_cross_rank_bn(model, gather=_HorovodGatherRows.apply)
        return model

    def _wrap_and_share(self, model: nn.Module) -> nn.Module:
        # Horovod: every rank starts from rank 0's weights and buffers. (After a resume every
        # rank loads the same checkpoint, optimizer state included: nothing more to send.)
        self._broadcast_from_rank0(model.state_dict().items())
        return model

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        hvd = self.hvd
        # Horovod: DistributedOptimizer all-reduces each gradient from a hook that fires as soon
        # as backward produces it. Hooks only fire on tensors autograd reaches: the model's own
        # parameters (half under O2), never the fp32 masters the optimizer updates. So it wraps
        # a stand-in over the model's parameters that is never stepped, and serves as the
        # gradient reducer (`synchronize`); the precision plugin steps the real optimizer.
        stand_in = torch.optim.SGD(self.module.parameters(), lr=0.0)
        self.reducer = hvd.DistributedOptimizer(
            stand_in, named_parameters=list(self.module.named_parameters()),
            # fp16 halves the traffic; otherwise bf16 must travel as fp32
            compression=_HorovodWire(fp16=self.fp16_allreduce),
            # O2 reduces every micro-batch (summed in the fp32 masters), the others only the last
            backward_passes_per_step=(1 if self.precision.has_masters
                                      else self.backward_passes_per_step),
            op=hvd.Average)
        return optimizer

    def _reduce_gradients(self) -> None:
        # Horovod: wait for the all-reduces the hooks started during backward.
        self.reducer.synchronize()

    def eval_model(self) -> nn.Module:
        # Horovod: like DDP, validate with rank 0's BatchNorm running statistics.
        self.share_buffers(self.module)
        return self.model

    def share_buffers(self, module: nn.Module) -> None:
        self._broadcast_from_rank0(module.named_buffers())

    def _broadcast_from_rank0(self, named_tensors) -> None:
        """In place, like hvd.broadcast_parameters, for tensors Horovod 0.28 cannot send as
        they are too: bfloat16 ones travel as float32 (exact both ways), channels_last ones as
        a contiguous copy."""
        for name, tensor in named_tensors:
            wire, _ = _HorovodWire().compress(tensor)
            self.hvd.broadcast_(wire, root_rank=0, name=f"recipe.broadcast.{name}")
            if wire is not tensor:
                tensor.copy_(wire)

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
