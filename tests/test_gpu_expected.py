"""`--device auto` where the job was given GPUs that torch cannot use: one line with the cause
and the fix, exit 2, for each cause (simulated: a fake torch, the driver's version file, the
job's environment); where no GPU was expected, the run trains on the CPU and says so once."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import records, run_script
from imagenet_recipes import gpu_expected

OLD_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 2023\n"
NEW_DRIVER = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release "
              "Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul 15 2025\n")


def fake_torch(cuda_version="13.0", init_error="no CUDA GPUs are available"):
    def init():
        raise RuntimeError(init_error)
    return SimpleNamespace(__version__="2.15.0", version=SimpleNamespace(cuda=cuda_version),
                           cuda=SimpleNamespace(is_available=lambda: False, init=init))


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """Point the driver's version file at `text` (None: no driver loaded)."""
    def loaded(text):
        path = tmp_path / "version"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(gpu_expected, "DRIVER_VERSION_FILE", path)
    return loaded


def test_a_cpu_only_torch_in_a_job_given_gpus_is_refused(driver):
    driver(NEW_DRIVER)
    line = gpu_expected.refusal(fake_torch(cuda_version=None),
                                {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4"})
    assert line.startswith("GPUs were expected here (CUDA_VISIBLE_DEVICES=0,1,2,3, "
                           "SLURM_GPUS_ON_NODE=4, an NVIDIA driver is loaded)")
    assert "this torch is a CPU-only build (2.15.0)" in line and "--index-url" in line
    assert line.endswith("or --device cpu to train on the CPU on purpose")
    assert "\n" not in line


def test_a_driver_older_than_the_wheels_cuda_is_named(driver):
    driver(OLD_DRIVER)
    line = gpu_expected.refusal(fake_torch("13.0"), {"SLURM_JOB_GPUS": "0"})
    assert "the NVIDIA driver 535.104.05 is older than this torch's CUDA 13.0 needs " \
           "(>= 580.65)" in line
    assert "cu126" in line and "update the driver" in line
    driver(NEW_DRIVER)  # the same torch on a new enough driver: not that cause
    assert "older than" not in gpu_expected.refusal(fake_torch("13.0"), {"SLURM_JOB_GPUS": "0"})


def test_a_slurm_job_without_gpus_on_a_gpu_node_is_told_to_ask_for_them(driver):
    driver(NEW_DRIVER)
    line = gpu_expected.refusal(fake_torch("13.0"), {"SLURM_JOB_ID": "4242"})
    assert "(an NVIDIA driver is loaded)" in line
    assert "this SLURM job was given no GPU" in line and "--gpus-per-node" in line


def test_gpus_named_on_a_node_without_a_driver(driver):
    driver(None)
    line = gpu_expected.refusal(fake_torch("13.0"), {"CUDA_VISIBLE_DEVICES": "0"})
    assert "no NVIDIA driver is loaded on this node" in line


def test_otherwise_torchs_own_reason(driver):
    driver(NEW_DRIVER)
    line = gpu_expected.refusal(fake_torch("13.0", "CUDA driver initialization failed"),
                                {"CUDA_VISIBLE_DEVICES": "7"})
    assert "torch cannot initialise CUDA (CUDA driver initialization failed)" in line


def test_no_sign_of_a_gpu_trains_on_the_cpu(driver):
    driver(None)
    for environ in ({}, {"CUDA_VISIBLE_DEVICES": ""}, {"CUDA_VISIBLE_DEVICES": "-1"},
                    {"SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_ID": "1"}):
        assert gpu_expected.refusal(fake_torch(None), environ) is None, environ


@pytest.mark.slow
def test_a_run_given_a_gpu_it_cannot_use_stops_with_one_line(tmp_path):
    """The real entry script with a GPU named that torch cannot use (CI's machines have no GPU;
    the cause depends on the machine: no driver there): exit 2, one line on stderr, no
    traceback, no run directory; without a GPU named, one note, then training."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: CUDA_VISIBLE_DEVICES=0 would be usable")
    common = ["--dummy", "-a", "resnet18", "--image-size", "32", "-b", "4", "--epochs", "1",
              "--steps-per-epoch", "1", "--synthetic-val-size", "4", "--logdir", tmp_path]
    proc = run_script("nd.py", common + ["--run-name", "gpu"], check=False,
                      env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: GPUs were expected here (CUDA_VISIBLE_DEVICES=0"), proc.stderr
    assert "but torch cannot use CUDA: " in lines[0] and "Fix: " in lines[0]
    assert not (tmp_path / "gpu").exists()
    cpu = run_script("nd.py", common + ["--run-name", "cpu"], env={"CUDA_VISIBLE_DEVICES": ""})
    assert cpu.stdout.count("no CUDA GPU here: training on the CPU") == 1
    assert records(tmp_path / "cpu", "run")[0]["device"] == "cpu"
