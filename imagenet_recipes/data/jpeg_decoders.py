"""The batched JPEG decoders of `--data-backend gpu` (--gpu-decoder), behind one call:

    decoder(files, regions) -> one uint8 CHW image (or None: refused) per file, on the device

where `regions` gives, per file, the (top, left, height, width) of the pixels that will be used,
or None for the whole image. A decoder with `crops = True` returns just those pixels; the
others return whole images and leave the cutting to the caller.

    torchcodec  TorchCodec's decode_jpeg: nvJPEG's CUDA decoder on a GPU, libjpeg-turbo on the
                CPU; whole images. Each call ends with a host synchronisation on the calling
                thread's current stream (its DecodeJpegCuda.cpp).
    nvimgcodec  NVIDIA nvImageCodec, the library DALI decodes with: one batched call, only each
                training crop's region decoded (`CodeStream.get_sub_code_stream(region=...)`:
                the blocks outside it are entropy-decoded and skipped, never transformed). On a
                GPU its hardware JPEG decoder (A100, H100, H200) takes HW_LOAD of each batch and
                the CUDA ("hybrid") decoder the rest; the output is read through
                `__cuda_array_interface__`, no copy. Without a GPU: libjpeg-turbo on the CPU,
                through the same calls (a decoder made with NVIMGCODEC_DEVICE_CPU_ONLY and the
                CPU backend alone; the default device fails there with "CUDA Runtime failure
                #35"), so the CPU runs this path for real.

Both upsample chroma by interpolation ("fancy" upsampling, libjpeg-turbo's default), so their
pixels stay within a little of the `pytorch` backend's (tests/test_gpu_decode.py); on a CPU
nvImageCodec's are libjpeg-turbo's exactly, regions included.

The hardware decoder writes its output when the call is made, not in the order of the stream
it is given (torchcodec#1634, pytorch/vision#9606: corrupted images on an H100): the nvImageCodec
decoder on a GPU waits for its stream's earlier work before each call, so no buffer it writes
into is still being read.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ..config import UsageError

GPU_DECODERS = ("torchcodec", "nvimgcodec")
TORCHCODEC_PIP = "pip install torchcodec"
NVIMGCODEC_PIP = "pip install 'nvidia-nvimgcodec-cu13[nvjpeg]'"
# The hardware decoder's share of each batch: DALI's own default for its mixed decoder
# (hw_decoder_load 0.65 in nvidia.dali.fn.decoders.image); the CUDA decoder takes the rest.
HW_LOAD = 0.65

Region = Tuple[int, int, int, int]  # (top, left, height, width)


def import_nvimgcodec():
    """nvidia.nvimgcodec (import_module, not `from nvidia import`: that finds the attribute an
    earlier import left on the namespace package even where the module is blocked)."""
    import importlib

    return importlib.import_module("nvidia.nvimgcodec")


def make_decoder(name: str, device: torch.device):
    """The --gpu-decoder `name` for a run on `device`, or a UsageError saying what to install."""
    return {"torchcodec": TorchCodecDecoder, "nvimgcodec": NvImageCodecDecoder}[name](device)


class TorchCodecDecoder:
    crops = False

    def __init__(self, device: torch.device):
        try:
            from torchcodec.decoders import decode_jpeg
        except (ImportError, OSError, RuntimeError) as err:  # missing, or its libraries fail
            raise UsageError(f"--gpu-decoder torchcodec cannot import TorchCodec ({err}): "
                             f"{TORCHCODEC_PIP} (a version that supports this torch, "
                             f"{torch.__version__}; see TorchCodec's compatibility table)"
                             ) from None
        self.decode_jpeg = decode_jpeg
        # nvJPEG on the run's GPU; libjpeg-turbo on a CPU run
        self.device = device if device.type == "cuda" else torch.device("cpu")

    def __call__(self, files: Sequence[torch.Tensor], regions: Sequence[Optional[Region]]
                 ) -> List[Optional[torch.Tensor]]:
        """One call for the batch; if it fails, one call per file, to find those it refuses."""
        if not files:
            return []
        try:
            return list(self.decode_jpeg(list(files), device=self.device))
        except Exception:  # one bad file fails the whole call
            pass
        images = []
        for data in files:
            try:
                images.append(self.decode_jpeg(data, device=self.device))
            except Exception:
                images.append(None)
        return images


class NvImageCodecDecoder:
    crops = True

    def __init__(self, device: torch.device, fancy_upsampling: bool = True):
        """fancy_upsampling False: chroma repeated, not interpolated (DALI's default); for
        measuring what the interpolation buys (the GPU tier's decode group)."""
        try:
            nvimgcodec = import_nvimgcodec()
        except (ImportError, OSError, RuntimeError) as err:
            raise UsageError(f"--gpu-decoder nvimgcodec cannot import nvImageCodec ({err}): "
                             f"{NVIMGCODEC_PIP}") from None
        self.nvimgcodec, self.device = nvimgcodec, device
        kind = nvimgcodec.BackendKind
        # fancy_upsampling=1: interpolated chroma, as libjpeg-turbo (the CPU decoders) does
        options = f":fancy_upsampling={int(fancy_upsampling)}"
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.decoder = nvimgcodec.Decoder(
                device_id=index, options=options,
                backends=[nvimgcodec.Backend(kind.HW_GPU_ONLY, load_hint=HW_LOAD),
                          nvimgcodec.Backend(kind.HYBRID_CPU_GPU)])
        else:
            self.decoder = nvimgcodec.Decoder(
                device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, options=options,
                backends=[nvimgcodec.Backend(kind.CPU_ONLY)])

    def __call__(self, files: Sequence[torch.Tensor], regions: Sequence[Optional[Region]]
                 ) -> List[Optional[torch.Tensor]]:
        if not files:
            return []
        codec = self.nvimgcodec
        streams = []
        for data, region in zip(files, regions):
            stream = codec.CodeStream(data.numpy())
            if region is not None:
                top, left, height, width = region
                stream = stream.get_sub_code_stream(
                    region=codec.Region(top, left, top + height, left + width))
            streams.append(stream)
        if self.device.type == "cuda":
            cuda_stream = torch.cuda.current_stream(self.device)
            cuda_stream.synchronize()  # the hardware decoder ignores stream order (docstring)
            images = self.decoder.decode(streams, cuda_stream=cuda_stream.cuda_stream)
            # HWC uint8 on the device, no copy; CHW is a view of it
            return [None if image is None else
                    torch.as_tensor(image, device=self.device).permute(2, 0, 1)
                    for image in images]
        import numpy as np

        return [None if image is None else torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
                for image in self.decoder.decode(streams)]


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
