"""`--data-backend gpu`: DataLoader workers only read the files; the training process decodes
each batch with the --gpu-decoder (jpeg_decoders.py: TorchCodec, or nvImageCodec with the GPU's
hardware JPEG decoder; libjpeg-turbo on a CPU run) and crops, resizes, flips and normalises it
with batched operations on the device, in a thread of its own on a CUDA stream of its own,
batches ahead of the step (prefetch.py).

Who does what
  workers   (-j DataLoader processes, forked from the fork server of loader_server.py, as the
            `pytorch` backend's are) read each file's bytes and its header (PIL reads the size,
            not the pixels), and draw the sample's RandomResizedCrop box and flip from the
            sample's own seed with the `pytorch` backend's own transform objects, in their
            order: both backends crop and flip a sample alike, and a resume needs no state.
  trainer   (its batch-preparing thread) decodes the batch's JPEGs in one call of the
            decoder (nvImageCodec: only the pixels each sample uses), gathers the crop boxes
            of the batch onto canvases (one per group of similar widths, bounded by their
            pixels: resample_groups), and resizes each canvas's boxes in one
            `torchvision.ops.roi_align`; then flip, normalisation and channels_last, as the
            other backends hand batches over (normalised float32 NCHW on the device, int64
            targets). What the host computes for a batch (gather indices, boxes, flips,
            targets) reaches the device in one non-blocking copy (host_batch.py); the pixels
            are read where the decoder left them, CHW or HWC, with no copy per image.
            Validation: the same, with the box that "resize the shorter side to
            --val-resize-size, then centre crop" cuts out of the image (only the pixels it
            reads: val_region).

Which files the batched decoder gets: JPEGs in YCbCr (PIL's mode RGB) that end with their end
marker and carry no EXIF rotation. TorchCodec and nvImageCodec turn images by their EXIF
orientation, which torchvision's decode_image (the other backends' decoder) does not; CMYK JPEGs
are not certain to come out of nvJPEG as the CPU decoders make them, and a JPEG cut short is
what nvJPEG may decode without an error where libjpeg refuses it. The rest (grayscale or CMYK
JPEGs, PNGs named .JPEG, JPEGs that the batched decoder refuses) is decoded in the training
process exactly as the `pytorch` backend decodes every file (torchvision.io.decode_image to RGB,
on the CPU), then moved to the device. A file that fails that too is unreadable: training
replaces it with the next readable sample (with the failed sample's seed), validation drops it,
and both count it as `skipped`, as the `pytorch` backend does (the replacement is read in the
training process).

The resize: roi_align averages ceil(box / output) bilinear samples per output pixel in each
direction. Enlarging (one sample per pixel) that is torchvision's bilinear resize; shrinking it
is a box filter over each output pixel's footprint, where torchvision's antialiased resize uses
a triangle twice as wide, so images differ a little from the `pytorch` backend's (bounded in
tests/test_gpu_decode.py). The output is not rounded to uint8 in between.

Not done here: --auto-augment and --random-erase (refused, with the backends that have them).
"""
from __future__ import annotations

import io
import math
import warnings
import weakref
from collections import Counter
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.ops import roi_align
from torchvision.transforms import v2

from ..options import AugmentOptions, LoaderOptions
from ..errors import UsageError
from ..machine import cores_per_process
from ..run_plan import RunPlan
from .augment import train_transform, val_sizes
from .folders import image_folders, read_image_uint8
from .decoder_check import check_decoder
from .host_batch import HostBatch
from .jpeg_decoders import DecoderSettings, Refused, make_decoder
from .loader_server import ensure_loader_server, loader_worker_context
from .loading import SampledLoader, WorkerGuard, loader_workers
from .prefetch import PreparedAhead
from .sampling import SampleKey, Shard, ShardedSampler, train_sampling

_EXIF_ORIENTATION = 0x0112
_JPEG_END = b"\xff\xd9"
_TAIL_BYTES = 1024  # JPEGs written by some cameras carry a few bytes after their end marker
# Rows of one canvas strip (roi_align's coordinates are float32: a strip this high keeps a
# sample position within 1/2000 of a pixel); a box taller than this gets a strip of its own.
_STRIP_ROWS = 4096
# Why a file went to the CPU decoder without the batched decoder seeing it (read_header)
NOT_PLAIN_JPEG = "not a plain JPEG (grayscale, CMYK, EXIF-rotated, cut short or not a JPEG)"


def refuse_unsupported(augment: AugmentOptions) -> None:
    """The recipe augmentations this backend does not do on the device: a UsageError."""
    missing = []
    if augment.auto_augment != "none":
        missing.append(f"--auto-augment {augment.auto_augment}")
    if augment.random_erase > 0:
        missing.append("--random-erase")
    if missing:
        raise UsageError(f"--data-backend gpu does not do {' or '.join(missing)}: use "
                         "--data-backend pytorch, dali-gpu or dali-cpu, which do")


