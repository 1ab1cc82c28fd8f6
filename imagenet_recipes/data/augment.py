"""The pytorch backend's image transforms (torchvision.transforms.v2 on uint8 CHW tensors), and
the crop sizes every backend shares.

Training: RandomResizedCrop -> horizontal flip -> the --auto-augment policy -> random erasing.
Validation: resize the shorter side to --val-resize-size -> center crop --val-crop-size.

Random erasing runs here on uint8 images, before normalisation on the device, so it fills with
the ImageNet mean colour: after normalisation that is 0, what torchvision's references (which
erase normalised tensors with 0) produce.
"""
from __future__ import annotations

from typing import Optional

from torchvision.transforms import v2

from ..options import AugmentOptions

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_CROP_RATIO = 0.875  # 224 crop out of a 256 resize
MEAN_PIXEL = tuple(int(round(255 * m)) for m in IMAGENET_MEAN)
RAND_AUGMENT_OPS = 2  # RandAugment's N, as in torchvision's references and timm's rand-m9-n2


def val_resize_size(crop: int) -> int:
    return int(round(crop / VAL_CROP_RATIO))


def val_sizes(cfg: AugmentOptions) -> tuple:
    """-> (resize, crop) of validation."""
    crop = cfg.val_crop_size or cfg.image_size
    return cfg.val_resize_size or val_resize_size(crop), crop


def smallest_crop(cfg: AugmentOptions) -> int:
    """The smallest crop the model meets in training or validation."""
    train = cfg.progressive_resize[0] if cfg.progressive_resize else cfg.image_size
    return min(train, val_sizes(cfg)[1])


def progressive_crop(cfg: AugmentOptions, epoch: int) -> int:
    """FFCV's progressive resizing: --progressive-resize MIN MAX START END grows the train crop
    linearly from MIN (until epoch START) to MAX (from epoch END on), in steps of 32 pixels."""
    low, high, start, end = cfg.progressive_resize
    if epoch <= start:
        return low
    if epoch >= end:
        return high
    size = low + (high - low) * (epoch - start) / (end - start)
    return int(round(size / 32)) * 32


def auto_augment(cfg: AugmentOptions) -> Optional[v2.Transform]:
    policy = cfg.auto_augment
    if policy == "imagenet":
        return v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)
    if policy == "ra":
        return v2.RandAugment(num_ops=RAND_AUGMENT_OPS, magnitude=cfg.ra_magnitude)
    if policy == "ta_wide":
        return v2.TrivialAugmentWide()
    return None


def train_transform(cfg: AugmentOptions, crop: Optional[int] = None) -> v2.Compose:
    steps = [v2.RandomResizedCrop(crop or cfg.image_size, antialias=True),
             v2.RandomHorizontalFlip()]
    policy = auto_augment(cfg)
    if policy is not None:
        steps.append(policy)
    if cfg.random_erase > 0:
        steps.append(v2.RandomErasing(p=cfg.random_erase, value=list(MEAN_PIXEL)))
    return v2.Compose(steps)


def val_transform(cfg: AugmentOptions, crop: Optional[int] = None) -> v2.Compose:
    """(`crop` is ignored: validation keeps its size; the argument matches train_transform.)"""
    resize, crop = val_sizes(cfg)
    return v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(crop)])
