"""Horovod: one process per device, launched by horovodrun (`train/hvd.py`)."""
from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.nn as nn

from ..errors import UsageError
from ..options.distribution import HorovodOptions
from ..options.strategy import StrategyOptions
from ..precision import Precision
from ..syncbn import check_plain_batchnorm, convert_to_cross_rank_bn
from .base import Strategy


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
    SECTIONS = (HorovodOptions,)

    def __init__(self, precision: Optional[Precision] = None, *, sync_bn: bool = False,
                 fp16_allreduce: bool = False, **common):
        super().__init__(precision, **common)
        self.sync_bn, self.fp16_allreduce = sync_bn, fp16_allreduce
        self.backward_passes_per_step = 1

    @classmethod
    def arguments(cls, options: StrategyOptions) -> dict:
        return {**super().arguments(options), "sync_bn": options.distribution.sync_bn,
                "fp16_allreduce": options.section(HorovodOptions).fp16_allreduce}

    def follow(self, plan) -> None:
        # Horovod: its hooks must know how many backward passes make a step, the plan's
        # micro-batches (--grad-accum, or what --global-batch splits into), or the second
        # micro-batch's backward fails the run
        super().follow(plan)
        self.backward_passes_per_step = plan.grad_accum

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
            check_plain_batchnorm(model)
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
        return {**super().describe(), "backend": backend,
                "sync_bn": "CrossRankBatchNorm" if self.sync_bn else None}

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
