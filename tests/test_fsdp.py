"""FSDP2 (train/fsdp.py): exact resume, an overflow in one rank's shard skipped on every rank,
and the combinations it refuses. (Its float64 parity with nd and DDP, and checkpoints that DDP
continues and the other way round, are in test_parity.py.)"""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from conftest import TINY, assert_resume_is_exact, run_forked, spawn_ranks, unused_port
from imagenet_recipes.models import build_model
from imagenet_recipes.strategies import FSDPStrategy
from test_bad_input import run_in_process
from test_precision import _setup


def _fsdp(argv):
    return run_forked("fsdp.py", argv, nproc=2)


@pytest.mark.slow
def test_fsdp_resume_is_exact(tiny_imagefolder, tmp_path):
    args = TINY + ["-b", "4", "--steps-per-epoch", "3", "--seed", "2", "--opt-level", "O1"]
    state = assert_resume_is_exact(_fsdp, args, tiny_imagefolder, tmp_path)
    whole = build_model(TINY[1], num_classes=4)
    # every tensor whole, not a shard
    assert {k: v.shape for k, v in state["model"].items()} == {
        k: v.shape for k, v in whole.state_dict().items()}
    # the optimizer state numbered as torch.optim numbers it, one momentum per parameter
    numbers = sorted(n for group in state["optimizer"]["param_groups"] for n in group["params"])
    assert numbers == list(range(len(list(whole.parameters())))) == sorted(
        state["optimizer"]["state"])


def _overflow_rank(rank: int, port: int, results) -> None:
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    strategy, _, optimizer = _setup("O1", "float16", strategy_class=FSDPStrategy)
    try:
        shards = [p.to_local() for p in strategy.module.parameters()]
        before = [s.detach().clone() for s in shards]
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 4, (8,), generator=g)
        with strategy.micro_step(last=True):
            loss = torch.nn.functional.cross_entropy(strategy.model(x), y)
            strategy.backward(loss)
        # an overflow in one element of rank 1's shard of the last layer's gradient only
        if rank == 1:
            list(strategy.module.parameters())[-2].grad.to_local().view(-1)[0] = float("inf")
        strategy.optimizer_step(optimizer)
        results[rank] = {"skipped": all(torch.equal(b, s) for b, s in zip(before, shards)),
                         "scale": strategy.precision.loss_scale()}
    finally:
        strategy.teardown()


@pytest.mark.slow
def test_an_overflow_in_one_ranks_shard_skips_the_step_on_every_rank():
    results = mp.Manager().dict()
    spawn_ranks(_overflow_rank, (unused_port(), results), nprocs=2)
    assert results[0] == results[1] == {"skipped": True, "scale": 32768.0}


@pytest.mark.parametrize("args,message", [
    (["--opt-level", "O2"], "--opt-level O2 keeps half weights"),
    (["--opt-level", "O3"], "--opt-level O3 keeps half weights"),
    (["--model-ema"], "--model-ema is an option of train/nd.py, train/dp.py, train/ddp.py"),
    (["--ddp-comm-hook", "fp16"], "--ddp-comm-hook is an option of train/ddp.py"),
    (["--fp16-allreduce"], "--fp16-allreduce is an option of train/hvd.py"),
])
def test_what_fsdp_cannot_do_is_refused(tiny_imagefolder, tmp_path, capsys, args, message):
    code, _, err = run_in_process("fsdp.py", TINY + args + ["--logdir", tmp_path / "runs",
                                                            tiny_imagefolder], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_fsdp_help_leaves_out_what_it_does_not_take(capsys):
    from test_bad_input import _help
    text = _help("fsdp.py", capsys)
    assert "--sync-bn" in text and "--opt-level" in text
    for flag in ("--model-ema", "--ddp-comm-hook", "--fp16-allreduce", "--share-gpus"):
        assert flag not in text, flag
