"""ImageNet-style ImageFolder trees (`DIR/{train,val}/<class>/<image>`), read as uint8 tensors.

Shared by the `pytorch` backend (which decodes with torchvision) and the DALI backends (which
take the file lists and decode themselves).
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torchvision
from torchvision.io import ImageReadMode, decode_image

from torchvision.transforms import v2

from ..options import AugmentOptions
from ..errors import UsageError
from .augment import train_transform, val_transform
from .batch_memory import BatchSlots, Tag, fresh_batch
from .jpeg_decoders import NVIMGCODEC_PIP, CropRegionReader


def read_image_uint8(path: str) -> torch.Tensor:
    """Decode a file to uint8 CHW RGB (grayscale and CMYK are converted)."""
    return decode_image(torchvision.io.read_file(path), mode=ImageReadMode.RGB)


class ImageFolderUint8(torchvision.datasets.ImageFolder):
    """ImageFolder whose samples are uint8 tensors, keyed by `SampleKey`s (index, augmentation
    seed, crop size).

    With `decode_regions` (training, where nvImageCodec is installed) a JPEG's RandomResizedCrop
    decodes only the crop's region (jpeg_decoders.CropRegionReader): the same pixels, fewer
    decoded. A file that cannot be decoded never raises in a worker (that would kill this rank
    and leave the others waiting). Training replaces it with the next readable sample, so every
    batch keeps its size and every rank its step count; validation drops it (returns None), so
    no image is counted twice. Either way the collate function counts it.
    """

    def __init__(self, root: str, make_transform: Callable[[Optional[int]], Callable],
                 replace_unreadable: bool, decode_regions: bool = False):
        """`make_transform(crop)`: the transform for a key's crop size (None: the default);
        `decode_regions`: its first step is a RandomResizedCrop whose region alone may be
        decoded."""
        super().__init__(root, loader=read_image_uint8)
        self.make_transform = make_transform
        self.replace_unreadable = replace_unreadable
        self.decode_regions = decode_regions and CropRegionReader.available()
        self._cache_transforms()

    def _cache_transforms(self) -> None:
        # One transform per crop size (progressive resizing changes it between epochs).
        self.transform_for = functools.lru_cache(maxsize=None)(self.make_transform)
        self.region_reader = None  # made on first use, in the process that reads

    def __getstate__(self) -> dict:
        # Loader workers receive the dataset pickled (they start from a fork server, see
        # pytorch.py); the cache of built transforms and the region decoder are rebuilt there,
        # not sent.
        state = dict(self.__dict__)
        del state["transform_for"], state["region_reader"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache_transforms()

    def __getitem__(self, key):
        index, seed, crop = key
        reader = self._region_reader()  # outside the per-file handler: not a file's fault
        for unreadable in range(len(self.samples)):
            path, target = self.samples[(index + unreadable) % len(self.samples)]
            try:
                # Per-sample augmentation randomness (see the module docstring); default_generator
                # rather than torch.manual_seed, which also reseeds every CUDA device and costs
                # ~100x more. fork_rng restores the CPU RNG for a loader in the main process.
                transform = self.transform_for(crop)
                with torch.random.fork_rng(devices=[]):
                    torch.random.default_generator.manual_seed(seed)
                    image = self._region_transformed(reader, path, transform)
                    if image is not None:
                        return image, target, unreadable
                    torch.random.default_generator.manual_seed(seed)  # the box drawn again
                    return transform(self.loader(path)), target, unreadable
            except Exception as err:  # corrupt, truncated or not an image
                warnings.warn(f"skipping unreadable image {path}: {err}")
                if not self.replace_unreadable:
                    return None
        raise RuntimeError(f"no readable image at all in {self.root}")


    def _region_reader(self) -> Optional[CropRegionReader]:
        """This process's region reader, made on first use (once per loader worker); None
        where regions are not decoded, or where it cannot be made: then whole images, with one
        warning (e.g. a worker where nvImageCodec imports but its library fails to start)."""
        if not self.decode_regions:
            return None
        if self.region_reader is None:
            try:
                self.region_reader = CropRegionReader()
            except Exception as err:
                self.decode_regions = False
                warnings.warn(f"the region reader (nvImageCodec) could not be made here "
                              f"({type(err).__name__}: {err}): this process decodes whole "
                              "images (the same samples, more pixels decoded)")
                return None
        return self.region_reader

    def _region_transformed(self, reader: Optional[CropRegionReader], path: str, transform
                            ) -> Optional[torch.Tensor]:
        """The sample with only its crop's region decoded, or None (decode it whole)."""
        if reader is None:
            return None
        crop, *rest = transform.transforms
        assert isinstance(crop, v2.RandomResizedCrop), "training transforms start with the crop"
        cropped = reader(torchvision.io.read_file(path), crop)
        if cropped is None:
            return None
        for step in rest:  # the flip, the policy, erasing: in the order the Compose has them
            cropped = step(cropped)
        return cropped


