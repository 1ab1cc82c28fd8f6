"""NVIDIA DALI loaders (`--data-backend dali-gpu | dali-cpu`) behind the data factory.

  dali-gpu  decode with nvJPEG (`device="mixed"`), crop / resize / flip on the GPU
  dali-cpu  decode on the CPU, the rest on the GPU
  CPU-only  what dali-cpu becomes on a machine without a GPU: `device_id=None`, every operator
            on the CPU, so the same command runs on a laptop and in CI

The loaders meet the pytorch backend's contract: normalised float32 NCHW on the training device
(channels_last when asked), int64 targets. DALI normalises inside its fused crop/mirror/normalize
operator with the same ImageNet mean and std; for channels_last it writes HWC, which viewed as
NCHW already has channels_last strides, so no copy is needed.

Sharding and order are the pytorch backend's own: `ShardedSampler` (GLOBAL rank and world size,
train shards padded to equal length, val shards exact) picks this rank's files for the epoch, and
the pipeline reads exactly that list, batch by batch. So every rank runs the same number of steps,
validation counts every image once, the epoch order is the same global permutation as with
`--data-backend pytorch` (repeated augmentation included), and a mid-epoch resume starts at the
right file.

Who reads the files: DALI's worker threads. The external source hands the pipeline only each
batch's file *paths* (a few bytes each) and labels; `fn.io.file.read` opens and reads the files
in the pipeline's thread pool, in C++, ahead of the consumer by DALI's prefetch queue. The thread
that runs the training step (which calls the iterator's `__next__`, and so the external source's
callback) never touches an image file: at 256 images per step, reading them there stalled every
step. Why not `fn.readers.file`, as NVIDIA's ConvNets examples do: its file list is fixed when
the pipeline is built, so an epoch's own permutation would mean a new pipeline every epoch (its
`random_shuffle` only shuffles within a buffer of each contiguous `shard_id/num_shards` shard, which
is not the global permutation, and it knows no repeated augmentation, by-class subsets or exact
validation shards). Paths through an external source keep the sampler in charge of the order and
the pipeline warm; `fn.io.file.read` is stateless, so DALI's checkpoints still work.

Each split builds its pipeline once and keeps it for the whole run: every pass only hands the
external source the epoch's file list, so the worker threads, the decoder and the prefetch queue
stay warm between epochs and across validations. A training pass is exactly the batches the
engine's steps take (so `--steps-per-epoch` and `--grad-accum` leave none unread); a pass left
unfinished anyway, or a new progressive-resizing crop size, builds a fresh pipeline.

The pipeline's random state is seeded when it is built, by (seed, epoch, rank), and then runs
on through the epochs. `state_dict()` is DALI's checkpoint of it as of the last batch handed out
(DALI accounts for its prefetching); the engine saves it per rank, so a resumed run draws the
same crops and flips as the uninterrupted one, at an epoch boundary or inside an epoch (with
the same number of ranks). The external source's position is not in DALI's checkpoint: the
sampler's `start_sample` restores it.

DALI stops the whole pipeline on the first file it cannot decode, and has no option to skip one.
So the file lists are checked first, in parallel over the ranks: files too short to be images, of
no image format, or cut off before their end marker (truncated JPEG / PNG) are left out and
counted as `skipped`. A file that passes this check and is still corrupt inside stops the run
with DALI's decoder error, which does not name the file (the bytes come from `fn.io.file.read`,
which, like the external source before it, attaches no file name to them): find it with a full
decode of the rank's files (e.g. PIL), remove it, and continue with --resume auto.
"""
from __future__ import annotations

import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..options import DaliOptions, LoaderOptions
from ..errors import UsageError
from ..machine import cores_per_process
from ..run_plan import RunPlan
from ..runlog import console
from .augment import IMAGENET_MEAN, IMAGENET_STD, val_sizes
from .dali_augment import apply_policy, random_erase
from .folders import image_folders
from .sampling import Shard, ShardedSampler, sample_seed, train_sampling

DALI_PIP_PACKAGE = "nvidia-dali-cuda130"


