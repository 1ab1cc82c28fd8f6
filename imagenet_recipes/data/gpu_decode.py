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

The crop and resize on the device: gpu_resample.py.

Not done here: --auto-augment and --random-erase (refused, with the backends that have them).
"""
from __future__ import annotations

import io
import warnings
import weakref
from collections import Counter
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from ..options import AugmentOptions, LoaderOptions
from ..errors import UsageError
from ..machine import cores_per_process
from ..run_plan import RunPlan
from .augment import train_transform, val_sizes
from .folders import image_folders, read_image_uint8
from .gpu_resample import Decoded, resample, val_box, val_region
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
