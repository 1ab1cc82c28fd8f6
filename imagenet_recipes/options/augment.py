"""The augmentation options: the crop sizes and what the train transform does to each image and
batch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import UsageError
from ..registry import ENGINE_LOOP
from .fields import AUGMENTATION, DATA, FRACTION, NOT_NEGATIVE, POSITIVE_COUNT, Bound, Section, opt

AUTO_AUGMENT = ("none", "imagenet", "ra", "ta_wide")


@dataclass(frozen=True)
class AugmentOptions(Section):
    """What the transforms do to each image and batch: the train crop and the validation
    resize and crop (every backend's), the policy, erasing, MixUp/CutMix, repeated augmentation
    and progressive resizing."""
    image_size: int = field(default=224, metadata=opt(
        DATA, "--image-size", "--train-crop-size", help="train crop size", evaluation=True,
        bound=POSITIVE_COUNT))
    val_resize_size: int = field(default=0, metadata=opt(
        DATA, "--val-resize-size",
        help="validation resizes the shorter side to this (0: val crop / 0.875, e.g. 256 for "
             "224)", evaluation=True, bound=NOT_NEGATIVE))
    val_crop_size: int = field(default=0, metadata=opt(
        DATA, "--val-crop-size", help="validation center crop (0: the train crop size)",
        evaluation=True, bound=NOT_NEGATIVE))
    auto_augment: str = field(default="none", metadata=opt(
        AUGMENTATION, "--auto-augment",
        help="policy after the random crop and flip: imagenet (AutoAugment's ImageNet policy), "
             "ra (RandAugment, 2 ops at --ra-magnitude), ta_wide (TrivialAugment wide)",
        choices=AUTO_AUGMENT))
    ra_magnitude: int = field(default=9, metadata=opt(
        AUGMENTATION, "--ra-magnitude", help="RandAugment magnitude (of 30 bins)",
        bound=Bound(low=0, high=30)))
    random_erase: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--random-erase", help="probability of random erasing per training image",
        bound=FRACTION))
    mixup_alpha: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--mixup-alpha", help="MixUp's Beta(alpha, alpha) (0: off); with "
        "--cutmix-alpha too, each batch gets one of the two at random", needs=ENGINE_LOOP,
        bound=NOT_NEGATIVE))
    cutmix_alpha: float = field(default=0.0, metadata=opt(
        AUGMENTATION, "--cutmix-alpha", help="CutMix's Beta(alpha, alpha) (0: off)",
        needs=ENGINE_LOOP, bound=NOT_NEGATIVE))
    ra_sampler: bool = field(default=False, metadata=opt(
        AUGMENTATION, "--ra-sampler",
        help="repeated augmentation: each image appears --ra-reps times per epoch (on "
             "different ranks, with different crops), the epoch keeps its length"))
    ra_reps: int = field(default=3, metadata=opt(
        AUGMENTATION, "--ra-reps", help="copies of each image with --ra-sampler",
        bound=POSITIVE_COUNT))
    progressive_resize: Optional[tuple] = field(default=None, metadata=opt(
        AUGMENTATION, "--progressive-resize",
        help="FFCV's progressive resizing: the train crop grows linearly from MIN to MAX "
             "pixels (multiples of 32) between epochs START and END",
        nargs=4, type=int, metavar=("MIN", "MAX", "START", "END"), evaluation=True))

    def largest_train_crop(self) -> int:
        """The train crop in pixels: under --progressive-resize its MAX (the loaders then ignore
        --image-size)."""
        if self.progressive_resize is not None:
            return self.progressive_resize[1]
        return self.image_size

    @classmethod
    def rules(cls, values) -> None:
        if values.progressive_resize is not None:
            low, high, start, end = values.progressive_resize
            if not (0 < low <= high and 0 <= start < end):
                given = " ".join(map(str, values.progressive_resize))
                raise UsageError("--progressive-resize MIN MAX START END needs 0 < MIN <= MAX "
                                 f"and START < END, got {given}")
