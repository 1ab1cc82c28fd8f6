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


# --- images made to expose a decoder's usual faults --------------------------------------------------
# Distinct levels per channel (a swap of channels moves every value by 50-90 levels) under one
# colour: the chroma is the same everywhere, so chroma upsampling (interpolated or repeated, the
# one way GPU decoders may rightly differ) changes nothing, and a decoder that repeats chroma is
# held to the same bounds. The detail is in luma, at full resolution: 4-pixel blocks of random
# brightness (a crop one pixel off moves a quarter of the values by up to 90 levels) on a left-
# to-right ramp (a mirrored image is 40 levels off on average).
BASE_COLOUR = (170, 120, 80)


def fault_exposing_jpegs(count: int, height: int = 180, width: int = 240, seed: int = 0) -> list:
    """`count` 4:2:0 JPEGs (quality 95) of the pattern above, each its own noise -> bytes."""
    import io

    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(-20, 20, width).view(1, width)
    files = []
    for _ in range(count):
        blocks = torch.randint(-45, 46, (height // 4 + 1, width // 4 + 1), generator=g)
        light = blocks.repeat_interleave(4, 0).repeat_interleave(4, 1)[:height, :width] + ramp
        pixels = (torch.tensor(BASE_COLOUR).view(3, 1, 1) + light).round().clamp(0, 255)
        out = io.BytesIO()
        Image.fromarray(pixels.to(torch.uint8).permute(1, 2, 0).numpy()).save(
            out, "JPEG", quality=95, subsampling=2)
        files.append(out.getvalue())
    return files


# What a broken decoder does, each planted by a stand-in (tests/test_gpu_decode.py) to show that
# the bounds catch it: channels swapped, the image mirrored, the crop a pixel or a block off,
# garbage
FAULTS = {
    "channels-swapped": lambda x, cut: cut(x.flip(0)),
    "mirrored": lambda x, cut: cut(x.flip(2)),
    "crop-one-pixel-off": lambda x, cut: cut(x, dy=1, dx=1),
    "crop-one-block-off": lambda x, cut: cut(x, dx=8),
    "garbage": lambda x, cut: torch.randint_like(cut(x), 0, 256),
}


def made_regions(height: int, width: int, count: int) -> list:
    """Crops of RandomResizedCrop's kind, away from the edges, at offsets that are not multiples
    of a JPEG block: (top, left, height, width)."""
    return [(height // 5 + i % 3, width // 6 + i % 5, height // 2, (2 * width) // 3)
            for i in range(count)]


def agreement_on_made_images(decode, count: int = 16) -> Dict[str, float]:
    """`decode` (a jpeg_decoders decoder, or a stand-in with its call) on fault_exposing_jpegs,
    against libjpeg-turbo (torchvision's CPU decode_image) on the same crops: agreement()."""
    from torchvision.io import ImageReadMode, decode_image

    data = [torch.frombuffer(bytearray(f), dtype=torch.uint8)
            for f in fault_exposing_jpegs(count)]
    wholes = [decode_image(d, mode=ImageReadMode.RGB) for d in data]
    regions = made_regions(*wholes[0].shape[1:], count)
    decoded = decode(data, regions if decode.crops else [None] * count)
    if not decode.crops:
        decoded = [x[:, t:t + h, l:l + w] for x, (t, l, h, w) in zip(decoded, regions)]
    return agreement(decoded, [x[:, t:t + h, l:l + w] for x, (t, l, h, w) in
                               zip(wholes, regions)])
