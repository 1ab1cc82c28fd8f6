"""A machine as it comes, for the tests that need one: a fresh copy of the clone, and a Python
with torch and the rest but not this package. The Python is a new virtualenv that reaches the
project environment's packages through a .pth file (as a system site-packages), which makes
torch importable there and not this clone's package (a .pth of a folder added that way is not
read)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conftest import REPO


def fresh_clone(dest: Path) -> Path:
    """This checkout's files as git would give them to a new clone (tracked and not ignored)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, capture_output=True, check=True
                           ).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_symlink():  # as git makes it (recipes/ -> imagenet_recipes/recipes)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).symlink_to(os.readlink(source))
        elif source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def bare_python(venv: Path, with_packages: bool) -> dict:
    """A new virtualenv; with_packages: the project environment's packages reachable (torch,
    pytest, ...), not this package. -> the environment variables of a shell on that machine."""
    subprocess.run([sys.executable, "-m", "venv", *([] if with_packages else ["--without-pip"]),
                    str(venv)], check=True)
    if with_packages:
        site = Path(subprocess.run([venv / "bin/python", "-c", "import sysconfig; print("
                                    "sysconfig.get_paths()['purelib'])"], capture_output=True,
                                   text=True, check=True).stdout.strip())
        (site / "system-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        # the console scripts a system Python's packages bring (torchrun), for this Python
        torchrun = venv / "bin/torchrun"
        torchrun.write_text(f"#!/bin/sh\nexec {venv}/bin/python -m torch.distributed.run "
                            '"$@"\n')
        torchrun.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_TIER_", "GPU_CHECK_", "RECIPES_", "PYTHON"))
           and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, even on a machine with a GPU
    return env


def imports_package(env: dict) -> bool:
    return subprocess.run(["python", "-c", "import imagenet_recipes"], cwd="/", env=env,
                          capture_output=True).returncode == 0
