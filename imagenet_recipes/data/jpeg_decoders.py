"""The batched JPEG decoders of `--data-backend gpu` (--gpu-decoder), behind one call:

    decoder(files, regions) -> per file, a uint8 CHW image on the device, or Refused(reason)

where `regions` gives, per file, the (top, left, height, width) of the pixels that will be used,
or None for the whole image. A decoder with `crops = True` returns just those pixels; the
others return whole images and leave the cutting to the caller. A file a decoder refuses is
decoded by torchvision on the CPU by the caller, which counts it with its reason (the progress
line, the JSONL log): a "GPU decoding" run never decodes on the CPU unseen. What is not a
file's fault (out of memory, a CUDA error, a decoder that decodes nothing) is raised, never
turned into CPU decoding, nor is a batch of which the decoder decoded no file (DecodedNothing);
decoder_check.py refuses at start a decoder that cannot decode a known JPEG on the run's device.

    torchcodec  TorchCodec's decode_jpeg: nvJPEG's CUDA decoder on a GPU, libjpeg-turbo on the
                CPU; whole images. Each call ends with a host synchronisation on the calling
                thread's current stream (its DecodeJpegCuda.cpp). Its nvJPEG handle is made
                with nvJPEG's default flags (TorchCodec 0.17), so on a GPU the chroma is
                repeated, not interpolated: its pixels differ from libjpeg-turbo's by several
                levels (6.2 on average measured for repeated chroma on a CPU), which the GPU
                tier measures and reports rather than bounds. No setting of TorchCodec changes
                it.
    nvimgcodec  NVIDIA nvImageCodec, the library DALI decodes with: one batched call, only each
                training crop's region decoded (`CodeStream.get_sub_code_stream(region=...)`:
                the blocks outside it are entropy-decoded and skipped, never transformed). On a
                GPU its hardware JPEG decoder (A100, H100, H200) takes --gpu-hw-decoder-load of
                each batch and the CUDA decoders the rest, with chroma interpolated ("fancy"
                upsampling, libjpeg-turbo's default), built as DALI builds its decoder (CPU
                threads from the rank's share of the cores, buffers preallocated for the batch
                size); the output is read through `__cuda_array_interface__`, no copy. It has no
                CPU backend on a GPU run: what its GPU decoders refuse comes back refused.
                Without a GPU: libjpeg-turbo on the CPU, through the same calls (a decoder made
                with NVIMGCODEC_DEVICE_CPU_ONLY and the CPU backend alone; the default device
                fails there with "CUDA Runtime failure #35"), so the CPU runs this path for
                real; its pixels are libjpeg-turbo's exactly, regions included.
    nvimgcodec-whole
                nvImageCodec decoding whole images, cropped on the device as TorchCodec's are:
                the way round for an nvImageCodec whose region decoding is refused or broken
                (nvJPEG older than 13.2 refuses regions with interpolated chroma; nvImageCodec
                0.9's region batches crash on some GPUs, its issue #55), so the hardware
                decoder still decodes. Asked for by name, never chosen silently.

The hardware decoder writes its output when the call is made, not in the order of the stream
it is given (torchcodec#1634, pytorch/vision#9606: corrupted images on an H100): the nvImageCodec
decoder on a GPU waits for its stream's earlier work before each call, so no buffer it writes
into is still being read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from ..errors import UsageError
from ..registry import GPU_DECODERS
TORCHCODEC_PIP = "pip install torchcodec"
NVIMGCODEC_PIP = "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'"
# The hardware decoder's share of each batch: DALI's own default for its mixed decoder
# (hw_decoder_load 0.65 in nvidia.dali.fn.decoders.image since DALI 2.2); the CUDA decoder takes
# the rest. --gpu-hw-decoder-load sets it.
HW_LOAD = 0.65

Region = Tuple[int, int, int, int]  # (top, left, height, width)


class DecodedNothing(RuntimeError):
    """The decoder decoded none of the files of a batch: not one file's fault (a library, a
    device or a setting that does not work), so raised rather than decoded on the CPU."""


class Refused(NamedTuple):
    """A file the decoder did not decode, and why (decoded on the CPU by the caller)."""
    reason: str


Decoded = Union[torch.Tensor, Refused]


@dataclass(frozen=True)
class DecoderSettings:
    """How a decoder is built, as DALI builds its own: `threads` CPU threads (the rank's share of
    the cores: with 8 ranks on 16 cores, 2 each, not every core for each of them), buffers for
    `batch_size` images, the hardware decoder's share `hw_load` of each batch."""
    threads: int = 1
    batch_size: int = 1
    hw_load: float = HW_LOAD


