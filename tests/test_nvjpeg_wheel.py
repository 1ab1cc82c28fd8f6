"""nvImageCodec decodes with the nvidia-nvjpeg wheel's nvJPEG, not the older copy torchvision's CUDA
wheels carry (imagenet_recipes/nvjpeg_wheel.py).

On an H200 with torchvision imported first, nvImageCodec bound to torchvision's nvJPEG 13.0.1 and
refused every region (nvJPEG < 13.2); with the wheel's 13.3.2 loaded first it decoded them all.
The binding happens on any machine, GPU or not: nvImageCodec's nvJPEG extension logs the version
it loaded when a decoder is made, CPU-only decoders included. Each test reads that line from a
fresh interpreter, because a library, once loaded, stays for the process's life.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imagenet_recipes.nvjpeg_wheel import wheel_library

pytestmark = pytest.mark.slow  # each starts an interpreter

# The interpreter: imports in the order argv[1] names, makes a CPU-only nvImageCodec decoder (its
# extensions load then), and prints the libnvjpeg files it holds and their versions
CHILD = r"""
import ctypes, json, sys
if sys.argv[1] == "torchvision-first":
    import torchvision.io
import imagenet_recipes
import torchvision.io
import nvidia.nvimgcodec as nv
from imagenet_recipes.nvjpeg_wheel import loaded
nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])
versions = {}
for path in loaded():
    parts = []
    for field in range(3):  # nvjpegGetProperty: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        ctypes.CDLL(path).nvjpegGetProperty(field, ctypes.byref(value))
        parts.append(str(value.value))
    versions[path] = ".".join(parts)
print("LOADED", json.dumps(versions))
"""
REPORTED = re.compile(r"\[nvjpeg-ext\] nvJPEG version: (\d+\.\d+\.\d+)")


def nvjpeg_in_use(order: str, where: Path):
    """-> (the nvJPEG version nvImageCodec's extension reports, {libnvjpeg path: version}) in a
    fresh interpreter importing in `order` (the installed package, run from `where`)."""
    env = dict(os.environ, PYNVIMGCODEC_VERBOSITY="3")
    done = subprocess.run([sys.executable, "-c", CHILD, order], env=env, capture_output=True,
                          text=True, timeout=300, cwd=where)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    reported = REPORTED.findall(output)
    assert len(set(reported)) == 1, output[-3000:]
    loaded = json.loads(output.split("LOADED ", 1)[1].splitlines()[0])
    return reported[0], loaded


def wheel_version() -> str:
    """nvidia-nvjpeg's version as nvJPEG reports it: 13.3.2.43 -> 13.3.2."""
    return ".".join(importlib.metadata.version("nvidia-nvjpeg").split(".")[:3])


def test_nvimgcodec_decodes_with_the_wheels_nvjpeg_once_the_package_is_imported(tmp_path):
    reported, loaded = nvjpeg_in_use("package-first", tmp_path)
    assert loaded.get(str(wheel_library())) == wheel_version(), loaded
    assert reported == wheel_version(), (reported, loaded)
    # requirements.txt's nvidia-nvjpeg is new enough for regions with interpolated chroma
    assert tuple(map(int, reported.split(".")[:2])) >= (13, 2)


def test_torchvision_imported_first_leaves_nvimgcodec_its_copy(tmp_path):
    """Why the package loads the wheel's library at import: where torchvision comes first,
    nvImageCodec takes torchvision's copy (this test shows the one above can fail)."""
    reported, loaded = nvjpeg_in_use("torchvision-first", tmp_path)
    copies = {path: version for path, version in loaded.items() if "torchvision" in path}
    assert len(copies) == 1, loaded  # torchvision's CUDA wheels carry libnvjpeg
    assert reported == next(iter(copies.values())), (reported, loaded)
    assert str(wheel_library()) not in loaded, loaded
