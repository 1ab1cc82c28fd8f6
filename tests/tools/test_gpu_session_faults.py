"""The GPU run rehearsed on a CPU with nvImageCodec's decoder planted (tests/plants/nvimgcodec)
to crash, to hang, or to refuse regions, in the process that probes and measures only (loader
workers decode as usual): tools/gpu_session.sh from a fresh copy of the clone, in a Python that
has torch but not this package, as a GPU machine meets it. Each run ends within its budget with
its archive, names the broken decoder and its cause, and still measures the default loader;
where only regions fail, nvImageCodec is measured on whole images, saying so.

The decode step alone (each input pipeline measured alone, the default loader's first) keeps each
run to a minute or two; the whole default run takes 200-560 s on 2 cores with a fault planted
(docs/testing.md, "Rehearsing a GPU window on a CPU")."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from fresh_python import bare_python, fresh_clone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A fresh clone, a Python without this package, a short TMPDIR (its JPEG set made by the
    first run, reused by the others)."""
    root = tmp_path_factory.mktemp("faults")
    env = bare_python(root / "venv", with_packages=True)
    clone = fresh_clone(root / "clone")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-faults-", dir="/tmp"))
    yield clone, {**env, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    shutil.rmtree(tmp, ignore_errors=True)


def rehearse(machine, fault: str, out: Path) -> tuple:
    """gpu_session.sh --cpu --steps decode with `fault` planted -> (the process, the records
    from its archive: session.log's text, probe.txt's text, gpu_decode.json's rows)."""
    clone, env = machine
    archive = out / "gpu-run.tar.gz"
    env = {**env, "PYTHONPATH": str(clone / "tests/plants/nvimgcodec"),
           "RECIPES_PLANT_NVIMGCODEC": fault, "GPU_CHECK_PROBE_LIMIT": "30"}
    proc = subprocess.run(["bash", "tools/gpu_session.sh", "--cpu", "--steps", "decode",
                           "--budget", "600", "--archive", str(archive)], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert archive.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(archive) as tar:
        tar.extractall(out / "back", filter="data")
    back = out / "back"
    rows = {r["name"]: r for r in json.loads((back / "gpu_decode.json").read_text())["rows"]}
    return proc, (back / "session.log").read_text(), (back / "probe.txt").read_text(), rows


CRASHED = "crashed: killed by SIGSEGV (exit 139) decoding a batch of 4"
HUNG = "hung: no answer within 30 s decoding a batch of 4 (killed)"


def test_a_decoder_that_crashes_or_hangs_costs_its_own_rows_only(machine, tmp_path):
    """nvImageCodec's regions crash and its whole images hang (one run for both faults): each
    mode named BROKEN with its own cause, its rows skipped saying why, TorchCodec and the
    default loader measured."""
    proc, log, probe, rows = rehearse(machine, "crash-regions-hang-whole", tmp_path)
    assert proc.returncode == 0, log + proc.stderr[-3000:]
    assert f"gpu_check: decoder nvimgcodec       BROKEN: {CRASHED}" in probe, probe
    assert f"gpu_check: decoder nvimgcodec-whole BROKEN: {HUNG}" in probe, probe
    assert "gpu_check: decoder torchcodec       OK: " in probe
    skipped = rows["decode-gpu-nvimgcodec"]
    assert skipped["status"] == "skipped" and skipped["note"] == f"nvimgcodec: {CRASHED}"
    for name in ("decode-pytorch", "decode-gpu-torchcodec"):  # the default loader, TorchCodec
        assert rows[name]["status"] == "ok" and rows[name]["img_s"] > 0, rows[name]
    assert "decode: exit 0 after" in log and "target default command" in log


def test_regions_refused_nvimgcodec_is_measured_on_whole_images_saying_so(machine, tmp_path):
    proc, log, probe, rows = rehearse(machine, "refuse-regions", tmp_path)
    assert proc.returncode == 0, log + proc.stderr[-3000:]
    assert ("gpu_check: decoder nvimgcodec       BROKEN: --gpu-decoder nvimgcodec decoded "
            "nothing on the CPU for 4 regions of a known JPEG") in probe, probe
    assert "gpu_check: decoder nvimgcodec-whole OK: " in probe
    assert "its rows decode whole images instead (--gpu-decoder nvimgcodec-whole)" in log
    whole = rows["decode-gpu-nvimgcodec"]
    assert whole["status"] == "ok" and whole["img_s"] > 0, whole
    assert whole["config"].startswith("bench.decode gpu nvimgcodec-whole: ")
    assert whole["note"].startswith("whole images (--gpu-decoder nvimgcodec-whole), not "
                                    "regions: regions BROKEN: --gpu-decoder nvimgcodec")
    assert whole["detail"]["cpu_decoded"] == 0  # the hardware decoder's path, not the CPU's
    assert rows["decode-pytorch"]["status"] == "ok"