# --- what the workers do ------------------------------------------------------------------------
class CropDraw:
    """A training sample's RandomResizedCrop box and flip, drawn from its seed with the
    `pytorch` backend's own transform objects, in their order (crop, then flip), so that both
    backends cut and flip each sample alike."""

    def __init__(self, augment: AugmentOptions):
        crop, flip = train_transform(augment).transforms[:2]
        assert isinstance(crop, v2.RandomResizedCrop) and isinstance(flip, v2.RandomHorizontalFlip)
        self.crop, self.flip = crop, flip

    def __call__(self, seed: int, height: int, width: int) -> Tuple[Tuple[int, ...], bool]:
        """-> ((top, left, height, width), flipped) for an image of height x width."""
        # make_params only asks the image for its size: a stand-in of that shape, no pixels
        stand_in = torch.empty((1, 1, 1), dtype=torch.uint8).expand(3, height, width)
        # The same seeding as folders.ImageFolderUint8 (fork_rng: the caller's RNG is kept)
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            box = self.crop.make_params([stand_in])
            flipped = bool(torch.rand(1) < self.flip.p)  # RandomHorizontalFlip's own test
        return (box["top"], box["left"], box["height"], box["width"]), flipped


class EncodedSample(NamedTuple):
    """One sample as a worker hands it over."""
    data: Optional[torch.Tensor]  # the file's bytes, uint8 (None in an EncodedBatch)
    target: int
    index: int
    seed: int
    height: int            # from the header (0: PIL could not read it)
    width: int
    batched: bool          # for the batched decoder (see the module docstring), else the CPU's
    box: Tuple[int, ...]   # training: (top, left, height, width) of the crop; else ()
    flip: bool


