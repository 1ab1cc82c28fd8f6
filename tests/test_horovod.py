"""train/hvd.py under `horovodrun --gloo` on CPU: fp16 compression, resume, and mixed precision
(O2 gradients reduced during backward, float16 loss scaling). Horovod is built by
launch/install_horovod.sh (which .ci/run calls first). Its training (the run's record, the
loss falling) and its exact float64 parity with nd and DDP, step by step over 24 steps, are
tests/test_parity.py's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import (REPO, TINY, TRAIN, assert_resume_is_exact, first_conv_weight, forked_env,
                      records, run_forked, script_env)
from forked_ranks import command

pytestmark = pytest.mark.slow  # every test here starts real processes

pytest.importorskip("horovod.torch", reason="Horovod is not built: bash launch/install_horovod.sh")


def horovodrun(program: list, nproc: int = 2, timeout: int = 600,
               forked: bool = True) -> subprocess.CompletedProcess:
    """`horovodrun -np NPROC --gloo` running `program` (SCRIPT ARGS) to its end, which must
    succeed. forked: each rank's command is the client of this process's fork server
    (conftest.forked_env), which runs SCRIPT in a process forked from an interpreter that has
    imported everything already; not forked: `python SCRIPT ARGS`, as a user starts it."""
    launcher = Path(sys.executable).parent / "horovodrun"
    program = [str(a) for a in program]
    rank = command(0, program) if forked else [sys.executable, *program]
    proc = subprocess.run([str(launcher), "-np", str(nproc), "--gloo", *rank],
                          capture_output=True, text=True, timeout=timeout,
                          env=forked_env() if forked else script_env(), cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def run_hvd(args, nproc: int = 2, timeout: int = 600,
            forked: bool = True) -> subprocess.CompletedProcess:
    """train/hvd.py under horovodrun (see horovodrun)."""
    return horovodrun([TRAIN / "hvd.py", *args], nproc, timeout, forked)


PARITY = TINY + ["--image-size", "64", "-b", "4", "--epochs", "1", "--steps-per-epoch", "4",
                 "--lr", "0.4", "--seed", "3"]


def test_horovod_fp16_compression_runs(tiny_imagefolder, tmp_path):
    """--fp16-allreduce: the losses near DDP's (fp32 all-reduce) for the first steps, but not
    equal to them."""
    run_forked("ddp.py", PARITY + ["--logdir", tmp_path, "--run-name", "ddp", tiny_imagefolder],
               nproc=2)
    ddp_losses = [r["loss"] for r in records(tmp_path / "ddp", "train")]
    # as a user starts it: the other tests' horovodrun runs are forked
    run_hvd(PARITY + ["--fp16-allreduce", "--logdir", tmp_path, "--run-name", "fp16",
                      tiny_imagefolder], forked=False)
    losses = [r["loss"] for r in records(tmp_path / "fp16", "train")]
    assert len(losses) == len(ddp_losses) == 4
    assert len(set(round(v, 3) for v in ddp_losses)) == 4  # the model really moves
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
    horovodrun([REPO / "tests" / "horovod_o2_probe.py", tmp_path], timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["reduced_in_backward"] == rank["parameters"]  # every one, overlapped
        assert rank["half_parameters"] == ["0.bias", "0.weight", "5.bias", "5.weight"]
        assert rank["grad_dtypes"] == ["torch.bfloat16", "torch.float32"]  # half + BN's fp32
        assert rank["master_dtypes"] == ["torch.float32"]
        assert rank["masters_moved"] and rank["half_is_master_rounded"]
    assert ranks[0]["masters"] == ranks[1]["masters"]  # averaged gradients: ranks agree