class UInt8Batch(NamedTuple):
    """A batch as a loader worker hands it over."""
    images: torch.Tensor  # uint8 NCHW
    targets: torch.Tensor  # int64
    skipped: int  # unreadable files met for this batch
    tag: Tag = None  # the slot its memory comes from (batch_memory.py): released once read


def collate_uint8(batch: Sequence, slots: Optional[BatchSlots] = None) -> UInt8Batch:
    """The samples of a batch as one (`slots`: in a loader worker, written into the memory of
    a slot the training process has released; batch_memory.py)."""
    good = [b for b in batch if b is not None]
    skipped = (len(batch) - len(good)) + sum(unreadable for _, _, unreadable in good)
    if not good:
        return UInt8Batch(torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64),
                          skipped)
    images, tag = stack_images([img for img, _, _ in good], slots)
    targets = torch.tensor([t for _, t, _ in good], dtype=torch.int64)
    return UInt8Batch(images, targets, skipped, tag)


def stack_images(images: Sequence[torch.Tensor], slots: Optional[BatchSlots] = None
                 ) -> Tuple[torch.Tensor, Tag]:
    """Same-sized uint8 CHW images as one NCHW batch, copied once; and the tag of its slot.

    In a loader worker the batch is written straight into shared memory: a released slot's
    (batch_memory.py), else a fresh segment, as DataLoader's own default_collate does. Handing
    it to the training process then copies nothing more (stacked into private memory, pickling
    copies it again, about 7 % of a worker's time). Samples laid out channels-last (training
    crops: the region is decoded HWC and resized as it is) are stacked channels-last, a plain
    copy; stacking them planar is a transposing copy, 4x slower here. The values are the same
    either way; the device's normaliser makes the layout the model asked for."""
    channels_last = all(image.permute(1, 2, 0).is_contiguous() for image in images)
    parts = [image.permute(1, 2, 0) for image in images] if channels_last else list(images)
    out, tag = _batch_memory((len(parts), *parts[0].shape), parts[0].dtype, slots)
    torch.stack(parts, out=out)
    return (out.permute(0, 3, 1, 2) if channels_last else out), tag


def _batch_memory(shape: Tuple[int, ...], dtype: torch.dtype, slots: Optional[BatchSlots]
                  ) -> Tuple[torch.Tensor, Tag]:
    """An empty tensor for a batch: shared memory in a loader worker, private elsewhere."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype), None
    if slots is not None:
        return slots.batch(shape, dtype)
    return fresh_batch(shape, dtype), None


_told_whole_decoding = False  # the line below, once per process


def say_if_whole_decoding(train_set: ImageFolderUint8) -> None:
    """One line, once, when training decodes whole images because nvImageCodec is missing."""
    global _told_whole_decoding
    if train_set.decode_regions or _told_whole_decoding:
        return
    _told_whole_decoding = True
    print(f"note: nvImageCodec is not installed: the loader workers decode whole images "
          f"instead of each crop's region (the same samples, about 1.2x slower per worker); "
          f"{NVIMGCODEC_PIP}", flush=True)


IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
PREPARE_VAL = "data/prepare_imagenet_val.py"


def _image_folder(root: Path, make_transform, replace_unreadable: bool,
                  decode_regions: bool = False) -> ImageFolderUint8:
    if not root.is_dir():
        raise UsageError(f"{root} is missing: the dataset folder needs train/ and val/, each "
                         "with one sub-folder of images per class (ImageNet's layout)")
    loose = [p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if loose:
        # The most common ImageNet mistake: ILSVRC2012_img_val.tar extracts flat.
        raise UsageError(
            f"{root} holds {len(loose)} images directly (e.g. {sorted(loose)[0]}) instead of one "
            "sub-folder per class; ImageNet's validation archive extracts like this. Sort them "
            f"into class folders with: python {PREPARE_VAL} {root} --labels <devkit, "
            "LOC_val_solution.csv or a labels file> (see its --help)")
    try:
        return ImageFolderUint8(str(root), make_transform, replace_unreadable, decode_regions)
    except (FileNotFoundError, RuntimeError) as err:
        raise UsageError(f"{root}: {err}. Expected one sub-folder per class holding images "
                         "(a small example: python data/make_synthetic.py DIR)") from None


def image_folders(data: str, augment: AugmentOptions
                  ) -> Tuple[ImageFolderUint8, ImageFolderUint8]:
    """The train/ and val/ ImageFolders of `data` (--data), checked: both exist, no class folder
    is empty, and both have the same classes (so label i means the same class in both)."""
    root = Path(data)
    if root.is_file():
        raise UsageError(f"data folder {root} is a file, not a folder: pass the folder that "
                         "holds train/ and val/ (extract an archive first)")
    if not root.is_dir():
        raise UsageError(f"data folder {root} does not exist")
    train_set = _image_folder(root / "train", functools.partial(train_transform, augment), True,
                              decode_regions=True)
    val_set = _image_folder(root / "val", functools.partial(val_transform, augment), False)
    if val_set.classes != train_set.classes:
        missing = sorted(set(train_set.classes) ^ set(val_set.classes))[:5]
        raise UsageError(f"{root}: val/ and train/ class folders differ (e.g. {missing})")
    return train_set, val_set


