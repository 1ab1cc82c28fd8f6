"""The batched crop and resize of `--data-backend gpu` (gpu_decode.py), on the device: each
decoded sample's box (a RandomResizedCrop's, or validation's resize-then-centre-crop) is gathered
with its neighbours onto canvas strips (one canvas per group of similar widths, bounded by their
pixels: resample_groups) and resized with one `torchvision.ops.roi_align` per canvas, then
flipped where drawn.

The resize: roi_align averages ceil(box / output) bilinear samples per output pixel in each
direction. Enlarging (one sample per pixel) that is torchvision's bilinear resize; shrinking it
is a box filter over each output pixel's footprint, where torchvision's antialiased resize uses
a triangle twice as wide, so images differ a little from the `pytorch` backend's (bounded in
tests/test_gpu_decode.py). The output is not rounded to uint8 in between.
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Sequence, Tuple

import torch
from torchvision.ops import roi_align

from .host_batch import HostBatch

# Rows of one canvas strip (roi_align's coordinates are float32: a strip this high keeps a
# sample position within 1/2000 of a pixel); a box taller than this gets a strip of its own.
_STRIP_ROWS = 4096


class Decoded(NamedTuple):
    """One sample, decoded: the image (uint8 CHW on the device) and where to cut it."""
    image: torch.Tensor
    target: int
    region: Tuple[int, int, int, int]  # (top, left, height, width): rows and columns resampled
    box: Tuple[float, float, float, float]  # (x1, y1, x2, y2) inside the region, in pixels
    flip: bool


def val_box(height: int, width: int, resize: int, crop: int) -> Tuple[float, ...]:
    """(x1, y1, x2, y2) in the image of what torchvision's Resize(resize) + CenterCrop(crop)
    keep: resampling that box to crop x crop gives the same sample positions."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    sy, sx = height / new_h, width / new_w
    return left * sx, top * sy, (left + crop) * sx, (top + crop) * sy


def val_region(height: int, width: int, box: Tuple[float, ...]
               ) -> Tuple[Tuple[int, int, int, int], Tuple[float, ...]]:
    """The pixels validation's `box` (val_box) reads, and the box inside them: roi_align's
    samples lie within the box shifted by half a pixel, and each reads its two neighbours, so
    these rows and columns (the image's edge where the box reaches it) are all it touches.
    -> ((top, left, height, width), (x1, y1, x2, y2) relative to that region)."""
    x1, y1, x2, y2 = box
    left, top = max(0, math.floor(x1 - 0.5)), max(0, math.floor(y1 - 0.5))
    right = min(width - 1, math.ceil(x2 - 0.5))
    bottom = min(height - 1, math.ceil(y2 - 0.5))
    return ((top, left, bottom - top + 1, right - left + 1),
            (x1 - left, y1 - top, x2 - left, y2 - top))


def strip_layout(rows: Sequence[int]) -> Tuple[List[Tuple[int, int]], int, int]:
    """Blocks of `rows` rows stacked into strips of at most _STRIP_ROWS rows (a taller block
    gets a strip of its own). -> ((strip, first row) of each block, strips, rows per strip)."""
    places, strip, used = [], 0, 0
    for r in rows:
        if used and used + r > _STRIP_ROWS:  # full: the next strip
            strip, used = strip + 1, 0
        places.append((strip, used))
        used += r
    return places, strip + 1, max(first + r for (_, first), r in zip(places, rows))


def flat_pixels(images: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[int],
                                                          List[Tuple[int, int, int]]]:
    """The batch's images as one flat uint8 tensor, each in its own memory order (TorchCodec's
    and torchvision's CHW, nvImageCodec's HWC seen as CHW: one copy of the batch's pixels, no
    copy per image to change its layout). -> (the pixels, where each image starts, its
    (channel, row, column) strides)."""
    flats, starts, strides, at = [], [], [], 0
    for img in images:
        if not (img.is_contiguous() or img.permute(1, 2, 0).is_contiguous()):
            img = img.contiguous()  # a view with gaps (no decoder gives one)
        flats.append(torch.as_strided(img, (img.numel(),), (1,), img.storage_offset()))
        starts.append(at)
        strides.append(tuple(img.stride()))
        at += img.numel()
    return torch.cat(flats), starts, strides


class GroupPlan(NamedTuple):
    """One roi_align call, as planned on the host: its regions, the canvas they are packed into,
    and where its tensors are in the batch's HostBatch."""
    regions: List[Tuple[int, int, int, int]]
    strips: int
    height: int  # rows per strip
    cols: int
    rows: int   # HostBatch index: int64 (4, strips * height), per canvas row (canvas_rows)
    boxes: int  # HostBatch index: float32 (len(members), 5), roi_align's boxes
    where: int  # HostBatch index: int64 (len(members),), the members' places in the batch


def canvas_rows(regions: Sequence[Tuple[int, ...]], starts: Sequence[int],
                strides: Sequence[Tuple[int, int, int]], places: Sequence[Tuple[int, int]],
                strips: int, height: int) -> torch.Tensor:
    """For each canvas row (on the host: four numbers per row): where its first pixel's first
    channel is among the batch's flat pixels, the step to the next column and to the next
    channel (the image's own strides), and the last column it reads. A region's block is its
    rows with the first and the last repeated; rows below a strip's last block read sample 0's
    first pixel and are never sampled. -> int64 (4, strips * height)."""
    top, left, h, _ = torch.tensor(regions).unbind(1)
    counts = h + 2
    sample = torch.repeat_interleave(torch.arange(len(regions)), counts)
    stacked_start = torch.cumsum(counts, 0) - counts
    in_block = torch.arange(len(sample)) - stacked_start[sample]  # row within its block
    local = torch.minimum((in_block - 1).clamp_(min=0), h[sample] - 1)
    step_c, step_y, step_x = torch.tensor(strides).unbind(1)
    base = (torch.tensor(starts) + top * step_y + left * step_x)[sample] + local * step_y[sample]
    block_start = torch.tensor([strip * height + first for strip, first in places])
    at = block_start[sample] + in_block
    rows = torch.zeros((4, strips * height), dtype=torch.int64)
    rows[1:3] = 1  # unused rows: any in-bounds steps
    rows[0, at], rows[1, at], rows[2, at] = base, step_x[sample], step_c[sample]
    rows[3, at] = torch.tensor([w - 1 for _, _, _, w in regions])[sample]
    return rows


