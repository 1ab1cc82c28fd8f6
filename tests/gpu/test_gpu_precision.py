"""Group `precision`: every opt level in float16 and bfloat16 on the device, O2's layout, an
overflow on one rank, and PowerSGD under float16 loss scaling."""
import os

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from .gpu_tier import (ARCH, BATCH, DEVICE, IMAGE, SHARED, SMALL, WORKERS, finite_losses,
                       train)

LEVELS = [("O0", "float32")] + [(level, dtype) for level in ("O1", "O2", "O3")
                                for dtype in ("float16", "bfloat16")]


@pytest.mark.parametrize("level,dtype", LEVELS, ids=[f"{lv}-{dt}" for lv, dt in LEVELS])
def test_opt_level_trains_in_its_dtype(level, dtype, runs, images, saw):
    extra = ["--opt-level", level] + (["--amp-dtype", dtype] if level != "O0" else [])
    log = train(runs, f"precision-{level}-{dtype}", "nd.py", [*SMALL, *extra, images])
    losses = finite_losses(log)
    assert log["run"][0]["precision"]["dtype"] == dtype
    scales = [r.get("loss_scale") for r in log["train"]]
    if dtype == "float16" and level in ("O1", "O2"):
        assert all(s is not None and s > 0 for s in scales), \
            f"float16 {level} needs a positive dynamic loss scale, logged {scales}"
        text = f", loss scale {scales[0]:g} -> {scales[-1]:g}"
    else:
        assert all(s is None for s in scales), f"no loss scaling expected, logged {scales}"
        text = ", no loss scaling"
    saw(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}{text}")


def test_o2_keeps_half_weights_fp32_batchnorm_and_fp32_masters(tmp_path, saw):
    """In this process: O2 keeps half weights in the model, BatchNorm in fp32, fp32 masters in
    the optimizer, and after steps the model's weights are its masters rounded to half."""
    from torch.nn.modules.batchnorm import _BatchNorm

    from imagenet_recipes.config import parse_args
    from imagenet_recipes.engine import Trainer
    from imagenet_recipes.metrics import SumMeter
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    cfg = parse_args(["--dummy", "-a", ARCH, "--image-size", IMAGE, "-b", BATCH,
                      "--opt-level", "O2", "--amp-dtype", "float16", "--device", DEVICE,
                      "--logdir", str(tmp_path), "--run-name", "o2",
                      "--synthetic-train-size", "64", "--synthetic-val-size", "16"])
    trainer = Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
    trainer.setup()
    try:
        model = trainer.strategy.module
        bn = {id(p) for m in model.modules() if isinstance(m, _BatchNorm) for p in m.parameters()}
        half = {p.dtype for p in model.parameters() if id(p) not in bn}
        kept = {p.dtype for p in model.parameters() if id(p) in bn}
        stats = {b.dtype for m in model.modules() if isinstance(m, _BatchNorm)
                 for b in (m.running_mean, m.running_var)}
        masters = dict(trainer.strategy.named_optimizer_params())
        assert half == {torch.float16}, f"model weights {half}, not float16"
        assert kept == stats == {torch.float32}, f"BatchNorm {kept} / stats {stats}"
        assert {p.dtype for p in masters.values()} == {torch.float32}
        batches = iter(trainer.train_loader)
        for _ in range(3):
            trainer.train_step(batches, SumMeter(("loss", "correct1", "correct5"),
                                                 trainer.device))
        named = dict(model.named_parameters())
        drift = [name for name, m in masters.items()
                 if not torch.equal(named[name], m.to(named[name].dtype))]
        assert not drift, f"model weights differ from their rounded masters: {drift[:3]}"
    finally:
        trainer.close()
    saw(f"model float16, BatchNorm float32, {len(masters)} fp32 masters; after 3 steps the "
        "model is its masters in half")


def _overflow_rank(rank: int, port: int, level: str, results) -> None:
    from imagenet_recipes.precision import Precision
    from imagenet_recipes.strategies import DDPStrategy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    strategy = DDPStrategy(Precision(level, "float16"), device=DEVICE, share_gpus=True)
    device = strategy.setup_environment()
    try:
        torch.manual_seed(0)
        model = strategy.setup_module(nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(8, 4)))
        params = dict(strategy.named_optimizer_params())  # fp32 masters under O2
        optimizer = strategy.setup_optimizer(torch.optim.SGD(params.values(), lr=0.1,
                                                             momentum=0.9))
        precision = strategy.precision
        before = {k: v.detach().clone() for k, v in params.items()}
        g = torch.Generator().manual_seed(rank)

        def step(scale: float) -> None:
            x = (torch.randn(8, 3, 12, 12, generator=g) * scale).to(device)
            y = torch.randint(0, 4, (8,), generator=g).to(device)
            with strategy.micro_step(last=True):
                strategy.backward(nn.functional.cross_entropy(model(x), y))
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()

        step(1e6 if rank == 1 else 1.0)  # only rank 1's batch overflows float16
        skipped = all(torch.equal(before[k], v) for k, v in params.items())
        scale = precision.loss_scale()
        step(1.0)  # a normal step on both ranks
        results[rank] = {"skipped": skipped, "scale": scale,
                         "weights": {k: v.detach().cpu().clone() for k, v in params.items()}}
    finally:
        strategy.teardown()


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_float16_overflow_on_one_rank_skips_the_step_on_every_rank(level, saw):
    from imagenet_recipes.strategies import free_port

    results = mp.Manager().dict()
    mp.spawn(_overflow_rank, args=(free_port(), level, results), nprocs=2)
    assert results[0]["skipped"] and results[1]["skipped"], dict(results)
    assert results[0]["scale"] == results[1]["scale"] == 32768.0  # 65536 halved, on both
    for name, value in results[0]["weights"].items():
        assert torch.equal(value, results[1]["weights"][name]), f"ranks differ in {name}"
    saw(f"{level}: rank 1's overflow skipped the step on both ranks, scale 65536 -> 32768 on "
        "both, and the ranks' weights agree after the next step")


def test_powersgd_under_float16_loss_scaling_keeps_learning(runs, images, saw):
    args = [*SMALL[:4], "-b", BATCH, "-j", WORKERS, "-p", "1", "--epochs", "1",
            "--steps-per-epoch", "8", "--device", DEVICE, *SHARED, "--opt-level", "O1",
            "--amp-dtype", "float16", "--ddp-comm-hook", "powersgd", "--powersgd-start-step",
            "2", images]
    log = train(runs, "powersgd-float16", "ddp_apex.py", args, nproc=2)
    losses = finite_losses(log)
    scales = [r["loss_scale"] for r in log["train"]]
    assert scales[-1] >= 2.0 ** 8, f"the loss scale collapsed: {scales}"
    # learning: the compressed steps (from step 2 on) still bring the loss down, below the
    # first step's and the first compressed step's, on these easy generated classes
    assert max(losses[-3:]) < min(losses[0], losses[2]), f"the loss did not fall: {losses}"
    saw(f"2 ranks, PowerSGD from step 2, float16: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"loss scale {scales[0]:g} -> {scales[-1]:g}")
