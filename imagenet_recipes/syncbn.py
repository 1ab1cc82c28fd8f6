"""Cross-process BatchNorm over gloo: CPU ranks, and ranks sharing one GPU (`--share-gpus`).

`torch.nn.SyncBatchNorm` (fused CUDA kernels over NCCL) is what `--sync-bn` uses wherever it can
run: one rank per GPU over NCCL. It refuses CPU tensors, and NCCL refuses two ranks on one GPU,
yet `--sync-bn` must work on a CPU-only box and on a shared GPU, and the nd-vs-DDP parity test
needs BatchNorm over the *global* batch. Here each rank computes its local mean and (centred)
variance; one differentiable gather shares them, and the global statistics are combined with
the parallel-variance formula. Autograd derives the backward pass (the gather's backward sums
every rank's gradient of this rank's row), which is what SyncBatchNorm's hand-written backward
computes.

The gather is an all-reduce of a (world, 2C+1) table in which each rank fills its own row: gloo
has no all-gather for CUDA tensors (a funcol all-gather of them crashed both ranks with SIGSEGV
on an H100), but it all-reduces them. Adding zeros is exact, so the table is the gathered rows
bit for bit.

The naive E[x^2] - E[x]^2 over all-reduced sums is NOT used: in fp32 it cancels catastrophically
once activations have a large mean, and the gradients drift away from single-process BatchNorm.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from .errors import UsageError


class _GatherByAllReduce(torch.autograd.Function):
    """(1, n) on each rank -> (world, n), row r from rank r; differentiable."""

    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        ctx.rank = dist.get_rank()
        rows = local.new_zeros((dist.get_world_size(), local.shape[1]))
        rows[ctx.rank] = local[0]
        dist.all_reduce(rows, op=dist.ReduceOp.SUM)
        return rows

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # Every rank's output holds this rank's row: its gradient is the sum over the ranks.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank:ctx.rank + 1]


def _gather_over_world(local: torch.Tensor) -> torch.Tensor:
    """Every rank's row, concatenated along dim 0; differentiable (torch.distributed)."""
    return _GatherByAllReduce.apply(local)


class CrossRankBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the batches of every rank.

    `gather` concatenates every rank's (1, 2C+1) statistics row along dim 0 and must be
    differentiable: torch.distributed's by default, Horovod's `hvd.allgather` under horovodrun.
    """

    def __init__(self, *args, gather: Callable[[torch.Tensor], torch.Tensor] = _gather_over_world,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.gather = gather

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input, got {input.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        channels = x.shape[1]
        reduce_dims = [d for d in range(x.dim()) if d != 1]
        # statistics in fp32 whatever the input dtype (float64 stays float64)
        xf = x if x.dtype == torch.float64 else x.float()
        local_var, local_mean = torch.var_mean(xf, dim=reduce_dims, correction=0)
        local_count = torch.full((1,), x.numel() / channels, dtype=xf.dtype, device=x.device)
        local = torch.cat([local_mean, local_var, local_count]).unsqueeze(0)
        ranks = self.gather(local)
        means, variances, counts = ranks[:, :channels], ranks[:, channels:-1], ranks[:, -1:]
        total = counts.sum()
        mean = (counts * means).sum(0) / total
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / total  # biased, as BN uses

        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                            else self.momentum)
                unbiased = var * (total / (total - 1).clamp(min=1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)

        shape = [1, channels] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = (y * self.weight.to(xf.dtype).view(shape)
                 + self.bias.to(xf.dtype).view(shape))
        return y.to(x.dtype)


_PLAIN_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def check_plain_batchnorm(model: nn.Module) -> None:
    """--sync-bn replaces each BatchNorm by a cross-rank one and keeps only its statistics and
    affine parameters: a subclass that does more (timm's BatchNormAct2d also applies the
    activation) would lose that silently, so such a model is refused."""
    extended = sorted({type(m).__name__ for m in model.modules()
                       if isinstance(m, nn.modules.batchnorm._BatchNorm)
                       and type(m) not in (*_PLAIN_BATCHNORM, CrossRankBatchNorm)})
    if extended:
        raise UsageError(f"--sync-bn: the model's norm layers {', '.join(extended)} do more "
                         "than BatchNorm, and converting them would drop that; use a model "
                         "with plain BatchNorm layers (torchvision's, timm's ResNets), or "
                         "train without --sync-bn")


def convert_to_cross_rank_bn(module: nn.Module,
                             gather: Callable[[torch.Tensor], torch.Tensor] = _gather_over_world
                             ) -> nn.Module:
    """Replace every BatchNorm*d in `module` (recursively) by CrossRankBatchNorm, keeping state."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
            module, CrossRankBatchNorm):
        new = CrossRankBatchNorm(module.num_features, module.eps, module.momentum,
                                 module.affine, module.track_running_stats, gather=gather)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_to_cross_rank_bn(child, gather))
    return module
