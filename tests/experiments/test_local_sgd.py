"""The local SGD experiment (`-m imagenet_recipes.experiments.local_sgd`: `--local-sgd-period`,
`--local-sgd-warmup-steps`, the DiLoCo-style outer step): when it communicates, what an average
does, what it refuses, and that a run resumes exactly. Its float64 parity with DDP at period 1
is in tests/test_parity.py."""
from __future__ import annotations

import pytest
import torch

from conftest import LOCAL_SGD, TINY, assert_resume_is_exact, records, run_forked

from imagenet_recipes.experiments.local_sgd import main
from imagenet_recipes.experiments.local_sgd.strategy import LocalSGD

pytestmark = pytest.mark.experiment


def test_the_schedule_is_ddp_for_the_warm_up_then_local_steps_averaged_every_period():
    schedule = LocalSGD(period=3, warmup_steps=2)
    local, averaged = [], []
    for step in range(10):
        local.append(schedule.local)
        if schedule.stepped():
            averaged.append(step)
    assert local == [False, False] + [True] * 8
    assert averaged == [2, 5, 8]  # as torch's PeriodicModelAverager counts them
    assert schedule.step == 10 and not schedule.in_sync  # step 9 was a local step


def test_the_last_warm_up_step_leaves_the_ranks_in_sync():
    """After a DDP step the weights agree: a validation or checkpoint right there must not
    average (there is no anchor yet to average changes from)."""
    schedule = LocalSGD(period=3, warmup_steps=2)
    for _ in range(2):
        assert not schedule.stepped() and schedule.in_sync
    assert schedule.local  # the next step is the first local one


def test_period_one_averages_after_every_local_step():
    schedule = LocalSGD(period=1, warmup_steps=0)
    assert all(schedule.stepped() for _ in range(5)) and schedule.in_sync


def _averages(schedule: LocalSGD, mean_changes, start=(1.0, -2.0)):
    """The weights after each average of `schedule`, from `start`, each round's ranks having
    moved by the given mean change."""
    params = [torch.tensor(start, dtype=torch.float64)]
    seen = []
    for change in mean_changes:
        schedule.begin(params)
        params[0] += torch.tensor(change, dtype=torch.float64)  # the local steps
        schedule.apply(params, [params[0] - schedule.anchor[0]])
        seen.append(params[0].clone())
    return seen


def test_plain_averaging_moves_the_weights_by_the_mean_change():
    changes = [(0.5, 0.25), (-1.0, 0.5)]
    seen = _averages(LocalSGD(period=2, warmup_steps=0), changes)
    torch.testing.assert_close(seen[-1], torch.tensor([0.5, -1.25], dtype=torch.float64))


def test_the_outer_step_is_nesterov_sgd_on_the_negated_mean_change():
    """DiLoCo's outer optimizer at lr 0.7, momentum 0.9: buffer b = 0.9 b + g,
    update = g + 0.9 b, weights -= 0.7 update, with g = -(mean change)."""
    changes = [(0.5, 0.25), (-1.0, 0.5), (0.125, 0.0)]
    seen = _averages(LocalSGD(period=2, warmup_steps=0, outer_lr=0.7, outer_momentum=0.9),
                     changes)
    w, b = torch.tensor([1.0, -2.0], dtype=torch.float64), None
    for change, got in zip(changes, seen):
        g = -torch.tensor(change, dtype=torch.float64)
        b = g.clone() if b is None else 0.9 * b + g
        w = w - 0.7 * (g + 0.9 * b)
        torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12)
    # outer lr 1 and no momentum: the plain average (sensitivity of the test above)
    assert torch.equal(_averages(LocalSGD(2, 0, outer_lr=1.0), changes)[-1],
                       _averages(LocalSGD(2, 0), changes)[-1])


def test_the_outer_momentum_survives_a_checkpoint():
    changes = [(0.5, 0.25), (-1.0, 0.5), (0.125, 0.0), (0.25, -0.5)]
    straight = _averages(LocalSGD(2, 0, outer_lr=0.7, outer_momentum=0.9), changes)
    first = LocalSGD(2, 0, outer_lr=0.7, outer_momentum=0.9)
    half = _averages(first, changes[:2])
    saved = first.state_dict()
    assert "local_sgd_outer" in saved and saved["local_sgd_step"] == 0
    resumed = LocalSGD(2, 0, outer_lr=0.7, outer_momentum=0.9)
    resumed.load_state_dict(saved)
    rest = _averages(resumed, changes[2:], start=half[-1].tolist())
    torch.testing.assert_close(rest[-1], straight[-1], rtol=0, atol=0)
    forgotten = _averages(LocalSGD(2, 0, outer_lr=0.7, outer_momentum=0.9), changes[2:],
                          start=half[-1].tolist())
    assert not torch.equal(forgotten[-1], straight[-1])  # the momentum matters here


@pytest.mark.slow
@pytest.mark.parametrize("outer", [(1.0, 0.0), (0.7, 0.9)], ids=["plain", "diloco"])
def test_local_sgd_resumes_exactly(tiny_imagefolder, tmp_path, outer):
    """8 steps an epoch, the first 2 DDP, then averaging after steps 2, 5, 8, ...: the epoch
    ends between two averaging points, where validation and the checkpoint average the models
    (and the momentum; DiLoCo-style: with an outer step) in the uninterrupted run and in the
    one that stops there alike."""
    lr, momentum = outer
    args = TINY + ["-b", "4", "--lr", "0.2", "--seed", "2", "--local-sgd-period", "3",
                   "--local-sgd-warmup-steps", "2", "--local-sgd-outer-lr", str(lr),
                   "--local-sgd-outer-momentum", str(momentum)]
    straight = assert_resume_is_exact(lambda argv: run_forked(LOCAL_SGD, argv, nproc=2), args,
                                      tiny_imagefolder, tmp_path)
    assert straight["optimizer"]["local_sgd_step"] == 16
    assert ("local_sgd_outer" in straight["optimizer"]) == (momentum > 0)
    assert records(tmp_path / "cut", "run")[-1]["local_sgd"] == {
        "period": 3, "warmup_steps": 2, "outer_lr": lr, "outer_momentum": momentum}


@pytest.mark.parametrize("args,message", [
    (["--local-sgd-period", "-1"],
     "--local-sgd-period and --local-sgd-warmup-steps must be >= 0"),
    (["--local-sgd-period", "2", "--opt-level", "O2"], "works at O0 and O1 without"),
    (["--local-sgd-period", "2", "--ddp-comm-hook", "bf16"], "works at O0 and O1 without"),
    (["--local-sgd-outer-momentum", "0.9"], "shape local SGD's averaging: give "
                                            "--local-sgd-period too"),
    (["--local-sgd-period", "2", "--local-sgd-outer-momentum", "1"],
     "--local-sgd-outer-momentum in [0, 1)"),
    (["--local-sgd-period", "2", "--local-sgd-outer-lr", "0"], "--local-sgd-outer-lr must be > 0"),
    (["--fp16-allreduce"], "--fp16-allreduce is an option of train/hvd.py"),  # DDP's options
])
def test_bad_options_end_with_one_message(tiny_imagefolder, tmp_path, capsys, args, message):
    """The script's own body, in this process: exit 2, the message, no run directory."""
    with pytest.raises(SystemExit) as end:
        main(argv=[*map(str, TINY + args), "--logdir", str(tmp_path / "runs"),
                   str(tiny_imagefolder)])
    err = capsys.readouterr().err
    assert end.value.code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