def read_header(data: bytes) -> Tuple[int, int, bool]:
    """-> (height, width, for the batched decoder?) from the file's header; (0, 0, False) when
    PIL cannot read it (the training process's CPU decode then has the last word)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            plain_jpeg = (image.format == "JPEG" and image.mode == "RGB"
                          and image.getexif().get(_EXIF_ORIENTATION, 1) == 1)
    except Exception:  # not an image PIL knows, or a header cut short
        return 0, 0, False
    return height, width, plain_jpeg and _JPEG_END in data[-_TAIL_BYTES:]


class EncodedImages(Dataset):
    """The samples of an ImageFolder as their files' bytes, keyed by `SampleKey`s; training
    samples come with their crop box and flip (`draw`: a CropDraw; None for validation)."""

    def __init__(self, samples: List[Tuple[str, int]], root: str, draw: Optional[CropDraw]):
        self.samples, self.root, self.draw = samples, root, draw

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: SampleKey) -> EncodedSample:
        index, seed, _ = key
        path, target = self.samples[index]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:  # gone or unreadable: the training process finds it so and counts it
            data = b""
        height, width, batched = read_header(data)
        box, flip = (), False
        if self.draw is not None and batched:
            box, flip = self.draw(seed, height, width)
        # torch.frombuffer refuses an empty buffer: one zero byte, which no decoder accepts
        encoded = torch.frombuffer(bytearray(data or b"\0"), dtype=torch.uint8)
        return EncodedSample(encoded, target, index, seed, height, width, batched, box, flip)

    def decode_replacement(self, index: int) -> Tuple[torch.Tensor, int, int]:
        """What the `pytorch` backend trains on when sample `index` is unreadable: the next
        readable sample. -> (uint8 CHW image on the CPU, its target, files found unreadable
        including `index`)."""
        for unreadable in range(1, len(self.samples)):
            path, target = self.samples[(index + unreadable) % len(self.samples)]
            try:
                return read_image_uint8(path), target, unreadable
            except Exception as err:  # corrupt, truncated or not an image
                warnings.warn(f"skipping unreadable image {path}: {err}")
        raise RuntimeError(f"no readable image at all in {self.root}")


class EncodedBatch(NamedTuple):
    """A batch as the DataLoader delivers it: the files' bytes in one tensor (one piece of shared
    memory between the processes rather than one per file), and per-sample metadata."""
    data: torch.Tensor       # every file's bytes, one after the other
    lengths: List[int]
    samples: List[EncodedSample]  # their `data` is None: see `data`


def collate_encoded(samples: Sequence[EncodedSample]) -> EncodedBatch:
    data = torch.cat([s.data for s in samples])
    lengths = [len(s.data) for s in samples]
    # No tensor per sample: each would cross to the trainer as shared memory of its own
    return EncodedBatch(data, lengths, [s._replace(data=None) for s in samples])


# --- what the training process does -------------------------------------------------------------
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


class BatchDecoder:
    """Decodes an EncodedBatch in the training process: the batched decoder's files in one call
    on `device` (only each training crop's region where the decoder can), the rest (and what
    it refuses) on the CPU as the `pytorch` backend does, each counted in `fallbacks` with its
    reason."""

    def __init__(self, dataset: EncodedImages, device: torch.device,
                 val_resize_crop: Tuple[int, int], decode):
        """`val_resize_crop`: validation's (resize, crop), for a dataset without a CropDraw;
        `decode`: the --gpu-decoder (jpeg_decoders.make_decoder)."""
        self.decode = decode
        self.dataset, self.device, self.val_resize_crop = dataset, device, val_resize_crop
        self.draw = dataset.draw
        self.train = self.draw is not None
        # images of the current pass the batched decoder did not decode, by reason
        self.fallbacks: Counter = Counter()

    def __call__(self, batch: EncodedBatch) -> Tuple[List[Decoded], int]:
        """-> (the decoded samples, files found unreadable)."""
        encoded = batch.data.split(batch.lengths)
        batched = [i for i, s in enumerate(batch.samples) if s.batched]
        # the pixels each sample uses, where the decoder decodes regions; whole images otherwise
        cropped = self.decode.crops
        images = iter(self.decode([encoded[i] for i in batched],
                                  [self._used_pixels(batch.samples[i])[0] if cropped else None
                                   for i in batched]))
        decoded, unreadable = [], 0
        for sample, data in zip(batch.samples, encoded):
            image = next(images) if sample.batched else Refused(NOT_PLAIN_JPEG)
            if isinstance(image, Refused):
                self.fallbacks[image.reason] += 1
                image = self._decode_on_cpu(data, sample.index)
                item, skipped = self._place(sample, image)
            elif cropped:  # the decoded pixels are the region the sample uses
                item, skipped = self._as_decoded(sample, image), 0
            else:
                item, skipped = self._place(sample, image)
            unreadable += skipped
            if item is not None:
                decoded.append(item)
        return decoded, unreadable

    def _used_pixels(self, sample: EncodedSample, height: int = 0, width: int = 0
                     ) -> Tuple[Tuple[int, int, int, int], Tuple[float, ...]]:
        """-> (the region of the image the sample resamples, its box inside that region), for
        an image of the header's size (or height x width): training's crop box, validation's
        resize-and-centre-crop."""
        height, width = height or sample.height, width or sample.width
        if self.train:
            _, _, h, w = sample.box
            return sample.box, (0.0, 0.0, float(w), float(h))
        return val_region(height, width, val_box(height, width, *self.val_resize_crop))

    def _as_decoded(self, sample: EncodedSample, region: torch.Tensor) -> Decoded:
        """A sample decoded as its region alone: all of it goes on the canvas."""
        height, width = region.shape[1:]
        _, box = self._used_pixels(sample)
        return Decoded(region, sample.target, (0, 0, height, width), box, sample.flip)

    def _decode_on_cpu(self, data: torch.Tensor, index: int) -> Optional[torch.Tensor]:
        """The `pytorch` backend's decoder (folders.read_image_uint8, on bytes), the image then
        moved to the device (a copy of its own: these are counted); None when it cannot decode
        the file."""
        try:
            image = decode_image(data, mode=ImageReadMode.RGB)
        except Exception as err:  # corrupt, truncated or not an image
            warnings.warn(f"skipping unreadable image {self.dataset.samples[index][0]}: {err}")
            return None
        return image.to(self.device)

    def _place(self, sample: EncodedSample, image: Optional[torch.Tensor]
               ) -> Tuple[Optional[Decoded], int]:
        """Where to cut the decoded image (on the device); an unreadable one replaced
        (training) or dropped (validation). -> (the sample or None, files found unreadable)."""
        target, unreadable = sample.target, 0
        if image is None:
            if not self.train:
                return None, 1
            image, target, unreadable = self.dataset.decode_replacement(sample.index)
            image = image.to(self.device)
        height, width = image.shape[1:]
        if not self.train:
            region, box = self._used_pixels(sample, height, width)
            return Decoded(image, target, region, box, False), unreadable
        region, flip = sample.box, sample.flip
        if unreadable or not sample.batched or (height, width) != (sample.height, sample.width):
            region, flip = self.draw(sample.seed, height, width)  # the worker did not know
        box = (0.0, 0.0, float(region[3]), float(region[2]))
        return Decoded(image, target, region, box, flip), unreadable


class GpuDecodeLoader(SampledLoader):
    """One split: a DataLoader of EncodedBatches, decoded and augmented on the device."""

    def __init__(self, loader: DataLoader, sampler: ShardedSampler, decoder: BatchDecoder,
                 size: int, device: torch.device, channels_last: bool):
        super().__init__(loader, sampler, device, channels_last)
        self.decoder = decoder
        self.size = size  # output size (training: unless the epoch's key says otherwise)
        self.fallbacks = decoder.fallbacks  # this pass's images decoded on the CPU, by reason
        # The pass being read, weakly: a loop that breaks out and drops it ends its thread;
        # close() ends it where something (a traceback) still holds it
        self.batches: Callable[[], Optional[PreparedAhead]] = lambda: None
        # One side stream for the loader's life: the caching allocator keeps freed blocks per
        # stream, so a stream per pass would keep each dead pass's memory reserved
        self.side_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    # Batches decoded ahead of the step, in a thread of their own (prefetch.py); 0: in the
    # training thread, when asked for
    ahead = 2

    def __iter__(self):
        self._end_pass()
        self.skipped = 0
        self.fallbacks.clear()
        crop = self.sampler.crop_of_epoch(self.sampler.epoch) if self.sampler.crop_of_epoch \
            else None
        batches = PreparedAhead(self.loader,
                                lambda batch: self._prepare(batch, crop or self.size),
                                self.device, self.ahead, self.side_stream)
        self.batches = weakref.ref(batches)
        return batches

    def _prepare(self, batch: EncodedBatch, size: int) -> Optional[Tuple[torch.Tensor, ...]]:
        """The device batch of an EncodedBatch: (normalised images, targets); None for a
        validation batch of only unreadable files."""
        samples, unreadable = self.decoder(batch)
        self.skipped += unreadable
        if not samples:
            return None
        # every small host tensor of the batch in one copy (host_batch.py)
        stage = HostBatch(self.device)
        targets = stage.add(torch.tensor([s.target for s in samples], dtype=torch.int64))
        images, sent = resample(samples, size, stage)
        return self.normalize(images), sent[targets]

    def _end_pass(self) -> None:
        batches = self.batches()
        if batches is not None:
            batches.close()  # its thread joined: nothing reads the DataLoader any more

    def close(self) -> None:
        """The pass's thread first (it may be inside the DataLoader's next()), then the
        workers it reads from."""
        self._end_pass()
        super().close()


def build(options: LoaderOptions, shard: Shard, device: torch.device, plan: RunPlan):
    augment, decoding = options.augment, options.own  # own: GpuDecodeOptions
    refuse_unsupported(augment)
    # One decoder per rank, shared by its training and validation loaders (they never decode
    # at once), built as DALI builds its own, and checked on a known JPEG before any worker
    # starts: a decoder that cannot decode on the device is refused here (exit 2).
    settings = DecoderSettings(threads=cores_per_process(shard.local_world_size),
                               batch_size=plan.batch_size, hw_load=decoding.gpu_hw_decoder_load)
    decode = make_decoder(decoding.gpu_decoder, device, settings)
    checked = check_decoder(decode, device)
    if shard.is_main:
        print(f"=> --gpu-decoder {checked}", flush=True)
    workers = loader_workers(options.data.workers, shard.local_world_size)
    start_method = loader_worker_context() if workers > 0 else None
    if start_method is not None:
        ensure_loader_server()  # a no-op when the entry script started it
    train_folder, val_folder = image_folders(options.data.data, augment)
    guard = WorkerGuard(start_method)
    val_resize_crop = val_sizes(augment)

    def make(folder, train: bool) -> GpuDecodeLoader:
        dataset = EncodedImages(folder.samples, folder.root, CropDraw(augment) if train else None)
        subset = shard.train_subset(folder.targets) if train and shard.train_subset else None
        sampler = ShardedSampler(len(dataset), shard.rank, shard.world_size, shuffle=train,
                                 seed=options.seed, subset=subset,
                                 **train_sampling(augment, train))
        # Training drops the last partial batch so every step has the same size on every rank.
        loader = DataLoader(dataset, batch_size=plan.batch_size, sampler=sampler,
                            num_workers=workers, collate_fn=collate_encoded, drop_last=train,
                            persistent_workers=workers > 0, worker_init_fn=guard.worker_init,
                            multiprocessing_context=start_method)
        decoder = BatchDecoder(dataset, device, val_resize_crop, decode)
        size = augment.image_size if train else val_resize_crop[1]
        return GpuDecodeLoader(loader, sampler, decoder, size, device, plan.channels_last)

    return make(train_folder, True), make(val_folder, False), len(train_folder.classes)
