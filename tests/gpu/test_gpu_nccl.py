"""Group `nccl`: DDP over NCCL with one rank per GPU, on a machine with two GPUs or more
(skipped on one, saying so): exact validation, SyncBatchNorm, the comm hooks, and a killed rank
ending the others. The CPU simulation runs the same over gloo."""
import os
import re
import signal
import time

import pytest
import torch

from .gpu_tier import (DEVICE, SIMULATED, SMALL, WORKERS, Run, children, elapsed,
                       expected_backend, finite_losses, rank_of, train, wait_for_step)

RANKS = 2


@pytest.fixture(autouse=True)
def two_gpus():
    if not SIMULATED and torch.cuda.device_count() < RANKS:
        pytest.skip(f"needs {RANKS} GPUs for one NCCL rank each; this machine has "
                    f"{torch.cuda.device_count()} (the ranks group covers 2 ranks on one GPU "
                    "over gloo)")


@pytest.mark.skipif(SIMULATED, reason="on the CPU this is the ranks group's validation check (2 "
                    "ranks over gloo on one device), which the simulation runs")
def test_nccl_ranks_validate_exactly(runs, images, saw):
    log = train(runs, "nccl-train", "ddp.py", [*SMALL, images], nproc=RANKS)
    assert log["run"][0]["backend"] == expected_backend()
    evaluated = train(runs, "nccl-eval", "nd.py", [*SMALL[:4], "-j", WORKERS, "--device",
                                                   DEVICE, "-e", "--resume",
                                                   runs / "nccl-train/checkpoint.pth", images])
    during, after = log["val"][-1], evaluated["val"][-1]
    assert (during["count"], during["top1"]) == (after["count"], after["top1"])
    saw(f"{RANKS} ranks over {expected_backend()}: validation of {during['count']} images, "
        f"top-1 {during['top1']:.2f} = the checkpoint's")


@pytest.mark.parametrize("extra", [("--sync-bn",), ("--ddp-comm-hook", "fp16"),
                                   ("--ddp-comm-hook", "powersgd", "--powersgd-start-step", "2")],
                         ids=["sync-bn", "fp16-hook", "powersgd"])
def test_nccl_options_train(extra, runs, images, saw):
    name = "nccl-" + "-".join(e.strip("-") for e in extra[:2])
    log = train(runs, name, "ddp_apex.py", [*SMALL, "--steps-per-epoch", "8", *extra, images],
                nproc=RANKS)
    losses = finite_losses(log)
    if "--sync-bn" in extra:  # torch's own, over NCCL (gloo, the CPU simulation: the fallback)
        expected = "SyncBatchNorm" if expected_backend() == "nccl" else "CrossRankBatchNorm"
        assert log["run"][0]["sync_bn"] == expected, log["run"][0]["sync_bn"]
    saw(f"{' '.join(extra)}: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def test_a_killed_rank_ends_the_others_within_seconds(runs, images, saw):
    # SMALL's model, sizes and loader, for far more epochs than the check lets it run; under
    # torchrun in the CPU simulation too (its ranks and its summary are what the check reads)
    run = Run(runs, "nccl-killed", "ddp.py", [*SMALL[:10], "--epochs", "30", "--device", DEVICE,
                                              images], nproc=RANKS, torchrun=True)
    wait_for_step(run, 2)
    workers = [pid for pid in children(run.proc.pid) if rank_of(pid) is not None]
    victim = next(pid for pid in workers if rank_of(pid) == 1)
    os.kill(victim, signal.SIGKILL)
    killed = time.perf_counter()
    output = run.finish(120, expect=None)
    took = elapsed(killed)
    assert run.proc.returncode != 0
    assert took < 60, f"the other ranks took {took:.0f} s to end"
    # the cause is named: torchrun's summary lists the killed rank with its signal, and a
    # survivor says why it stopped (gloo's closed socket, or PeerWatch under NCCL). Which of the
    # two torchrun calls the root cause is whichever exit it saw first: a survivor that notices
    # at once (gloo's reset, with no loader workers to stop) can come first.
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9", output), \
        output[-3000:]
    assert ("communication with the other ranks failed" in output
            or "rank 1 stopped answering" in output), output[-3000:]
    saw(f"rank 1 killed at step 2: the job ended {took:.1f} s later, exit "
        f"{run.proc.returncode}, naming the cause")
