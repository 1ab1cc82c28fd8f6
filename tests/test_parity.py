"""Strategies compute the same training: nd vs DDP vs FSDP vs Horovod vs the sync parameter
server.

Every run is the real entry script, in float64 (`--float64`), for 24 optimizer steps (3 epochs
of 8) with the same global batch of 8, data order and initial weights. In float32 the runs
drift apart within a few steps on CPUs whose kernels differ (AMX / AVX512-BF16 vs AVX2 pick
other convolution algorithms), so a float32 comparison either fails on some CPUs or needs a
tolerance too loose to catch real bugs; float64 keeps the summation-order noise at ~1e-9 after
24 steps on any CPU. The tolerance, 1e-6, is broken by a 2x error in the gradient average
(checked with a run at twice the lr) and by per-rank BatchNorm (DDP without --sync-bn vs nd).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from conftest import LOCAL_SGD, TINY, records, run_forked, weights

# Every test here starts real processes, and they share the module's runs: one xdist worker
# runs them all, so the runs are made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parity")]

PARITY = TINY + ["--epochs", "3", "--lr", "0.4", "--seed", "3", "--float64"]
REL = 1e-6


def _losses(run_dir):
    losses = [r["loss"] for r in records(run_dir, "train")]
    assert len(losses) == 24  # 3 epochs x 8 steps, logged every step
    return losses


def _params(run_dir):
    state = torch.load(run_dir / "checkpoint.pth", map_location="cpu", weights_only=True)
    return {k: v for k, v in state["model"].items() if v.is_floating_point()
            and "running" not in k}


def _assert_same_training(run_a, run_b):
    assert _losses(run_a) == pytest.approx(_losses(run_b), rel=REL)
    a, b = _params(run_a), _params(run_b)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == torch.float64
        torch.testing.assert_close(a[name], b[name], rtol=REL, atol=REL * 1e-2, msg=name)


def _assert_different_training(run_a, run_b):
    """Sensitivity: these two must NOT pass the parity tolerance."""
    a, b = _losses(run_a), _losses(run_b)
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) > 1e3 * REL


@pytest.fixture(scope="session")  # with its tests in one xdist group: made once
def runs(tiny_imagefolder, tmp_path_factory):
    """nd (batch 8), DDP 2 x 4 with and without --sync-bn (with it, its first epoch's
    checkpoint kept for another strategy to continue)."""
    logdir = tmp_path_factory.mktemp("parity")
    common = PARITY + ["--logdir", logdir]
    run_forked("nd.py", common + ["-b", "8", "--run-name", "nd", tiny_imagefolder])
    run_forked("ddp.py", common + ["-b", "4", "--sync-bn", "--save-every", "1", "--run-name",
                                   "ddp", tiny_imagefolder], nproc=2)
    run_forked("ddp.py", common + ["-b", "4", "--run-name", "ddp_local_bn", tiny_imagefolder],
               nproc=2)
    return logdir


def test_ddp_matches_nd_exactly(runs, tiny_imagefolder):
    _assert_same_training(runs / "nd", runs / "ddp")
    assert [r["count"] for r in records(runs / "ddp", "train")] == [8] * 24
    assert records(runs / "ddp", "run")[0]["precision"]["dtype"] == "float64"
    # the tolerance catches a gradient average off by 2x (same as doubling the lr) ...
    run_forked("nd.py", PARITY + ["--logdir", runs, "-b", "8", "--lr", "0.8",
                                  "--run-name", "nd_2x", tiny_imagefolder])
    _assert_different_training(runs / "nd", runs / "nd_2x")
    # ... and BatchNorm over each rank's half batch instead of the global batch
    _assert_different_training(runs / "nd", runs / "ddp_local_bn")


def test_horovod_matches_nd_and_ddp_exactly(runs, tiny_imagefolder):
    pytest.importorskip("horovod.torch", reason="Horovod is not built: "
                                                "bash launch/install_horovod.sh")
    from test_horovod import run_hvd

    common = PARITY + ["--logdir", runs, "-b", "4", tiny_imagefolder]
    run_hvd(common + ["--sync-bn", "--run-name", "hvd"])
    run_hvd(common + ["--run-name", "hvd_local_bn"])
    _assert_same_training(runs / "nd", runs / "hvd")
    _assert_same_training(runs / "ddp_local_bn", runs / "hvd_local_bn")
    # and it trains, with the run's record a Horovod run's: 2 gloo ranks, global batch 8
    epochs = records(runs / "hvd", "train_epoch")
    assert [e["count"] for e in epochs] == [64, 64, 64]  # 2 ranks x 8 steps x 4
    assert epochs[-1]["loss"] < 0.5 * epochs[0]["loss"]  # 1.05 -> 0.21 (measured)
    assert [v["count"] for v in records(runs / "hvd", "val")] == [20, 20, 20]
    run = records(runs / "hvd", "run")[0]
    assert (run["strategy"], run["world_size"], run["backend"]) == ("hvd", 2, "gloo")
    assert run["global_batch"] == 8 and run["lr"] == pytest.approx(0.4 * 8 / 256)


def test_sync_parameter_server_matches_ddp_exactly(runs, tiny_imagefolder):
    """The server's SGD on the 2 workers' mean gradient is DDP's update. Workers normalise
    their own batches (the parameter server has no SyncBN), so the reference is DDP without
    --sync-bn."""
    run_forked("ps.py", PARITY + ["--logdir", runs, "-b", "4", "--mode", "sync",
                                  "--run-name", "ps", tiny_imagefolder], nproc=3)
    _assert_same_training(runs / "ddp_local_bn", runs / "ps")


@pytest.fixture(scope="session")
def fsdp(runs, tiny_imagefolder):
    """FSDP2 2 x 4 with --sync-bn, in the parity runs' folder, its first epoch's checkpoint
    kept for DDP to continue."""
    run_forked("fsdp.py", PARITY + ["--logdir", runs, "-b", "4", "--sync-bn", "--save-every",
                                    "1", "--run-name", "fsdp", tiny_imagefolder], nproc=2)
    return runs / "fsdp"


def test_fsdp_matches_nd_and_ddp_exactly(runs, fsdp, tiny_imagefolder):
    """FSDP2 with --sync-bn trains as nd on the global batch does, and without it as DDP does
    (BatchNorm over each rank's half batch)."""
    run_forked("fsdp.py", PARITY + ["--logdir", runs, "-b", "4", "--run-name", "fsdp_local_bn",
                                    tiny_imagefolder], nproc=2)
    _assert_same_training(runs / "nd", runs / "fsdp")
    _assert_same_training(runs / "ddp_local_bn", runs / "fsdp_local_bn")
    run = records(runs / "fsdp", "run")[0]
    assert run["entry"] == "fsdp" and run["world_size"] == 2


@pytest.mark.experiment
def test_local_sgd_averaging_after_every_step_matches_ddp_exactly(runs, tiny_imagefolder):
    """The local SGD experiment with --local-sgd-period 1: each rank steps on its own gradients and the weights are averaged
    after every step. SGD's update (momentum and weight decay included) is linear in the
    gradient and every rank starts the step from the same weights, so that is DDP's update.
    Averaging every 4 steps instead must train differently. (With --sync-bn: BatchNorm over
    each rank's 4 images makes this tiny run chaotic, so that float64's rounding differences
    between averaging weights and averaging gradients grow to 1e-3 in 20 steps.)"""
    common = PARITY + ["--logdir", runs, "-b", "4", "--sync-bn", tiny_imagefolder]
    run_forked(LOCAL_SGD, common + ["--local-sgd-period", "1", "--run-name", "local1"], nproc=2)
    run_forked(LOCAL_SGD, common + ["--local-sgd-period", "4", "--run-name", "local4"], nproc=2)
    _assert_same_training(runs / "ddp", runs / "local1")
    _assert_different_training(runs / "ddp", runs / "local4")
    assert records(runs / "local4", "run")[0]["local_sgd"] == {
        "period": 4, "warmup_steps": 0, "outer_lr": 1.0, "outer_momentum": 0.0}


@pytest.mark.parametrize("first,then", [("fsdp.py", "ddp.py"), ("ddp.py", "fsdp.py")])
def test_a_checkpoint_continues_under_the_other_of_fsdp_and_ddp(runs, fsdp, tiny_imagefolder,
                                                                 first, then):
    """A checkpoint is the same file whichever strategy wrote it: the first epoch's checkpoint
    of one strategy's 3-epoch run, resumed under the other for epochs 2-3, continues the
    training (momentum included) as DDP's own 3 epochs do."""
    name = f"{first[:-3]}_then_{then[:-3]}"
    (runs / name).mkdir()
    shutil.copy(runs / first[:-3] / "checkpoint-epoch0.pth", runs / name / "checkpoint.pth")
    run_forked(then, PARITY + ["--logdir", runs, "-b", "4", "--sync-bn", "--run-name", name,
                               "--resume", "auto", tiny_imagefolder], nproc=2)
    assert [r["epoch"] for r in records(runs / name, "train_epoch")] == [1, 2]
    straight, resumed = weights(runs / "ddp")["model"], weights(runs / name)["model"]
    for key, value in straight.items():
        if value.is_floating_point() and "running" not in key:
            torch.testing.assert_close(resumed[key], value, rtol=REL, atol=REL * 1e-2, msg=key)
