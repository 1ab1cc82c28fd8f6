"""Mixed precision end to end through the real entry scripts: O2 and fp16 loss scaling resume
bit for bit, --loss-scale per level, and float16 on the CPU (the GradScaler path that otherwise
runs only on GPUs). The half type is always named, never `auto`, so any CPU runs the same."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import (TINY, assert_resume_is_exact, first_conv_weight, records, run_script,
                      weights)

pytestmark = pytest.mark.slow  # every test here starts real processes

SHORT = TINY + ["-b", "8", "--steps-per-epoch", "3", "--seed", "2"]


EMA = ("--model-ema", "--model-ema-steps", "3")


@pytest.mark.parametrize("script,nproc,level,dtype,extra", [
    ("nd.py", 0, "O2", "bfloat16", ()),
    ("nd.py", 0, "O1", "float16", ()),
    # DDP with the most state: loss scaler, fp32 masters and their EMA
    ("ddp.py", 2, "O2", "float16", EMA),
])
def test_mixed_precision_resume_is_bit_identical(tiny_imagefolder, tmp_path, script, nproc,
                                                 level, dtype, extra):
    """O2 resumes from the saved fp32 masters (not from their half rounding), float16 from the
    saved loss scale and growth tracker, and the EMA of O2's masters from its saved average."""
    args = SHORT + ["--opt-level", level, "--amp-dtype", dtype, *extra]
    state = assert_resume_is_exact(lambda argv: run_script(script, argv, nproc=nproc), args,
                                   tiny_imagefolder, tmp_path)
    if extra == EMA:
        resumed = weights(tmp_path / "cut")
        assert state["model_ema"]["updates"] == resumed["model_ema"]["updates"] > 1
        for name, value in state["model_ema"]["model"].items():
            assert value.dtype != torch.float16, name  # an fp32 average of the masters
            assert torch.equal(value, resumed["model_ema"]["model"][name]), name
    conv = first_conv_weight(state["model"])
    assert conv.dtype == torch.float32  # O2 saves the masters, not the half model
    if level == "O2":
        assert not torch.equal(conv, conv.to(torch.bfloat16).float())
    train = records(tmp_path / "straight", "train")
    assert all(math.isfinite(r["loss"]) for r in train)
    if dtype == "float16":
        run = records(tmp_path / "straight", "run")[0]
        assert run["precision"] == {"opt_level": level, "dtype": "float16",
                                    "loss_scaling": "GradScaler"}
        scales = [r["loss_scale"] for r in train]
        assert all(s is not None and s >= 1 for s in scales)
        assert state["precision"]["scaler"]["scale"] == scales[-1]  # checkpointed


def test_loss_scale_is_honoured_or_refused(tiny_imagefolder, tmp_path):
    run_script("nd.py", SHORT + ["--epochs", "1", "--loss-scale", "128", "--logdir", tmp_path,
                                 "--run-name", "o0", tiny_imagefolder])
    assert {r["loss_scale"] for r in records(tmp_path / "o0", "train")} == {128.0}
    proc = run_script("nd.py", SHORT + ["--epochs", "1", "--opt-level", "O1", "--amp-dtype",
                                        "bfloat16", "--loss-scale", "128", "--logdir", tmp_path,
                                        "--run-name", "bf16", tiny_imagefolder], check=False)
    assert proc.returncode == 2 and "never needs loss scaling" in proc.stderr


def test_o2_grad_accum_trains(tiny_imagefolder, tmp_path):
    """DDP + O2 + --grad-accum: every micro-batch is reduced and summed in the fp32 masters."""
    run_script("ddp.py", SHORT + ["--epochs", "1", "--opt-level", "O2", "--amp-dtype",
                                  "bfloat16", "-b", "4", "--grad-accum", "2", "--logdir",
                                  tmp_path, "--run-name", "acc", tiny_imagefolder], nproc=2)
    train = records(tmp_path / "acc", "train")
    assert [r["count"] for r in train] == [16] * 3 and all(math.isfinite(r["loss"])
                                                          for r in train)