def import_nvimgcodec():
    """nvidia.nvimgcodec (import_module, not `from nvidia import`: that finds the attribute an
    earlier import left on the namespace package even where the module is blocked)."""
    import importlib

    return importlib.import_module("nvidia.nvimgcodec")


def make_decoder(name: str, device: torch.device, settings: DecoderSettings = DecoderSettings()):
    """The --gpu-decoder `name` for a run on `device`, or a UsageError saying what to install."""
    if GPU_DECODERS[name].module == "torchcodec":
        return TorchCodecDecoder(device, settings)
    return NvImageCodecDecoder(device, settings, regions=GPU_DECODERS[name].regions)


def is_device_failure(err: BaseException) -> bool:
    """An error that is not one file's fault: out of memory or a CUDA error (the device, the
    driver or a kernel failed). These are raised; a file's own error is a refusal."""
    accelerator_error = getattr(torch, "AcceleratorError", ())  # torch >= 2.8
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)) or (
            accelerator_error and isinstance(err, accelerator_error)):
        return True
    text = str(err)
    # nvJPEG's statuses that are not about the bitstream (nvjpeg.h): 5 allocator failure,
    # 6 execution failed, 7 architecture mismatch, 8 internal error; and the CUDA runtime's own
    return any(mark in text for mark in ("CUDA error", "out of memory", "status: 5",
                                         "status: 6", "status: 7", "status: 8"))


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


class TorchCodecDecoder:
    crops = False
    name = "torchcodec"

    def __init__(self, device: torch.device, settings: DecoderSettings = DecoderSettings()):
        try:
            from torchcodec.decoders import decode_jpeg
        except (ImportError, OSError, RuntimeError) as err:  # missing, or its libraries fail
            raise UsageError(f"--gpu-decoder torchcodec cannot import TorchCodec ({err}): "
                             f"{TORCHCODEC_PIP} (a version that supports this torch, "
                             f"{torch.__version__}; see TorchCodec's compatibility table)"
                             ) from None
        self.decode_jpeg = decode_jpeg
        # nvJPEG on the run's GPU; libjpeg-turbo on a CPU run. TorchCodec takes no thread count
        # or preallocation: `settings` does not apply.
        self.device = device if device.type == "cuda" else torch.device("cpu")

    def __call__(self, files: Sequence[torch.Tensor], regions: Sequence[Optional[Region]]
                 ) -> List[Decoded]:
        """One call for the batch; if a file fails it, one call per file, to find those it
        refuses. A device failure is raised, as is a batch whose every file fails alone."""
        if not files:
            return []
        try:
            return list(self.decode_jpeg(list(files), device=self.device))
        except Exception as err:  # one bad file fails the whole call
            if is_device_failure(err):
                raise
        images: List[Decoded] = []
        for data in files:
            try:
                images.append(self.decode_jpeg(data, device=self.device))
            except Exception as err:
                if is_device_failure(err):
                    raise
                images.append(Refused(f"torchcodec: {first_line(err)}"))
        if len(images) > 1 and all(isinstance(image, Refused) for image in images):
            raise DecodedNothing(f"TorchCodec decoded none of the {len(images)} JPEGs of a "
                                 f"batch on {self.device} ({images[0].reason}): not one "
                                 "file's fault")
        return images


