"""The data options: where the images are and how they are loaded, and the options of each
--data-backend that only it reads (the registry entry of a backend names its section)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import UsageError
from ..registry import DATA_BACKENDS, GPU_DECODERS
from .fields import DATA, POSITIVE, Bound, Section, opt


def selected_backend(dummy: bool, data_backend: str) -> str:
    """The --data-backend a run uses: --dummy is the synthetic one, whatever else is given."""
    return "synthetic" if dummy else data_backend


@dataclass(frozen=True)
class DataOptions(Section):
    data: Optional[str] = field(default=None, metadata=opt(
        DATA, "data", help="dataset root with train/ and val/ ImageFolder trees "
                           "(not needed with --dummy / --data-backend synthetic)", nargs="?"))
    data_backend: str = field(default="pytorch", metadata=opt(
        DATA, "--data-backend", help="data loader", choices=tuple(DATA_BACKENDS), evaluation=True))
    dummy: bool = field(default=False, metadata=opt(
        DATA, "--dummy", help="use synthetic data (same as --data-backend synthetic)",
        evaluation=True))
    workers: int = field(default=-1, metadata=opt(
        DATA, "-j", "--workers",
        help="data loading workers per process (-1: derived from the cores)"))
    @property
    def backend(self) -> str:
        return selected_backend(self.dummy, self.data_backend)

    @classmethod
    def rules(cls, values) -> None:
        if selected_backend(values.dummy, values.data_backend) != "synthetic" and not values.data:
            raise UsageError("the dataset path is missing: pass DATA (a folder with train/ and "
                             "val/), or use --dummy for synthetic data")


@dataclass(frozen=True)
class SyntheticOptions(Section):
    """--data-backend synthetic (and --dummy): the made-up dataset's size."""
    synthetic_train_size: int = field(default=1_281_167, metadata=opt(
        DATA, "--synthetic-train-size", help="images per epoch of the synthetic backend",
        bound=POSITIVE))
    synthetic_val_size: int = field(default=50_000, metadata=opt(
        DATA, "--synthetic-val-size", help="validation images of the synthetic backend",
        evaluation=True, bound=POSITIVE))
    synthetic_classes: int = field(default=1000, metadata=opt(
        DATA, "--synthetic-classes", help="classes of the synthetic backend", evaluation=True,
        bound=POSITIVE))


_SHARE = Bound(low=0, high=1, says="is a share of each batch, in [0, 1]")


@dataclass(frozen=True)
class GpuDecodeOptions(Section):
    """--data-backend gpu: which library decodes the JPEGs on the GPU."""
    gpu_decoder: str = field(default="torchcodec", metadata=opt(
        DATA, "--gpu-decoder", choices=tuple(GPU_DECODERS),
        help="--data-backend gpu's JPEG decoder: torchcodec (nvJPEG's CUDA decoder, whole "
             "images), nvimgcodec (nvImageCodec: only each crop's region, with the GPU's hardware "
             "JPEG decoder where it has one; nvimgcodec-whole: whole images, where regions fail)"))
    gpu_hw_decoder_load: float = field(default=0.65, metadata=opt(
        DATA, "--gpu-hw-decoder-load", help="--gpu-decoder nvimgcodec: as --dali-hw-decoder-load",
        bound=_SHARE))


@dataclass(frozen=True)
class DaliOptions(Section):
    """--data-backend dali-gpu: how DALI's mixed decoder splits each batch."""
    dali_hw_decoder_load: float = field(default=0.65, metadata=opt(
        DATA, "--dali-hw-decoder-load",
        help="--data-backend dali-gpu: the share of each batch that the GPU's hardware JPEG "
             "decoder takes (A100, H100, H200), the CUDA decoder the rest (DALI's own "
             "default); DALI's threads are -j", bound=_SHARE))


# The sections a data backend's registry entry may name (DataBackend.options).
BACKEND_SECTIONS = {"synthetic": SyntheticOptions, "gpu_decode": GpuDecodeOptions,
                    "dali": DaliOptions}
