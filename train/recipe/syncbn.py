"""Cross-process BatchNorm that also runs on CPU (gloo).

`torch.nn.SyncBatchNorm` only accepts GPU tensors, yet `--sync-bn` must work on a CPU-only box,
and the nd-vs-DDP parity test needs BatchNorm over the *global* batch. This module computes the
batch statistics from all-reduced per-channel sums. The all-reduce is the differentiable one from
`torch.distributed.nn`, so autograd derives the backward pass (whose all-reduce of the gradient
sums is exactly what SyncBatchNorm's hand-written backward does).
"""
from __future__ import annotations

import torch
import torch.distributed.nn as dist_nn
import torch.nn as nn


class CrossRankBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the batches of every rank."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input, got {input.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        channels = x.shape[1]
        reduce_dims = [d for d in range(x.dim()) if d != 1]
        xf = x.float()  # statistics in fp32 whatever the input dtype
        local_count = torch.tensor([x.numel() / channels], dtype=torch.float32, device=x.device)
        stats = torch.cat([xf.sum(reduce_dims), (xf * xf).sum(reduce_dims), local_count])
        stats = dist_nn.all_reduce(stats)
        total = stats[-1]
        mean = stats[:channels] / total
        var = stats[channels:2 * channels] / total - mean * mean  # biased, as in training BN

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
            y = y * self.weight.float().view(shape) + self.bias.float().view(shape)
        return y.to(x.dtype)


def convert_to_cross_rank_bn(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm*d in `module` (recursively) by CrossRankBatchNorm, keeping state."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
            module, CrossRankBatchNorm):
        new = CrossRankBatchNorm(module.num_features, module.eps, module.momentum,
                                 module.affine, module.track_running_stats)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        setattr(module, name, convert_to_cross_rank_bn(child))
    return module
