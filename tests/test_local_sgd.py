"""Local SGD over DDP (`--local-sgd-period`, `--local-sgd-warmup-steps`): when it communicates,
and that a run resumes exactly. Its float64 parity with DDP at period 1 is in
tests/test_parity.py."""
from __future__ import annotations

import pytest

from conftest import TINY, assert_resume_is_exact, records, run_script

from recipe.strategies.ddp import LocalSGD


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


@pytest.mark.slow
def test_local_sgd_resumes_exactly(tiny_imagefolder, tmp_path):
    """8 steps an epoch, the first 2 DDP, then averaging after steps 2, 5, 8, ...: the epoch
    ends between two averaging points, where validation and the checkpoint average the models
    (and the momentum) in the uninterrupted run and in the one that stops there alike."""
    args = TINY + ["-b", "4", "--lr", "0.2", "--seed", "2", "--local-sgd-period", "3",
                   "--local-sgd-warmup-steps", "2"]
    straight = assert_resume_is_exact(lambda argv: run_script("ddp.py", argv, nproc=2), args,
                                      tiny_imagefolder, tmp_path)
    assert straight["optimizer"]["local_sgd_step"] == 16
    assert records(tmp_path / "cut", "run")[-1]["local_sgd"] == {"period": 3, "warmup_steps": 2}
