"""The nvJPEG that nvImageCodec decodes with: the nvidia-nvjpeg wheel's, not torchvision's copy.

torchvision's CUDA wheels carry a libnvjpeg of their own (torchvision 0.26+cu130: nvJPEG 13.0.1).
Once torchvision is imported, nvImageCodec's nvJPEG extension finds that copy rather than the
wheel's, and nvImageCodec 0.9 decodes no region with interpolated chroma on an nvJPEG older than
13.2: every crop of `--gpu-decoder nvimgcodec` comes back empty. Measured on an H200 with
nvidia-nvjpeg 13.3.2 installed: 256 of 256 regions refused with torchvision imported first, none
refused (0.0003 levels from libjpeg-turbo) with the wheel's library loaded before torchvision.

So the package loads the wheel's library when it is imported (`imagenet_recipes/__init__.py`),
which every entry script, tool and loader worker does before it imports torchvision. Nothing
happens where the wheel is not installed, off Linux, or where torchvision was imported first.

Its symbols are global, so the libraries that carry a copy of their own and load later bind to
it as well (`LD_BIND_NOW=1 LD_DEBUG=bindings`: torchvision's image library, and TorchCodec's,
which carries nvJPEG 13.0.1): one nvJPEG per process, a newer release of the same major
version. On the H200, TorchCodec's probe decoded as before with it (0.17 levels from
libjpeg-turbo).
"""
from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path
from typing import List, Optional

# Where the nvidia-nvjpeg wheel (CUDA 13) puts its library, inside the `nvidia` namespace package
LIBRARY = Path("cu13") / "lib" / "libnvjpeg.so.13"


def wheel_library() -> Optional[Path]:
    """The nvidia-nvjpeg wheel's libnvjpeg where that wheel is installed, else None."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / LIBRARY).is_file():
            return Path(folder) / LIBRARY
    return None


def load_before_torchvision() -> Optional[Path]:
    """Load the wheel's libnvjpeg into this process, its symbols global, while torchvision is not
    yet imported. -> the library loaded, or None (no wheel, not Linux, too late, cannot load)."""
    if not sys.platform.startswith("linux") or "torchvision" in sys.modules:
        return None
    path = wheel_library()
    if path is None:
        return None
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:  # a broken install: nvImageCodec's own check will say so where it matters
        return None
    return path


def loaded() -> List[str]:
    """The libnvjpeg files this process has loaded (Linux; [] elsewhere): the first thing to read
    when nvImageCodec refuses regions."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libnvjpeg" in line}
    except OSError:
        return []
    # libnvjpeg.so.13, or a wheel's renamed copy (torchvision's libnvjpeg.4a0b5c81.so.13,
    # TorchCodec's libnvjpeg-1a359ba7.so.13.0.1.86); not libnvjpeg2k
    return sorted(path for path in paths if Path(path).name.startswith(("libnvjpeg.",
                                                                        "libnvjpeg-")))
