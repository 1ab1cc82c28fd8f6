"""bench.slow_workers, the benchmarks' emulated straggler (its ddp and ps modules, run with -m:
--worker-slowdown, --slowdown-from-epoch) and the product's seam it plugs into,
`TrainConfig.step_hooks`: the product has no such option, the engine calls the hooks after each
step, each process gets its own factor, and a list that does not fit the processes stops every
rank before it trains. What a slow worker changes in the parameter server (ESync gives the fast
worker more local steps, async records the slow worker's staleness) is in tests/test_ps.py, whose
learning runs start bench.slow_workers.ps: they test the PS worker's call of the hooks too."""
from __future__ import annotations

import pytest

from conftest import TINY

from imagenet_recipes.config import TrainConfig, UsageError, parse_args
from imagenet_recipes.experiments.local_sgd import LocalSGDConfig
from imagenet_recipes.bench.slow_workers import Slowdown, SlowTrainConfig, options
from imagenet_recipes.bench.slow_workers.ps import SlowPSConfig
from imagenet_recipes.bench.slow_workers.ps import main as slow_ps
from imagenet_recipes.ps.config import PSConfig



@pytest.mark.parametrize("entry,config_cls", [("ddp", TrainConfig), ("ps", PSConfig)])
def test_the_product_has_no_slowdown_option(entry, config_cls, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--dummy", "--worker-slowdown", "1,3"], config_cls=config_cls, entry=entry)
    assert exit_.value.code == 2
    assert "unknown option --worker-slowdown" in capsys.readouterr().err
    assert parse_args(["--dummy"], config_cls=config_cls, entry=entry).step_hooks(0, 2) == ()


@pytest.mark.parametrize("config_cls,entry", [(SlowTrainConfig, "ddp"), (SlowPSConfig, "ps"),
                                              (LocalSGDConfig, "ddp")])
def test_each_process_gets_its_own_factor_and_a_full_speed_one_no_hook(config_cls, entry):
    cfg = parse_args(["--dummy", "--worker-slowdown", "1,3", "--slowdown-from-epoch", "2"],
                     config_cls=config_cls, entry=entry)
    assert cfg.step_hooks(0, 2) == ()
    (hook,) = cfg.step_hooks(1, 2)
    assert isinstance(hook, Slowdown) and (hook.factor, hook.from_epoch) == (3.0, 2)
    with pytest.raises(UsageError, match="has 2 factors but there are 3 processes"):
        cfg.step_hooks(0, 3)


@pytest.mark.parametrize("args,message", [
    (["--worker-slowdown", "1,0.5"], "must be >= 1"),
    (["--worker-slowdown", "1,fast"], "comma-separated numbers"),
    (["--slowdown-from-epoch", "-1"], "counts epochs from 0"),
])
def test_bad_slowdowns_are_refused(args, message):
    with pytest.raises(UsageError, match=message):
        parse_args(["--dummy", *args], config_cls=SlowPSConfig, entry="ps")


def test_the_hook_sleeps_factor_minus_one_times_the_step_from_its_epoch(monkeypatch):
    slept = []
    monkeypatch.setattr(options.time, "sleep", slept.append)
    hook = Slowdown(3.0, from_epoch=1)
    hook(0, 0.5)
    hook(1, 0.5)
    hook(4, 0.25)
    assert slept == [1.0, 0.5]


def test_the_engine_calls_the_hooks_after_each_step_from_the_epoch_given(tmp_path, monkeypatch):
    """--slowdown-from-epoch 1 on a 2-epoch run: epoch 0 at full speed, then each step followed
    by a sleep of (factor - 1) x its own time."""
    from imagenet_recipes.engine import Trainer
    from imagenet_recipes.strategies import Strategy
    from imagenet_recipes.options import StrategyOptions

    cfg = parse_args(["--dummy", "-a", "resnet18", "--image-size", "32", "-b", "4",
                      "--device", "cpu", "--logdir", str(tmp_path), "--epochs", "2",
                      "--synthetic-train-size", "12", "--synthetic-val-size", "4",
                      "--worker-slowdown", "3", "--slowdown-from-epoch", "1"],
                     config_cls=SlowTrainConfig)
    slept = []
    trainer = Trainer(cfg, Strategy.build(StrategyOptions.of(cfg)), "nd")
    monkeypatch.setattr(options.time, "sleep", lambda s: slept.append((trainer.epoch, s)))
    trainer.setup()
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert [epoch for epoch, _ in slept] == [1, 1, 1]  # 3 steps per epoch
    assert all(seconds > 0 for _, seconds in slept)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_list_that_does_not_match_the_workers_stops_every_rank_before_rpc(
        tiny_imagefolder, tmp_path, monkeypatch, capsys, rank):
    """bench.slow_workers.ps's main in this process, as rank `rank` of 3 (a server and 2
    workers): each rank checks the list before RPC starts, so nobody waits for a peer that gave
    up (without MASTER_ADDR a rank that reached RPC's start would fail with another message)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        slow_ps(argv=[str(a) for a in TINY] + ["--worker-slowdown", "1,2,3", "--logdir",
                                                str(tmp_path / "runs"), str(tiny_imagefolder)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-2000:]
    assert "has 3 factors but there are 2 workers (world size - 1 server)" in err, err[-2000:]
    assert "Traceback" not in err and not (tmp_path / "runs").exists()
