"""The optimizer of a recipe: which one (--opt) and which weight decay each parameter gets.

Parameter groups follow torchvision's references: the weights and biases of normalisation layers
get --norm-weight-decay, the biases of other layers --bias-weight-decay, everything else --wd.
Groups with the same decay are merged, so a run without these options has one group (and its
checkpoints load into older code and vice versa).

LARS and LAMB come from timm.optim (maintained, used by its "ResNet strikes back" recipes).
timm's LARS skips its trust ratio in groups without weight decay, the usual exclusion of norm
and bias parameters; timm's LAMB clips the global gradient norm to 1 itself.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn as nn

from .options import OptimizerOptions

# Layers whose parameters are scales and shifts, not filters (torchvision's list).
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
               nn.LocalResponseNorm)


def parameter_kinds(module: nn.Module) -> Dict[str, str]:
    """Qualified parameter name -> "norm", "bias" or "other"."""
    kinds = {}
    for prefix, layer in module.named_modules():
        for name, _ in layer.named_parameters(recurse=False):
            qualified = f"{prefix}.{name}" if prefix else name
            if isinstance(layer, NORM_LAYERS):
                kinds[qualified] = "norm"
            else:
                kinds[qualified] = "bias" if name == "bias" else "other"
    return kinds


def parameter_groups(cfg: OptimizerOptions, module: nn.Module,
                     named_params: Sequence[Tuple[str, torch.Tensor]]) -> List[dict]:
    """Groups of `named_params` (the tensors the optimizer updates, fp32 masters under O2,
    named after `module`'s parameters) by weight decay, in first-seen order."""
    decay = {"norm": cfg.weight_decay if cfg.norm_weight_decay is None else cfg.norm_weight_decay,
             "bias": cfg.weight_decay if cfg.bias_weight_decay is None else cfg.bias_weight_decay,
             "other": cfg.weight_decay}
    kinds = parameter_kinds(module)
    groups: Dict[float, dict] = {}
    for name, param in named_params:
        wd = decay[kinds[name]]
        groups.setdefault(wd, {"params": [], "weight_decay": wd})["params"].append(param)
    return list(groups.values())


def build_optimizer(cfg: OptimizerOptions, module: nn.Module,
                    named_params: Sequence[Tuple[str, torch.Tensor]],
                    lr: float) -> torch.optim.Optimizer:
    groups = parameter_groups(cfg, module, named_params)
    name = cfg.optimizer
    if name in ("sgd", "nesterov"):
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum,
                               nesterov=name == "nesterov")
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    if name == "rmsprop":
        # TF-style settings of the EfficientNet-era recipes (torchvision's references too).
        return torch.optim.RMSprop(groups, lr=lr, momentum=cfg.momentum, eps=0.0316, alpha=0.9)
    from timm.optim import Lamb, Lars
    if name == "lars":
        return Lars(groups, lr=lr, momentum=cfg.momentum)
    return Lamb(groups, lr=lr)
