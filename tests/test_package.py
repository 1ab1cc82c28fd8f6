"""The product as a package: an entry script started where the package is not installed says
how to install it, in one line; a wheel built from a clone is the product alone (the presets
with it, no tool or experiment) and trains from any folder as `python -m`."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, TRAIN
from fresh_python import bare_python, fresh_clone

ENTRY_SCRIPTS = sorted(p.name for p in TRAIN.glob("[!_]*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", ENTRY_SCRIPTS)
def test_an_entry_script_without_the_package_says_how_to_install_it(script, tmp_path):
    env = bare_python(tmp_path / "venv", with_packages=False)
    proc = subprocess.run(["python", f"train/{script}", "--help"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    line, = proc.stderr.splitlines()
    assert line.startswith(f"{script}: the imagenet_recipes package is not installed")
    assert f"pip install --no-deps -e {REPO}" in line and "launch/env.sh" in line


@pytest.mark.slow
def test_an_entry_script_shows_what_else_is_missing(tmp_path):
    """A package the engine needs missing: its own traceback, not the install hint."""
    env = bare_python(tmp_path / "venv", with_packages=False)
    env["PYTHONPATH"] = str(REPO)  # the package, without torch
    proc = subprocess.run(["python", "train/nd.py", "--dummy", "--epochs", "1"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_built_wheel_is_the_product_alone_and_building_it_leaves_the_clone_clean(tmp_path):
    """`pip wheel .` in a clone (what a container image or a cluster's shared environment is
    built from), installed into a fresh environment that has torch but not this clone: every
    preset works by name from `/`, and an entry trains there as `python -m`, from the installed
    package; the wheel holds no tool or experiment module (they read the clone) and does not
    require the tools' matplotlib, jinja2 and py-spy but as an extra; the build leaves nothing git
    would see in the clone."""
    clone = fresh_clone(tmp_path / "clone")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(clone)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "clone"], check=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "wheels"), "."],
                           cwd=clone, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == "", status.stdout  # build/ and the egg-info are ignored
    (wheel,) = (tmp_path / "wheels").glob("imagenet_recipes-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        modules = [n for n in archive.namelist() if n.endswith(".py")]
        metadata, = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.split(":", 1)[1].strip() for line in
                    archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    assert "imagenet_recipes/train/ddp_apex.py" in modules and len(modules) > 40
    assert [n for n in modules if n.startswith(("imagenet_recipes/bench/",
                                                "imagenet_recipes/experiments/"))] == []
    assert sorted(r.split(">")[0] for r in requires if "extra ==" not in r) == [
        "numpy", "pillow", "pyyaml", "tensorboard", "timm", "torch", "torchvision"]
    assert {r.split(">")[0] for r in requires if "extra == \"tools\"" in r} == {
        "matplotlib", "jinja2", "py-spy"}
    presets = sorted(p.name for p in (REPO / "recipes").glob("*.toml"))
    assert len(presets) == 6

    env = bare_python(tmp_path / "venv", with_packages=True)
    installed = subprocess.run(["python", "-m", "pip", "install", "--quiet", "--no-deps",
                                "--no-index", str(wheel)], env=env, capture_output=True,
                               text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    names = [name.removesuffix(".toml") for name in presets]
    check = subprocess.run(["python", "-c", (
        "import sys, imagenet_recipes; from imagenet_recipes.config import parse_args\n"
        "print(imagenet_recipes.__file__)\n"
        "for name in sys.argv[1:]:\n"
        "    cfg = parse_args(['--dummy', '--config', name], entry='ddp_apex')\n"
        "    print(name, cfg.arch, cfg.epochs)"), *names],
        cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    lines = check.stdout.splitlines()
    assert lines[0].startswith(str(tmp_path / "venv")), lines[0]  # the wheel's, not the clone's
    assert [line.split()[0] for line in lines[1:]] == names

    # an entry as the installed package runs it: two steps on generated images, from /. The
    # synthetic sets are cut to 8 images each: the default validation set (50,000 images, 12,500
    # forward passes at -b 4) took most of the 300 s timeout on a busy 2-core machine.
    trained = subprocess.run(
        ["python", "-m", "imagenet_recipes.train.nd", "--dummy", "-a", "resnet18",
         "--image-size", "32", "-b", "4", "--epochs", "1", "--steps-per-epoch", "2",
         "--synthetic-train-size", "8", "--synthetic-val-size", "8",
         "--device", "cpu", "--opt-level", "O0", "--logdir", str(tmp_path / "runs")],
        cwd="/", env=env, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "best top-1" in trained.stdout + trained.stderr
    log, = (tmp_path / "runs").glob("nd-resnet18-*/log.jsonl")
    val, = [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "val"]
    assert val["count"] == 8, val
    tools = subprocess.run(["python", "-m", "imagenet_recipes.bench.stages", "--help"], cwd="/",
                           env=env, capture_output=True, text=True, timeout=60)
    assert tools.returncode == 1 and "No module named 'imagenet_recipes.bench'" in tools.stderr
