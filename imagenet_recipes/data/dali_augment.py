"""The recipe augmentations inside a DALI pipeline: the same --auto-augment policies and random
erasing as the pytorch backend (recipe/data/augment.py), from `nvidia.dali.auto_aug`.

They run on the CPU (a CPU-only pipeline) and on the GPU alike. The policies choose an operation
per sample with Python `if`s that DALI rewrites into conditionals, so the pipeline must be built
with `pipeline_def(..., enable_conditionals=True)` (a plain `Pipeline` cannot). Settings follow
torchvision's, which the pytorch backend uses:
  imagenet  AutoAugment's ImageNet policy, translations up to 150/331 of the side
  ra        RandAugment, 2 ops at --ra-magnitude of 31 bins, translations up to 150/331
  ta_wide   TrivialAugment wide, 31 bins, translations up to 32 px
all filling uncovered pixels with 0 (torchvision's default). DALI's equalize follows OpenCV
rather than PIL, and its AutoAugment has 11 magnitude bins: the same policies, not bit-equal.

Random erasing acts on the normalised images (fill 0 = the mean colour, as torchvision's
references): one box per image with probability p, area U(0.02, 0.33) of the image and aspect
ratio log-uniform in (0.3, 3.3); a box that would not fit is clamped (torchvision redraws it).
"""
from __future__ import annotations

import contextlib
import math
import warnings

from ..options import AugmentOptions
from .augment import RAND_AUGMENT_OPS


@contextlib.contextmanager
def quiet_deprecated_aliases():
    """auto_aug (DALI 2.4) still calls fn.experimental.equalize / filter, whose deprecation
    warning DALI shows through its own filter on every pipeline build (once per epoch here);
    neither -W nor pytest's filters reach it, so the message is dropped at display time."""
    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if not (category is DeprecationWarning and "fn.experimental." in str(message)):
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def apply_policy(images, cfg: AugmentOptions, size: int):
    """uint8 HWC images of size x size -> the same, through the --auto-augment policy."""
    if cfg.auto_augment == "none":
        return images
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment

    with quiet_deprecated_aliases():
        if cfg.auto_augment == "imagenet":
            return auto_augment.auto_augment_image_net(
                images, shape=(size, size), max_translate_rel=150 / 331, fill_value=0)
        if cfg.auto_augment == "ra":
            return rand_augment.rand_augment(
                images, n=RAND_AUGMENT_OPS, m=cfg.ra_magnitude, num_magnitude_bins=31,
                shape=(size, size), max_translate_rel=150 / 331, fill_value=0)
        return trivial_augment.trivial_augment_wide(images, num_magnitude_bins=31, fill_value=0)


def random_erase(images, p: float, fn, types):
    """Normalised images -> one box per image erased to 0 with probability p (no conditionals:
    an image left alone gets a 0 x 0 box)."""
    import nvidia.dali.math as dmath

    area = fn.random.uniform(range=[0.02, 0.33])
    ratio = dmath.exp(fn.random.uniform(range=[math.log(0.3), math.log(3.3)]))
    height = dmath.min(dmath.sqrt(area * ratio), 1.0)
    width = dmath.min(dmath.sqrt(area / ratio), 1.0)
    top = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - height)
    left = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - width)
    on = fn.cast(fn.random.coin_flip(probability=p), dtype=types.FLOAT)
    return fn.erase(images, anchor=fn.stack(top, left), shape=fn.stack(height * on, width * on),
                    axis_names="HW", normalized_anchor=True, normalized_shape=True,
                    fill_value=0.0)
