"""`--device auto` where GPUs were expected but torch cannot use CUDA: one line saying why.

A job given GPUs trains on the CPU without a word when torch cannot see CUDA (a CPU-only torch,
a driver older than the wheel's CUDA, a job submitted without GPUs), and the launchers then
start one CPU process per core: hours of a GPU allocation spent at CPU speed. The signs that
GPUs were expected are the ones SLURM, torchrun's users and the driver leave: a non-empty
CUDA_VISIBLE_DEVICES, SLURM's GPU variables, an NVIDIA kernel driver. With any of them and no
usable CUDA, the run stops before it starts (exit 2) with the cause and what to do; `--device
cpu` trains on the CPU on purpose.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, Optional, Tuple

# Where the NVIDIA kernel driver says its version ("NVRM version: NVIDIA UNIX ... 580.65.06 ...")
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
# The oldest driver each CUDA major version runs on (NVIDIA's CUDA compatibility tables:
# "minor version compatibility", the lowest driver of the major release)
MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}
CUDA_WHEELS = "https://download.pytorch.org/whl/"


def driver_version(path: Optional[Path] = None) -> Optional[str]:
    """The loaded NVIDIA driver's version, e.g. '580.65.06'; None without one ('' when its file
    does not say)."""
    try:
        text = (path or DRIVER_VERSION_FILE).read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \w+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return found.group(1) if found else ""


def _major_minor(version: str) -> Tuple[int, int]:
    parts = [int(part) for part in version.split(".")[:2]] + [0, 0]
    return parts[0], parts[1]


def gpu_signs(environ=None) -> List[str]:
    """What says this process was meant to have GPUs, as phrases for the message."""
    env = os.environ if environ is None else environ
    signs = []
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if visible.strip() not in ("", "-1", "none", "NoDevFiles"):
        signs.append(f"CUDA_VISIBLE_DEVICES={visible}")
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        if env.get(name, "").strip() not in ("", "0"):
            signs.append(f"{name}={env[name]}")
    if driver_version() is not None:
        signs.append("an NVIDIA driver is loaded")
    return signs


def why_no_cuda(torch, environ=None) -> Tuple[str, str]:
    """(the cause, what to do) when `torch` cannot use CUDA here."""
    env = os.environ if environ is None else environ
    cuda = torch.version.cuda
    if cuda is None:
        return (f"this torch is a CPU-only build ({torch.__version__})",
                f"install a CUDA build of torch for this machine's driver (e.g. pip install "
                f"torch torchvision --index-url {CUDA_WHEELS}cu130, or your cluster's module)")
    driver = driver_version()
    major = int(cuda.split(".")[0])
    oldest = MIN_DRIVER.get(major)
    if driver and oldest is not None and _major_minor(driver) < oldest:
        return (f"the NVIDIA driver {driver} is older than this torch's CUDA {cuda} needs "
                f"(>= {oldest[0]}.{oldest[1]})",
                f"install torch built for an older CUDA that driver runs (e.g. "
                f"--index-url {CUDA_WHEELS}cu126 for a 525+ driver), or update the driver")
    if driver is None:
        return ("no NVIDIA driver is loaded on this node (no /proc/driver/nvidia/version)",
                "run the job on a GPU node (or ask why this one has no driver)")
    if env.get("SLURM_JOB_ID") and not any(env.get(name) for name in (
            "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")):
        return ("this SLURM job was given no GPU",
                "ask for them: sbatch/srun --gpus-per-node=N (or --gres=gpu:N)")
    try:
        torch.cuda.init()
    except Exception as err:  # torch says why it cannot initialise CUDA
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return (f"torch cannot initialise CUDA ({first})",
                "check the devices CUDA_VISIBLE_DEVICES names (nvidia-smi -L)")
    return ("torch sees no CUDA device", "check the devices CUDA_VISIBLE_DEVICES names "
                                          "(nvidia-smi -L)")


def refusal(torch, environ=None) -> Optional[str]:
    """The one-line error for `--device auto` when GPUs were expected here and torch cannot use
    CUDA; None where no GPU was expected (the run trains on the CPU) or CUDA works."""
    if torch.cuda.is_available():
        return None
    signs = gpu_signs(environ)
    if not signs:
        return None
    cause, fix = why_no_cuda(torch, environ)
    return (f"GPUs were expected here ({', '.join(signs)}) but torch cannot use CUDA: {cause}. "
            f"Fix: {fix}; or --device cpu to train on the CPU on purpose")