def import_dali():
    """-> (fn, types, pipeline_def, DALIGenericIterator, LastBatchPolicy), or a UsageError
    that says what to install."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except ImportError as err:
        raise UsageError(f"--data-backend dali-* needs NVIDIA DALI ({err}): pip install "
                         f"{DALI_PIP_PACKAGE} (it also runs CPU-only, without a GPU)") from None
    return fn, types, pipeline_def, DALIGenericIterator, LastBatchPolicy


def random_crop_decode(fn, types, encoded, device: str, hw_decoder_load: float = 0.65):
    """RandomResizedCrop's window (torchvision's scale and aspect-ratio ranges), decoding only
    that window of each JPEG; the resize to the crop size comes after."""
    return fn.decoders.image_random_crop(encoded, device=device, output_type=types.RGB,
                                         random_area=[0.08, 1.0],
                                         random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10,
                                         **mixed_decoder_options(device, hw_decoder_load))


def mixed_decoder_options(device: str, hw_decoder_load: float) -> dict:
    """The GPU ("mixed") decoder's settings: the share of each batch its hardware JPEG decoder
    takes (A100, H100, H200; the CUDA decoder the rest), and chroma upsampled by interpolation
    as libjpeg-turbo does (DALI's CPU decoder, torchvision's): with chroma repeated, DALI's
    default there, crops of 4:2:0 JPEGs differ from libjpeg-turbo's by 6 levels on average
    (measured with nvImageCodec, the library the mixed decoder uses: the GPU tier's decode
    group). The CPU decoder takes neither."""
    if device != "mixed":
        return {}
    return {"hw_decoder_load": hw_decoder_load, "jpeg_fancy_upsampling": True}


def dali_placement(backend: str, device: torch.device) -> Tuple[str, str, Optional[int]]:
    """-> (decoder device, augmentation device, DALI device_id) for the backend and device."""
    if device.type == "cuda":
        decoder = "mixed" if backend == "dali-gpu" else "cpu"
        return decoder, "gpu", device.index
    if backend == "dali-gpu":
        raise UsageError("--data-backend dali-gpu decodes on a GPU and none is in use here: use "
                         "--data-backend dali-cpu (on a machine without a GPU it runs every "
                         "operator on the CPU)")
    return "cpu", "cpu", None


# --- checking files before DALI sees them --------------------------------------------------------
_MAGIC = {
    b"\xff\xd8\xff": b"\xff\xd9",  # JPEG: SOI ... EOI
    b"\x89PNG\r\n\x1a\n": b"IEND",  # PNG: signature ... IEND chunk
}
_TAIL_BYTES = 1024  # JPEGs written by some cameras carry a few bytes after their EOI marker


def looks_complete(path: str) -> bool:
    """Cheap check (no decoding): a JPEG or PNG with its end marker near the end of the file."""
    try:
        size = os.path.getsize(path)
        if size < 64:
            return False
        with open(path, "rb") as f:
            head = f.read(8)
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return False
    return any(head.startswith(magic) and end in tail for magic, end in _MAGIC.items())


def find_damaged(paths: Sequence[str], shard: Shard, threads: int) -> List[int]:
    """Indices of files that fail `looks_complete`; each rank checks 1/world of them."""
    mine = range(shard.rank, len(paths), shard.world_size)
    with ThreadPoolExecutor(max(1, threads)) as pool:  # I/O bound: threads overlap the reads
        ok = list(pool.map(lambda i: looks_complete(paths[i]), mine))
    damaged = [i for i, good in zip(mine, ok) if not good]
    return sorted(i for part in shard.gather(damaged) for i in part)


# --- the loader ----------------------------------------------------------------------------------
class DaliLoader:
    """One split: one DALI pipeline for the run, fed this rank's files of each pass."""

    def __init__(self, samples: List[Tuple[str, int]], damaged: int, train: bool,
                 options: LoaderOptions, plan: RunPlan, shard: Shard, device: torch.device,
                 threads: int):
        self.fn, self.types, self.pipeline_def, self.Iterator, self.LastBatchPolicy = (
            import_dali())
        self.samples, self.train, self.device = samples, train, device
        self.augment, self.steps_per_epoch = options.augment, options.steps_per_epoch
        # dali-gpu's own section; dali-cpu has none, and its CPU decoder takes no such setting
        own = options.own or DaliOptions()
        self.hw_decoder_load = own.dali_hw_decoder_load
        self.decoder, self.augment_device, self.device_id = dali_placement(options.backend, device)
        self.rank, world = shard.rank, shard.world_size
        self.batch_size, self.threads, self.epoch = plan.batch_size, threads, 0
        self.grad_accum = plan.grad_accum
        self.seed = options.seed
        # --split by-class (parameter server): this worker's classes only
        subset = (shard.train_subset([label for _, label in samples])
                  if train and shard.train_subset else None)
        self.sampler = ShardedSampler(len(samples), self.rank, world, shuffle=train,
                                      seed=self.seed, subset=subset,
                                      **train_sampling(options.augment, train))
        self.channels_last = plan.channels_last
        self.num_samples = len(self.sampler)
        # Files left out are counted once, by rank 0 (the engine sums `skipped` over ranks).
        self.left_out = damaged if self.rank == 0 else 0
        self.skipped = 0
        self._batches = None     # the running DALI iterator, built on the first pass
        self._built_crop = None  # the training crop size its graph was built for
        self._expected = self._delivered = 0  # batches in the last pass, and handed out
        self._ended = True       # whether DALI has signalled the end of the last pass
        self._feed: Iterator = iter(())  # the current pass's batches of (paths, labels)
        self._resume_from: Optional[dict] = None  # a saved random state for the next build

    def set_epoch(self, epoch: int, start_sample: int = 0) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch, start_sample)

    def __len__(self) -> int:
        if not self.train:
            return math.ceil(len(self.sampler) / self.batch_size)
        # Training: the micro-batches the engine's steps take (full batches, as drop_last; whole
        # --grad-accum steps; at most --steps-per-epoch), less those a resumed epoch has done.
        # So every pass runs to its end, and the pipeline carries on into the next one.
        accum = max(self.grad_accum, 1)
        batches = math.ceil(self.sampler.size / self.sampler.world) // self.batch_size
        batches -= batches % accum
        if self.steps_per_epoch:
            batches = min(batches, self.steps_per_epoch * accum)
        done = self.sampler.start // (self.batch_size * self.sampler.world)
        return max(batches - done, 0)

    def files_for_pass(self) -> Tuple[List[str], List[int]]:
        """This rank's files and labels for the current epoch, in reading order."""
        picked = [self.samples[key.index] for key in self.sampler]
        return [path for path, _ in picked], [label for _, label in picked]

    def _path_batches(self, files: List[str], labels: List[int]) -> Iterator[tuple]:
        """The pass's batches as DALI's external source takes them: file paths (UTF-8 bytes,
        which `fn.io.file.read` reads in DALI's threads) and labels, in reading order. No file
        is opened here. Training yields full batches only (like drop_last)."""
        stop = len(self) * self.batch_size if self.train else len(files)
        for start in range(0, stop, self.batch_size):
            chunk = range(start, min(start + self.batch_size, stop))
            yield ([np.frombuffer(os.fsencode(files[i]), dtype=np.uint8) for i in chunk],
                   [np.array([labels[i]], dtype=np.int32) for i in chunk])

    def _next_batch(self) -> tuple:
        """DALI's external source: the pass's next batch; StopIteration ends the pass."""
        return next(self._feed)

    def pipeline(self):
        """The DALI pipeline of this split: the external source's files read, decoded and
        augmented, all in DALI's threads."""
        fn, types, augment = self.fn, self.types, self.augment
        size = self._crop() or augment.image_size
        val_resize, val_crop = val_sizes(augment)
        seed = sample_seed(self.seed, self.epoch, self.rank) % (2 ** 31)  # per rank

        def graph():
            paths, targets = fn.external_source(source=self._next_batch, num_outputs=2,
                                                batch=True, dtype=[types.UINT8, types.INT32])
            encoded = fn.io.file.read(paths)  # in the pipeline's thread pool
            if self.train:
                images = random_crop_decode(fn, types, encoded, self.decoder,
                                            self.hw_decoder_load)
                images = self._to_augment_device(images)
                images = fn.resize(images, resize_x=size, resize_y=size)
                flip_or_crop = {"mirror": fn.random.coin_flip(probability=0.5)}
                images = apply_policy(images, augment, size)
            else:
                images = fn.decoders.image(encoded, device=self.decoder, output_type=types.RGB,
                                           **mixed_decoder_options(self.decoder,
                                                                   self.hw_decoder_load))
                images = self._to_augment_device(images)
                images = fn.resize(images, resize_shorter=val_resize)
                flip_or_crop = {"crop": (val_crop, val_crop)}  # centre crop
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="HWC" if self.channels_last else "CHW",
                mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD],
                **flip_or_crop)
            if self.train and augment.random_erase > 0:
                images = random_erase(images, augment.random_erase, fn, types)
            return images, targets

        saved, self._resume_from = self._resume_from, None
        # A saved state belongs to a graph of the same crop size: after progressive resizing
        # changes it, the uninterrupted run also started a fresh pipeline.
        checkpoint = (bytes(saved["dali"].numpy().tobytes())
                      if saved is not None and saved["crop"] == (self._crop() or 0) else None)
        # Conditionals: the auto-augment policies choose an operation per sample with `if`s.
        return self.pipeline_def(graph, enable_conditionals=True, batch_size=self.batch_size,
                                 num_threads=self.threads, device_id=self.device_id, seed=seed,
                                 enable_checkpointing=True, checkpoint=checkpoint)()

    def state_dict(self) -> Optional[dict]:
        """The pipeline's random state after the last batch handed out (DALI's checkpoint, as
        uint8 so that weights_only checkpoints load it) and the crop size of its graph; None
        before the first pass."""
        if self._batches is None:
            return self._resume_from
        checkpoint = self._batches.checkpoints()[0]
        data = checkpoint.encode() if isinstance(checkpoint, str) else checkpoint
        return {"dali": torch.frombuffer(bytearray(data), dtype=torch.uint8),
                "crop": self._built_crop or 0}

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Start the next pipeline from a saved random state (before the first pass)."""
        self._resume_from = state

    def _to_augment_device(self, images):
        return images.gpu() if self.decoder == "cpu" and self.augment_device == "gpu" else images

    def _crop(self) -> Optional[int]:
        return self.sampler.crop_of_epoch(self.epoch) if self.sampler.crop_of_epoch else None

    def _start_pass(self, files: List[str], labels: List[int]):
        """The DALI iterator, ready to run the pass over `files`."""
        if (self._batches is not None and self._delivered == self._expected
                and self._crop() == self._built_crop):
            if not self._ended:
                # The consumer took every batch but did not ask for one more, so DALI has not
                # reported the end of the pass yet: it has nothing left to deliver.
                for _ in self._batches:
                    raise RuntimeError("the DALI pipeline delivered more batches than the pass "
                                       "had")
            self._feed = self._path_batches(files, labels)
            self._batches.reset()  # the same pipeline, now reading the new pass
            return self._batches
        # First pass, a pass left unfinished (its prefetched batches would leak into this
        # one), or progressive resizing's new crop size (part of the graph): a new pipeline.
        self._batches = None
        self._feed = self._path_batches(files, labels)
        self._built_crop = self._crop()
        # prepare_first_batch=False: nothing is read before the pass is asked for, so the
        # pipeline never prefetches from a list before the epoch's own is in place.
        with warnings.catch_warnings():
            # Building the pipeline (the iterator does), DALI warns that it cannot checkpoint
            # the external source's position: the sampler (set_epoch's start_sample) restores it.
            warnings.filterwarnings("ignore", message="Checkpointing enabled in a pipeline "
                                    "with external source")
            self._batches = self.Iterator([self.pipeline()], ["images", "targets"],
                                          last_batch_policy=self.LastBatchPolicy.PARTIAL,
                                          prepare_first_batch=False)
        return self._batches

    def __iter__(self):
        self.skipped = self.left_out
        files, labels = self.files_for_pass()
        if not files:  # more ranks than validation images
            return
        batches = self._start_pass(files, labels)
        self._expected = len(self)
        self._delivered, self._ended = 0, False
        for batch in batches:
            images, targets = batch[0]["images"], batch[0]["targets"]
            if self.channels_last:
                images = images.permute(0, 3, 1, 2)  # NHWC memory seen as NCHW: channels_last
            images = images.to(self.device, non_blocking=True)
            targets = targets.squeeze(-1).to(self.device, dtype=torch.int64, non_blocking=True)
            self._delivered += 1
            yield images, targets
        self._ended = True

    @property
    def workers(self) -> int:
        """What -j set here: DALI's threads."""
        return self.threads

    def close(self) -> None:
        self._batches = None  # releases the pipeline and its threads


def build(options: LoaderOptions, shard: Shard, device: torch.device, plan: RunPlan):
    import_dali()
    dali_placement(options.backend, device)  # fail early on dali-gpu without a GPU
    train_set, val_set = image_folders(options.data.data, options.augment)
    requested = options.data.workers
    threads = requested if requested > 0 else cores_per_process(shard.local_world_size)
    loaders = []
    for dataset, train in ((train_set, True), (val_set, False)):
        damaged = set(find_damaged([path for path, _ in dataset.samples], shard, threads))
        samples = [s for i, s in enumerate(dataset.samples) if i not in damaged]
        if shard.is_main and damaged:
            console(f"note: {len(damaged)} file(s) under {dataset.root} are not complete "
                    f"JPEG/PNG images and are left out, e.g. {dataset.samples[min(damaged)][0]}")
        loaders.append(DaliLoader(samples, len(damaged), train, options, plan, shard, device,
                                  threads))
    return loaders[0], loaders[1], len(train_set.classes)
