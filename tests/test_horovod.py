"""train/hvd.py under `horovodrun --gloo` on CPU: training, parity with DDP, fp16 compression,
resume, and mixed precision (O2 gradients reduced during backward, float16 loss scaling).
Horovod is built by launch/install_horovod.sh (which .ci/run calls first). Exact float64
parity with nd, DDP and the parameter server is in tests/test_parity.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import (REPO, TINY, TRAIN, script_env, assert_resume_is_exact, first_conv_weight,
                      records, run_script)

pytestmark = pytest.mark.slow  # every test here starts real processes

pytest.importorskip("horovod.torch", reason="Horovod is not built: bash launch/install_horovod.sh")


def run_hvd(args, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", str(nproc), "--gloo", sys.executable, str(TRAIN / "hvd.py"),
           *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=script_env(),
                          cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_horovod_trains_for_real(tiny_imagefolder, tmp_path):
    # float64: the same trajectory on every CPU (fp32 kernels differ between CPU kinds)
    run_hvd(TINY + ["-b", "8", "--epochs", "3", "--lr", "0.4", "--float64",
                    "--logdir", tmp_path, "--run-name", "hvd", tiny_imagefolder])
    epochs = records(tmp_path / "hvd", "train_epoch")
    assert [e["count"] for e in epochs] == [64, 64, 64]  # 2 ranks x 4 steps x 8
    assert epochs[-1]["loss"] < 0.8 * epochs[0]["loss"]
    assert [v["count"] for v in records(tmp_path / "hvd", "val")] == [20, 20, 20]
    run = records(tmp_path / "hvd", "run")[0]
    assert (run["strategy"], run["world_size"], run["backend"]) == ("hvd", 2, "gloo")
    assert run["global_batch"] == 16 and run["lr"] == pytest.approx(0.4 * 16 / 256)


PARITY = TINY + ["--image-size", "64", "-b", "4", "--epochs", "1", "--steps-per-epoch", "4",
                 "--lr", "0.4", "--seed", "3"]


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def ddp_losses(tiny_imagefolder, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("ddp_parity")
    run_script("ddp.py", PARITY + ["--logdir", logdir, "--run-name", "ddp", tiny_imagefolder],
               nproc=2)
    return [r["loss"] for r in records(logdir / "ddp", "train")]


@pytest.mark.xdist_group("horovod-ddp-losses")  # one worker: the fixture runs once
def test_horovod_matches_ddp_step_by_step(tiny_imagefolder, tmp_path, ddp_losses):
    """Same global batch, data order, precision and initial weights: the same losses at every
    step (gradient averaging over ranks is the same computation, in another library)."""
    run_hvd(PARITY + ["--logdir", tmp_path, "--run-name", "hvd", tiny_imagefolder])
    hvd_losses = [r["loss"] for r in records(tmp_path / "hvd", "train")]
    assert len(hvd_losses) == len(ddp_losses) == 4
    assert hvd_losses == pytest.approx(ddp_losses, rel=1e-4)
    assert len(set(round(v, 3) for v in ddp_losses)) == 4  # the model really moves


@pytest.mark.xdist_group("horovod-ddp-losses")  # one worker: the fixture runs once
def test_horovod_fp16_compression_runs(tiny_imagefolder, tmp_path, ddp_losses):
    run_hvd(PARITY + ["--fp16-allreduce", "--logdir", tmp_path, "--run-name", "fp16",
                      tiny_imagefolder])
    losses = [r["loss"] for r in records(tmp_path / "fp16", "train")]
    # fp16 gradients round at ~1e-3 relative: close to the fp32 all-reduce for the first steps
    # (after that this tiny chaotic setup amplifies any difference, see the DDP parity test),
    # but not equal, or nothing was compressed.
    assert losses[:3] == pytest.approx(ddp_losses[:3], rel=2e-2)
    assert losses[1:3] != pytest.approx(ddp_losses[1:3], rel=1e-6)
    assert records(tmp_path / "fp16", "run")[0]["config"]["fp16_allreduce"] is True


# O2 float16: the loss scaler's state and the fp32 masters, the most state Horovod's path carries
# (O1 float16, bfloat16 and O0 take the same path with less of it; tests/test_mixed_precision.py
# resumes those with nd, and O2 float16 with DDP)
def test_horovod_resume_is_bit_identical(tiny_imagefolder, tmp_path):
    args = TINY + ["-b", "8", "--steps-per-epoch", "2", "--seed", "2", "--opt-level", "O2",
                   "--amp-dtype", "float16"]
    state = assert_resume_is_exact(run_hvd, args, tiny_imagefolder, tmp_path)
    assert first_conv_weight(state["model"]).dtype == torch.float32  # the masters
    train = records(tmp_path / "straight", "train")
    assert all(r["loss_scale"] >= 1 for r in train)
    assert state["precision"]["scaler"]["scale"] == train[-1]["loss_scale"]


def test_horovod_o2_reduces_half_gradients_during_backward(tmp_path):
    """Horovod's hooks must sit on the half model's parameters (what autograd reaches), so
    every gradient's all-reduce starts during backward; the fp32 masters are then stepped."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    proc = subprocess.run([str(horovodrun), "-np", "2", "--gloo", sys.executable,
                           str(REPO / "tests" / "horovod_o2_probe.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=script_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["reduced_in_backward"] == rank["parameters"]  # every one, overlapped
        assert rank["half_parameters"] == ["0.bias", "0.weight", "5.bias", "5.weight"]
        assert rank["grad_dtypes"] == ["torch.bfloat16", "torch.float32"]  # half + BN's fp32
        assert rank["master_dtypes"] == ["torch.float32"]
        assert rank["masters_moved"] and rank["half_is_master_rounded"]
    assert ranks[0]["masters"] == ranks[1]["masters"]  # averaged gradients: ranks agree
