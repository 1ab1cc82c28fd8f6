"""What the model is trained towards: MixUp / CutMix batches and the loss on (soft) targets.

MixUp and CutMix are torchvision.transforms.v2's, applied to the normalised batch on the device
(both are linear in the pixels or paste whole regions, so mixing after normalisation is the same
as before it). They draw from the process's torch RNG, which is seeded and checkpointed.

The loss takes hard labels (validation) and soft targets (mixed batches) alike:
  ce   softmax cross-entropy with --label-smoothing (torch's, which smooths soft targets too)
  bce  a binary cross-entropy per class on the one-hot (smoothed, mixed) targets, averaged over
       classes and images as timm's BinaryCrossEntropy does ("ResNet strikes back")
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.transforms import v2

from .options import AugmentOptions, LossOptions

Mixer = Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def build_mixer(cfg: AugmentOptions, num_classes: int) -> Optional[Mixer]:
    """(images, int labels) -> (mixed images, soft targets), or None without mixing. With both
    alphas set, each batch gets one of the two, as in torchvision's references."""
    mixers = []
    if cfg.mixup_alpha > 0:
        mixers.append(v2.MixUp(alpha=cfg.mixup_alpha, num_classes=num_classes))
    if cfg.cutmix_alpha > 0:
        mixers.append(v2.CutMix(alpha=cfg.cutmix_alpha, num_classes=num_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


class RecipeLoss(nn.Module):
    def __init__(self, kind: str, label_smoothing: float, num_classes: int):
        super().__init__()
        self.kind, self.smoothing, self.num_classes = kind, label_smoothing, num_classes

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.kind == "ce":
            if targets.is_floating_point():
                targets = targets.to(logits.dtype)
            return F.cross_entropy(logits, targets, label_smoothing=self.smoothing)
        if not targets.is_floating_point():
            targets = F.one_hot(targets, self.num_classes)
        targets = targets.to(logits.dtype)
        if self.smoothing:
            targets = targets * (1.0 - self.smoothing) + self.smoothing / self.num_classes
        return F.binary_cross_entropy_with_logits(logits, targets)


def build_criterion(cfg: LossOptions, num_classes: int) -> nn.Module:
    return RecipeLoss(cfg.loss, cfg.label_smoothing, num_classes)