class NvImageCodecDecoder:
    def __init__(self, device: torch.device, settings: DecoderSettings = DecoderSettings(),
                 fancy_upsampling: bool = True, regions: bool = True):
        """fancy_upsampling False: chroma repeated, not interpolated (DALI's default); for
        measuring what the interpolation buys (the GPU tier's decode group). regions False:
        whole images (nvimgcodec-whole), the caller crops."""
        self.crops = regions
        self.name = "nvimgcodec" if regions else "nvimgcodec-whole"
        try:
            nvimgcodec = import_nvimgcodec()
        except (ImportError, OSError, RuntimeError) as err:
            raise UsageError(f"--gpu-decoder {self.name} cannot import nvImageCodec ({err}): "
                             f"{NVIMGCODEC_PIP}") from None
        self.nvimgcodec, self.device = nvimgcodec, device
        kind = nvimgcodec.BackendKind
        # fancy_upsampling=1: interpolated chroma, as libjpeg-turbo (the CPU decoders) does
        options = [f":fancy_upsampling={int(fancy_upsampling)}"]
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            # DALI's own decoder options (its image_decoder.h): the CUDA decoder's buffers made
            # at once, the hardware decoder's for the batch size
            options += ["nvjpeg_cuda_decoder:preallocate_buffers=1",
                        f"nvjpeg_hw_decoder:preallocate_batch_size={max(1, settings.batch_size)}"]
            self.decoder = nvimgcodec.Decoder(
                device_id=index, max_num_cpu_threads=max(1, settings.threads),
                options=" ".join(options),
                # no CPU backend: what the GPU's decoders refuse comes back refused, counted
                backends=[nvimgcodec.Backend(kind.HW_GPU_ONLY, load_hint=settings.hw_load),
                          nvimgcodec.Backend(kind.GPU_ONLY),
                          nvimgcodec.Backend(kind.HYBRID_CPU_GPU)])
        else:
            self.decoder = nvimgcodec.Decoder(
                device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                max_num_cpu_threads=max(1, settings.threads), options=" ".join(options),
                backends=[nvimgcodec.Backend(kind.CPU_ONLY)])

    def __call__(self, files: Sequence[torch.Tensor], regions: Sequence[Optional[Region]]
                 ) -> List[Decoded]:
        if not files:
            return []
        codec = self.nvimgcodec
        streams = []
        for data, region in zip(files, regions):
            stream = codec.CodeStream(data.numpy())
            if region is not None and self.crops:
                top, left, height, width = region
                stream = stream.get_sub_code_stream(
                    region=codec.Region(top, left, top + height, left + width))
            streams.append(stream)
        if self.device.type == "cuda":
            cuda_stream = torch.cuda.current_stream(self.device)
            cuda_stream.synchronize()  # the hardware decoder ignores stream order (docstring)
            images = self.decoder.decode(streams, cuda_stream=cuda_stream.cuda_stream)
            # HWC uint8 on the device, no copy; CHW is a view of it
            as_tensor = lambda image: torch.as_tensor(image, device=self.device)  # noqa: E731
        else:
            import numpy as np

            images = self.decoder.decode(streams)
            as_tensor = lambda image: torch.from_numpy(np.asarray(image))  # noqa: E731
        if len(images) > 1 and all(image is None for image in images):
            what = "regions" if self.crops and any(regions) else "JPEGs"
            raise DecodedNothing(f"nvImageCodec decoded none of the {len(images)} {what} of a "
                                 f"batch on {self.device} (its own log says why)")
        refused = Refused("nvimgcodec: no image (its log says why)")
        return [refused if image is None else as_tensor(image).permute(2, 0, 1)
                for image in images]


class CropRegionReader:
    """A training sample's RandomResizedCrop with only the crop's region of the JPEG decoded, on
    the CPU (the `pytorch` backend's loader workers): nvImageCodec's libjpeg-turbo decodes the
    region, torchvision resizes it. The pixels are those of decoding the whole file with
    torchvision and cropping (tested bit for bit). A worker trains about 1.2x the images per
    second on ImageNet-sized JPEGs (2-core Xeon), mostly from the resize: torchvision's uint8
    resize is 2-3x faster on the region as decoded (HWC, channels-last strides) than on a
    contiguous CHW image; the region's decode itself cost about what the whole decode did there.

    Only plain YCbCr JPEGs; anything else (other formats, grayscale, CMYK) returns None and is
    decoded whole, as before. Made lazily in each process that reads (a worker), never pickled."""

    def __init__(self):
        nvimgcodec = import_nvimgcodec()
        self.codec = nvimgcodec
        self.decoder = nvimgcodec.Decoder(
            device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
            backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
            options=":fancy_upsampling=1")
        # torchvision's decode_image leaves EXIF orientation alone: so does this
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False)

    @staticmethod
    def available() -> bool:
        try:
            import_nvimgcodec()
        except (ImportError, OSError, RuntimeError):
            return False
        return True

    def __call__(self, data: torch.Tensor, crop) -> Optional[torch.Tensor]:
        """`crop`: the sample's v2.RandomResizedCrop (its box drawn here, as its forward draws
        it). -> the resized crop, uint8 CHW; None: decode the whole file instead (the caller
        seeds the sample's random numbers again first: a box may have been drawn)."""
        import numpy as np
        from torchvision.transforms.v2 import functional as TF

        try:
            stream = self.codec.CodeStream(data.numpy())
        except Exception:  # not an image format nvImageCodec parses
            return None
        if stream.codec_name != "jpeg" or stream.color_spec != self.codec.ColorSpec.SYCC:
            return None
        stand_in = torch.empty((1, 1, 1), dtype=torch.uint8).expand(3, stream.height,
                                                                     stream.width)
        box = crop.make_params([stand_in])
        top, left, height, width = box["top"], box["left"], box["height"], box["width"]
        region = stream.get_sub_code_stream(
            region=self.codec.Region(top, left, top + height, left + width))
        image = self.decoder.decode(region, params=self.params)
        if image is None:  # damaged, or a variant it refuses: torchvision decides
            return None
        # HWC as decoded; CHW is a view of it, which torchvision's uint8 resize takes as is
        pixels = torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
        return TF.resize(pixels, list(crop.size), interpolation=crop.interpolation,
                         antialias=crop.antialias)
