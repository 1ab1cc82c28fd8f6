"""When two decodes of the same JPEG crop count as the same image: the bounds that the CPU tests
and the GPU tier (tests/gpu/test_gpu_decode.py) hold a GPU decoder to against libjpeg-turbo.

Bounds, on uint8 pixels (0-255), over a set of crops:
  mean |difference| < 2     torchvision's test of its GPU decode_jpeg against its CPU one
                            (test/test_image.py, test_decode_jpegs_cuda: mean absolute error < 2)
  >= 99 % of values within 3
                            TorchCodec's tolerance for its CUDA decodes against the CPU's
                            (test/utils.py, assert_frames_equal: 3 levels with CUDA 13, on a
                            share of the values where decoders are known to differ), here on at
                            least 99 % of them
Why not exact: nvJPEG's inverse DCT and colour conversion round differently from
libjpeg-turbo's, by a level or two; chroma upsampling (4:2:0 files) by interpolation ("fancy",
libjpeg-turbo's default) or by repetition moves colour edges by up to a pixel, where single
values differ by much more, hence a share within 3 and not a maximum. A crop cut one pixel off,
or mirrored, breaks both bounds on textured images (tests/test_gpu_decode.py plants each).
"""
from __future__ import annotations

from typing import Dict, Sequence

import torch

MEAN_ABS_BOUND = 2.0
WITHIN = 3
WITHIN_SHARE_BOUND = 0.99


def agreement(ours: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> Dict[str, float]:
    """Mean |difference| and the share of values within WITHIN, over uint8 images of equal
    shapes (any device)."""
    assert len(ours) == len(reference) > 0
    total = close = 0
    absolute = 0.0
    for a, b in zip(ours, reference):
        assert a.shape == b.shape, (a.shape, b.shape)
        diff = (a.cpu().to(torch.int16) - b.cpu().to(torch.int16)).abs()
        absolute += diff.sum().item()
        close += (diff <= WITHIN).sum().item()
        total += diff.numel()
    return {"mean_abs": absolute / total, "within_3": close / total}


def agrees(numbers: Dict[str, float]) -> bool:
    return numbers["mean_abs"] < MEAN_ABS_BOUND and numbers["within_3"] >= WITHIN_SHARE_BOUND
