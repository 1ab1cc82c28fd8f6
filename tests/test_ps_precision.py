"""Parameter-server workers at every opt level, half-precision pushes, and DALI in the workers."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from conftest import RESNET18, TINY, records, run_forked

from imagenet_recipes.precision import Precision
from imagenet_recipes.ps.worker import GradientCapture
from imagenet_recipes.strategies import Strategy

CPU = torch.device("cpu")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _batch(scale=1.0):
    torch.manual_seed(1)
    return torch.randn(16, 6) * scale, torch.randint(0, 3, (16,))


def _capture(precision: Precision, model: nn.Module, images, targets):
    """One sync worker step as worker.py takes it, through the single-process strategy (the
    model converted in place): the gradients the push would carry."""
    strategy = Strategy(precision, device="cpu")
    strategy.device = CPU  # `precision` is bound already (binding again would reset its scale)
    forward = strategy.setup_module(model)
    capture = GradientCapture([p for _, p in strategy.named_optimizer_params()])
    strategy.backward(nn.functional.cross_entropy(forward(images), targets))
    strategy.optimizer_step(capture)
    return capture.captured


def test_a_workers_push_carries_the_unscaled_gradient_and_leaves_the_weights_alone():
    reference = _model()
    images, targets = _batch()
    nn.functional.cross_entropy(reference(images), targets).backward()
    # A power-of-two loss scale is exact in float32: the unscaled gradient is bit-identical.
    precision = Precision("O0", loss_scale="1024")
    precision.bind(CPU)
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    captured = _capture(precision, model, images, targets)
    assert [g.dtype for g in captured] == [torch.float32] * 6
    for got, p in zip(captured, reference.parameters()):
        assert torch.equal(got, p.grad)
    for p, p0 in zip(model.parameters(), before):
        assert torch.equal(p, p0)  # the server updates; the worker only reports


def test_an_overflowing_step_pushes_nothing_and_lowers_the_dynamic_scale():
    precision = Precision("O1", amp_dtype="float16")  # dynamic loss scaling, as on a GPU
    precision.bind(CPU, notice=lambda message: None)
    scale = precision.loss_scale()
    images, targets = _batch()
    assert _capture(precision, _model(), images, targets) is not None
    images[0, 0] = float("inf")
    assert _capture(precision, _model(), images, targets) is None
    assert precision.loss_scale() == scale / 2


def test_o2_pushes_the_fp32_master_gradients_and_pulls_into_the_masters_exactly():
    precision = Precision("O2", amp_dtype="bfloat16")
    precision.bind(CPU, notice=lambda message: None)
    model = precision.convert_module(_model())
    images, targets = _batch()
    captured = _capture(precision, model, images, targets)
    # Half layers' gradients arrive in float32 (the masters'), BatchNorm's are float32 anyway.
    assert [g.dtype for g in captured] == [torch.float32] * 6
    assert [p.dtype for p in model.parameters()] == [torch.bfloat16, torch.bfloat16,
                                                     torch.float32, torch.float32,
                                                     torch.bfloat16, torch.bfloat16]
    # The servers' float32 weights: the masters take them exactly, the model their rounding.
    values = [torch.randn(p.shape) for p in model.parameters()]
    precision.load_parameters(model, values)
    masters = [p for _, p in precision.named_optimizer_params(model)]
    for master, p, value in zip(masters, model.parameters(), values):
        assert torch.equal(master, value)
        assert torch.equal(p, value.to(p.dtype))
    assert any(not torch.equal(p.float(), v) for p, v in zip(model.parameters(), values))


STEPS = TINY + ["-b", "4", "--lr", "0.2", "--seed", "2", "--epochs", "1",
                "--steps-per-epoch", "4"]
# A fresh resnet18's float16 gradients overflow GradScaler's first scales (a tiny model's do not)
RESNET18_STEPS = RESNET18 + STEPS[len(TINY):]


@pytest.mark.slow
def test_o2_bf16_workers_push_bf16_to_two_servers_that_keep_fp32_weights(tiny_imagefolder,
                                                                         tmp_path):
    run_forked("ps.py", STEPS + ["--mode", "sync", "--num-servers", "2", "--opt-level", "O2",
                                 "--amp-dtype", "bfloat16", "--push-dtype", "bfloat16",
                                 "--logdir", tmp_path, "--run-name", "o2", tiny_imagefolder],
               nproc=4)
    run = records(tmp_path / "o2", "run")[0]
    assert run["precision"]["opt_level"] == "O2" and run["precision"]["dtype"] == "bfloat16"
    assert run["push_dtype"] == "bfloat16"
    # 2 bytes a pushed gradient, 4 a pulled weight (the servers' float32): shard 1 carries no
    # BatchNorm buffers, so its counts are exact. The totals go with the 4th push, before its
    # answer (and the initial weights all came from server 0).
    last = records(tmp_path / "o2", "worker")[-1]
    shard1 = run["shard_sizes"][1]
    assert last["bytes_pushed_per_server"][1] == 4 * 2 * shard1
    assert last["bytes_pulled_per_server"][1] == 3 * 4 * shard1
    losses = [r["loss"] for r in records(tmp_path / "o2", "train")]
    assert len(losses) == 4 and all(0 < loss < 10 for loss in losses)
    # The servers hold fp32 masters: the trained weights are not all bf16 values.
    state = torch.load(tmp_path / "o2" / "checkpoint.pth", map_location="cpu",
                       weights_only=True)["model"]
    weights = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 4]
    assert all(v.dtype == torch.float32 for v in weights)
    assert any(not torch.equal(v, v.bfloat16().float()) for v in weights)


@pytest.mark.slow
def test_o1_fp16_workers_with_loss_scaling_read_through_dali(tiny_imagefolder, tmp_path):
    pytest.importorskip("nvidia.dali", reason="DALI is in requirements.txt; this env lacks it")
    run_forked("ps.py", RESNET18_STEPS + [
        "--mode", "async", "--opt-level", "O1", "--amp-dtype", "float16", "--data-backend",
        "dali-cpu", "--split", "by-class", "--logdir", tmp_path, "--run-name", "o1",
        tiny_imagefolder], nproc=3)
    run = records(tmp_path / "o1", "run")[0]
    assert run["precision"] == {"opt_level": "O1", "dtype": "float16",
                                "loss_scaling": "GradScaler"}
    workers = records(tmp_path / "o1", "worker")
    assert {r["worker"] for r in workers} == {1, 2}
    # GradScaler's dynamic scale starts at 2**16, which overflows a fresh resnet18's float16
    # gradients for several steps: each such step pushes nothing and halves that worker's
    # scale (it would grow again only after 2000 clean steps).
    for w in (1, 2):
        mine = [r for r in workers if r["worker"] == w]
        scale = 2.0 ** 16
        for r in mine:
            assert r["overflows"] in (0, 1)
            scale /= 2 ** r["overflows"]
            assert r["loss_scale"] == scale, mine
        assert mine[0]["overflows"] == 1
    # The epoch is 2 workers x 4 steps x 4 images; a push in flight when it ends still counts.
    assert 2 * 4 * 4 <= sum(r["samples"] for r in workers) <= 2 * 5 * 4
    assert [r["count"] for r in records(tmp_path / "o1", "val")] == [20]
    assert records(tmp_path / "o1", "end")[0]["reason"] == "finished"