def plan_groups(samples: Sequence[Decoded], starts: Sequence[int],
                strides: Sequence[Tuple[int, int, int]], stage: HostBatch) -> List[GroupPlan]:
    """The batch's roi_align calls (resample_groups), their host tensors added to `stage`."""
    plans = []
    for group in resample_groups([s.region for s in samples]):
        members = [samples[i] for i in group]
        regions = [s.region for s in members]
        places, strips, height = strip_layout([h + 2 for _, _, h, _ in regions])
        rows = canvas_rows(regions, [starts[i] for i in group], [strides[i] for i in group],
                           places, strips, height)
        boxes = torch.tensor([[strip, x1, first + 1 + y1, x2, first + 1 + y2]
                              for (strip, first), (x1, y1, x2, y2) in
                              zip(places, (s.box for s in members))], dtype=torch.float32)
        plans.append(GroupPlan(regions, strips, height,
                               max(w for _, _, _, w in regions) + 1, stage.add(rows),
                               stage.add(boxes), stage.add(torch.tensor(group))))
    return plans


def pack_regions(pixels: torch.Tensor, plan: GroupPlan, rows: torch.Tensor) -> torch.Tensor:
    """A group's regions, one above the other, in float32 strips of a (strips, 3, rows, cols)
    canvas that one roi_align resamples; `rows`: canvas_rows on the device.

    Each region starts at column 0 (where roi_align clamps by itself), gets one extra row above
    and below and its last column repeated to the canvas's width: bilinear sampling near a
    region's edge then reads the edge's own pixels, as resampling the cut-out region alone (the
    `pytorch` backend's crop, then resize) does, never a neighbour's. A gather per channel from
    the batch's pixels builds it."""
    base, step_x, step_c, last_col = rows
    columns = torch.minimum(torch.arange(plan.cols, device=pixels.device)[None, :],
                            last_col[:, None])
    at = base[:, None] + columns * step_x[:, None]  # (strips * height, cols): channel 0
    canvas = torch.empty((plan.strips, 3, plan.height, plan.cols), dtype=torch.float32,
                         device=pixels.device)
    for channel in range(3):
        if channel:
            at += step_c[:, None]
        canvas[:, channel].copy_(pixels[at].view(plan.strips, plan.height, plan.cols))
    return canvas


# The most canvas pixels one roi_align call gets (float32, 3 channels: 12 bytes each, plus an
# int64 index per pixel while it is built): about 400 MB + 270 MB. A region larger than this
# gets a call of its own.
_CALL_PIXELS = 1 << 25


def resample_groups(regions: Sequence[Tuple[int, int, int, int]]) -> List[List[int]]:
    """The batch's samples split into roi_align calls whose canvas stays within a small multiple
    of their regions' own pixels: a canvas is as wide as its widest region, so each call takes
    regions of at most twice the narrowest one's width (widest first), and at most
    _CALL_PIXELS of canvas. One 2,500 px crop among 255 small ones gets a call of its own
    instead of widening all of them. -> sample indices per call."""
    order = sorted(range(len(regions)), key=lambda i: -regions[i][3])
    groups: List[List[int]] = []
    rows = cols = 0
    for i in order:
        _, _, height, width = regions[i]
        if groups and cols <= 2 * (width + 1) and (rows + height + 2) * cols <= _CALL_PIXELS:
            groups[-1].append(i)
            rows += height + 2
        else:
            groups.append([i])
            rows, cols = height + 2, width + 1
    return groups


def resample(samples: Sequence[Decoded], size: int, stage: HostBatch
             ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Each sample's box resampled to size x size and flipped where drawn: one roi_align per
    group of regions of similar widths (resample_groups; one for a batch of ImageNet's crops).
    Every host tensor this needs goes in `stage`, beside what the caller put there, and reaches
    the device in its one copy. -> (float32 (N, 3, size, size) in 0..255, every tensor of
    `stage` on the device)."""
    device = stage.device
    pixels, starts, strides = flat_pixels([s.image for s in samples])
    plans = plan_groups(samples, starts, strides, stage)
    flips = stage.add(torch.tensor([s.flip for s in samples]))
    sent = stage.send()
    out = torch.empty((len(samples), 3, size, size), dtype=torch.float32, device=device)
    for plan in plans:
        canvas = pack_regions(pixels, plan, sent[plan.rows])
        # aligned=True: pixel centres at +0.5, as torch's interpolate (align_corners=False)
        # has them; sampling_ratio=-1: ceil(box / size) samples per output pixel (docstring)
        resampled = roi_align(canvas, sent[plan.boxes], output_size=(size, size),
                              spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        del canvas  # before the next group's
        out[sent[plan.where]] = resampled
    return torch.where(sent[flips].view(-1, 1, 1, 1), out.flip(3), out), sent


def crop_resize(samples: Sequence[Decoded], size: int, device: torch.device) -> torch.Tensor:
    """resample() alone: -> float32 (N, 3, size, size) in 0..255 on `device`."""
    return resample(samples, size, HostBatch(device))[0]
