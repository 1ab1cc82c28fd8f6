"""Does a --gpu-decoder work here? It decodes a known JPEG where the run decodes, called the
way the run calls it. Every --data-backend gpu run checks its decoder this way at start, on a
batch of two. `launch/gpu_check.sh --probe` checks each decoder in a process of its own, at the
run's batch size, under a time limit:

    python -m imagenet_recipes.data.decoder_check nvimgcodec --device cuda --batch-size 256

One line: "OK: where it decodes" (exit 0), "BROKEN: the cause and the fix" (exit 1) or "MISSING:
the module is not installed" (exit 3). A decoder that crashes the process or hangs prints
nothing: gpu_check.sh names those from the exit status, and no other decoder's verdict depends
on it. With --limit, a decoder that takes longer to build and decode ends the process by SIGALRM
(exit 142): the clock starts once Python, torch and torchvision have loaded and the known JPEG
is made (a minute on a busy machine), so only the decoder's own time counts.

What is decoded is what the run decodes: whole images for torchcodec and nvimgcodec-whole, each
sample's region for nvimgcodec. So nvImageCodec's region path is checked apart from its
whole-image path: nvJPEG older than 13.2 refuses regions with interpolated chroma, and
nvImageCodec 0.9's region batches crash on some GPUs where a batch of one passes (its issue #55).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import io
import signal
import sys
from typing import Optional, Sequence, Tuple

import torch

from ..errors import UsageError
from ..nvjpeg_wheel import loaded as loaded_nvjpeg
from ..registry import GPU_DECODERS
from .jpeg_decoders import (NVIMGCODEC_PIP, TORCHCODEC_PIP, DecodedNothing, DecoderSettings,
                            Refused, first_line, make_decoder)

# What to do when a decoder cannot decode on the GPU, by decoder
_NVIMGCODEC_FIX = (f"nvImageCodec with its nvJPEG extension ({NVIMGCODEC_PIP}); in a container, "
                   "the driver's video capability for the hardware decoder "
                   "(NVIDIA_DRIVER_CAPABILITIES=compute,utility,video)")
_FIXES = {
    "torchcodec": (f"a TorchCodec built for this torch and CUDA ({TORCHCODEC_PIP}; "
                   "see TorchCodec's compatibility table)"),
    "nvimgcodec": (f"{_NVIMGCODEC_FIX}; regions need nvJPEG 13.2 or newer (pip install "
                   "'nvidia-nvjpeg>=13.2'), or decode whole images: --gpu-decoder "
                   "nvimgcodec-whole"),
    "nvimgcodec-whole": _NVIMGCODEC_FIX,
}
# The regions a batch of the known JPEG is cut into, in turn (top, left, height, width): crops of
# RandomResizedCrop's kind, aligned to the 16-pixel blocks of a 4:2:0 JPEG or not, the whole
KNOWN_SIZE = (300, 400)  # an ImageNet-sized image, as the hardware decoder meets them
REGIONS = ((8, 16, 200, 240), (100, 150, 160, 224), (37, 53, 120, 97), (0, 0, *KNOWN_SIZE))


@functools.lru_cache(maxsize=1)
def known_jpeg() -> Tuple[bytes, torch.Tensor]:
    """A 4:2:0 JPEG of ImageNet's size made here (a smooth colour ramp, so every decoder's chroma
    upsampling lands within a level or two of libjpeg-turbo's) and its pixels as torchvision
    decodes it."""
    from PIL import Image
    from torchvision.io import decode_jpeg

    height, width = KNOWN_SIZE
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pixels = torch.stack([x * 255 // width, y * 255 // height,
                          255 - (x + y) * 255 // (width + height)]).to(torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(out, "JPEG", quality=90,
                                                          subsampling=2)
    data = out.getvalue()
    return data, decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def probe_decoder(name: str, device: torch.device,
                  settings: DecoderSettings = DecoderSettings(), batch_size: int = 2) -> str:
    """Build the --gpu-decoder `name` for `device` and check it on a batch of `batch_size`
    (check_decoder). -> one line saying where it decodes; a UsageError naming the cause."""
    return check_decoder(make_decoder(name, device, settings), device, batch_size)


def check_decoder(decoder, device: torch.device, batch_size: int = 2) -> str:
    """Decode `batch_size` copies of a known JPEG in one call of `decoder`: whole, or cut into
    REGIONS where the decoder decodes regions. -> one line saying so; a UsageError naming the
    cause and the fix when it fails, decodes nothing, decodes off the device, or decodes wrong
    pixels."""
    name = decoder.name
    data, reference = known_jpeg()
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    wanted = [REGIONS[i % len(REGIONS)] if decoder.crops else None for i in range(batch_size)]
    where = f"{device}" if device.type == "cuda" else "the CPU"
    copies = f"{batch_size} {'regions' if decoder.crops else 'copies'} of a"
    what = f"{copies} known JPEG"
    elsewhere = "Or decode elsewhere: --data-backend pytorch (CPU workers) or another --gpu-decoder"
    try:
        images = decoder([encoded] * batch_size, wanted)
    except DecodedNothing:  # not one file's fault: the library's own log says why
        raise UsageError(f"--gpu-decoder {name} decoded nothing on {where} for {what}"
                         f"{_nvjpeg_in_use(name)}; needs {_FIXES[name]}. {elsewhere}") from None
    except Exception as err:
        raise UsageError(f"--gpu-decoder {name} failed to decode {what} on {where} "
                         f"({type(err).__name__}: {first_line(err)}); needs {_FIXES[name]}. "
                         f"{elsewhere}") from None
    worst = 0.0
    for image, cut in zip(images, wanted):
        if isinstance(image, Refused):
            raise UsageError(f"--gpu-decoder {name} decoded nothing on {where} for a plain "
                             f"JPEG ({image.reason}); needs {_FIXES[name]}. {elsewhere}")
        if image.device.type != device.type:
            raise UsageError(f"--gpu-decoder {name} returned its pixels on {image.device}, not "
                             f"on {where}: it is not decoding on the GPU; needs {_FIXES[name]}")
        top, left, height, width = cut or (0, 0, *reference.shape[1:])
        expected = reference[:, top:top + height, left:left + width]
        if tuple(image.shape) != tuple(expected.shape):
            raise UsageError(f"--gpu-decoder {name} decoded a {tuple(expected.shape)} JPEG "
                             f"as {tuple(image.shape)} on {where}")
        worst = max(worst, (image.cpu().float() - expected.float()).abs().mean().item())
    # Repeated chroma on this smooth ramp stays within a couple of levels; a wrong colour
    # conversion or channel order is tens of levels off
    if worst > 8:
        raise UsageError(f"--gpu-decoder {name} decoded a known JPEG {worst:.1f} levels away "
                         f"from libjpeg-turbo on {where}: not a working decoder")
    size = f"{reference.shape[2]}x{reference.shape[1]}"
    return (f"{name}: decodes on {where} ({copies} {size} JPEG in one call; worst mean |diff| "
            f"to libjpeg-turbo {worst:.2f} levels)")


def _nvjpeg_in_use(decoder: str) -> str:
    """' (nvJPEG loaded here: FILES)' for nvImageCodec's decoders: which nvJPEG it found decides
    whether it decodes regions (nvjpeg_wheel.py)."""
    files = loaded_nvjpeg() if decoder.startswith("nvimgcodec") else []
    return f" (nvJPEG loaded here: {', '.join(files)})" if files else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ..machine import cores_per_process

    p = argparse.ArgumentParser(prog="python -m imagenet_recipes.data.decoder_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("decoder", choices=tuple(GPU_DECODERS))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: the first GPU (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256,
                   help="images in the one call, as a run's -b (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0,
                   help="the decoder's CPU threads (default: a one-process run's share)")
    p.add_argument("--limit", type=float, default=0,
                   help="seconds the decoder may take to load, build and decode, counted from "
                        "after Python's start (0: no limit); past them the process ends by "
                        "SIGALRM, exit 142")
    args = p.parse_args(argv)
    known_jpeg()  # torchvision's import and the reference decode: before the clock starts
    if args.limit > 0:
        # The signal's default action ends the process without running Python code, so a
        # decoder stuck in C code holding the GIL ends as well.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, args.limit)
    module = "torchcodec" if args.decoder == "torchcodec" else "nvidia.nvimgcodec"
    try:
        missing = importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # nvidia/ itself is missing
        missing = True
    if missing:
        print(f"MISSING: {module} is not installed", flush=True)
        return 3
    if args.device == "cuda" and not torch.cuda.is_available():
        print("BROKEN: no CUDA GPU is visible (torch.cuda.is_available() is False)", flush=True)
        return 1
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    settings = DecoderSettings(threads=args.threads or cores_per_process(1),
                               batch_size=args.batch_size)
    try:
        line = probe_decoder(args.decoder, device, settings, args.batch_size)
    except Exception as err:  # whatever it raises: named, and the caller goes on
        text = (str(err).strip().splitlines() or [""])[0]  # the whole line: it names the fix
        if not isinstance(err, UsageError):
            text = f"{type(err).__name__}: {text}"
        print(f"BROKEN: {text}", flush=True)
        return 1
    print(f"OK: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
