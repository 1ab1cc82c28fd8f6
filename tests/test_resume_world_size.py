"""Resuming on another number of processes: a mid-epoch checkpoint continues with every sample
of the epoch trained on exactly once, and where exact continuation is impossible the run says so
(exit 2). Real torchrun runs, interrupted by SIGTERM as a job scheduler does; the runs that
only make a checkpoint to start from, and the resumes, are forked (conftest.run_forked)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch

from conftest import (REPO, TESTS, TINY, forked_command, forked_env, records, run_forked,
                      script_env, traced, traced_samples)
from step_hold import held, hold_env, release, wait_for

pytestmark = pytest.mark.slow  # every test here starts real processes

TRAIN_IMAGES = 64  # tiny_imagefolder: 4 classes x 16


def _traced(nproc: int, trace_dir, args, output, hold: dict = None,
            forked: bool = False) -> subprocess.Popen:
    """train/ddp.py on `nproc` processes under torchrun, its samples traced, its output to the
    file `output`; `hold`: held after a step (step_hold.hold_env); forked: its ranks forked
    from the server instead (conftest.forked_env), as torchrun would start them."""
    prefix, env = traced("ddp.py", trace_dir)
    if hold:
        prefix, env = [str(TESTS / "step_hold.py"), *prefix], {**env, **hold}
    if forked:
        cmd = forked_command(prefix[0], [*prefix[1:], *args], nproc)
        env = forked_env(env)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *prefix, *map(str, args)]
        env = {**script_env(), **env}
    with open(output, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


@pytest.mark.parametrize("before,after", [(1, 2), (2, 1)])
def test_mid_epoch_resume_on_another_process_count_trains_every_sample_once(
        tiny_imagefolder, tmp_path, before, after):
    # The same global batch (8) on both sides: -b 8 on one process, -b 4 on two.
    common = TINY + ["-j", "0", "--epochs", "1", "--seed", "5", "--logdir", tmp_path,
                     "--run-name", "cut", tiny_imagefolder]
    # Every rank waits after its 2nd step until the signal has reached all of them: they stop
    # at step 2 (16 samples) whatever the speed of the CPU and of this test's process.
    hold_dir, out = tmp_path / "hold", tmp_path / "first.txt"
    first = _traced(before, tmp_path / "first", common + ["-b", 8 // before], out,
                    hold_env(2, hold_dir))
    try:
        wait_for(held(hold_dir, before), "held after step 2", first, output=out.read_text)
        first.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
        wait_for(lambda: all(f"=> rank {r}: SIGTERM received" in out.read_text()
                             for r in range(before)),
                 "SIGTERM received by every rank", first, output=out.read_text)
        release(hold_dir)
        first.wait(timeout=300)
    finally:
        first.kill()
    output = out.read_text()
    assert "exiting with status 75" in output, output
    state = torch.load(tmp_path / "cut/checkpoint.pth", weights_only=True)
    done = state["epoch_samples"]
    assert state["epoch"] == 0 and state["world_size"] == before and done == 16
    assert sorted(traced_samples(tmp_path / "first")) == sorted(set(traced_samples(tmp_path / "first")))
    assert len(traced_samples(tmp_path / "first")) == done

    # the resume, which nothing interrupts, forked
    second = _traced(after, tmp_path / "second", common + ["-b", 8 // after, "--resume", "auto"],
                     tmp_path / "second.txt", forked=True)
    try:
        code = second.wait(timeout=300)
    finally:
        second.kill()
    assert code == 0, (tmp_path / "second.txt").read_text()
    seen = traced_samples(tmp_path / "first") + traced_samples(tmp_path / "second")
    assert sorted(seen) == list(range(TRAIN_IMAGES))  # each image once: none twice, none lost
    resumed = [r for r in records(tmp_path / "cut", "train") if r["epoch_step"] > done // 8]
    assert resumed and resumed[0]["epoch_step"] == done // 8 + 1  # it went on from there


def test_a_position_the_new_global_batch_cannot_reach_is_refused(tiny_imagefolder, tmp_path):
    """A checkpoint taken after 12 samples (3 steps of 4 on one process) cannot continue
    exactly with global batch 8 (2 processes x 4): exit 2 naming both world sizes."""
    args = TINY + ["-b", "4", "--epochs", "1", "--steps-per-epoch", "3", "--logdir", tmp_path]
    run_forked("ddp.py", args + ["--run-name", "one", tiny_imagefolder])
    state = torch.load(tmp_path / "one/checkpoint.pth", weights_only=True)
    # As the preemption signal would have left it: inside epoch 0, after 3 steps.
    state.update(epoch=0, epoch_step=3, epoch_samples=12)
    torch.save(state, tmp_path / "mid.pth")
    # a resume, forked as the others are: its two ranks as torchrun starts them
    proc = run_forked("ddp.py", args + ["--run-name", "two", "--resume", tmp_path / "mid.pth",
                                        tiny_imagefolder], nproc=2, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]  # the first rank's status: bad input
    assert "after 12 samples of epoch 0 (world size 1, global batch 4)" in proc.stderr
    assert "(world size 2, global batch 8) cannot continue exactly there" in proc.stderr


def test_a_checkpoint_past_the_last_step_of_this_runs_epoch_goes_on_to_validation(
        tiny_imagefolder, tmp_path):
    """Stopped after 36 samples of epoch 0 where this run's epoch is 3 steps of 8 (24 samples):
    nothing of epoch 0 is left to train, whether or not 8 divides 36; the run validates epoch 0
    and goes on with epoch 1."""
    args = TINY + ["-b", "4", "--steps-per-epoch", "3", "--logdir", tmp_path]
    run_forked("ddp.py", args + ["--epochs", "1", "--run-name", "one", tiny_imagefolder])
    state = torch.load(tmp_path / "one/checkpoint.pth", weights_only=True)
    state.update(epoch=0, epoch_step=9, epoch_samples=36)
    torch.save(state, tmp_path / "late.pth")
    run_forked("ddp.py", args + ["--epochs", "2", "--run-name", "two", "--resume",
                                 tmp_path / "late.pth", tiny_imagefolder], nproc=2)
    assert [r["epoch"] for r in records(tmp_path / "two", "val")] == [0, 1]
    assert {r["epoch"] for r in records(tmp_path / "two", "train")} == {1}
