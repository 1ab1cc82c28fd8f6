"""Group `ranks`: two DDP ranks on the one device (on a GPU over gloo with --share-gpus):
exact validation, SyncBatchNorm, preemption and resume."""
import signal

from .gpu_tier import (BATCH, DEVICE, SHARED, SMALL, WORKERS, Run, finite_losses, read_log,
                       train, wait_for_step)


def test_validation_during_training_scores_what_the_checkpoint_holds(runs, images, saw):
    """2 ranks: in-training validation gives exactly the top-1 and image count that nd.py -e
    of the checkpoint gives: DDP without --sync-bn lets each rank's BatchNorm running stats
    drift apart, and validation must score the model the checkpoint holds (rank 0's buffers on
    every rank). The CPU suite has no test of its own for this: it simulates this check."""
    args = [*SMALL, *SHARED]
    log = train(runs, "ranks2-train", "ddp.py", [*args, images], nproc=2)
    assert log["run"][0]["world_size"] == 2
    evaluated = train(runs, "ranks2-eval", "nd.py", [*SMALL[:4], "-j", WORKERS, "--device",
                                                     DEVICE, "-e", "--resume",
                                                     runs / "ranks2-train/checkpoint.pth",
                                                     images])
    during, after = log["val"][-1], evaluated["val"][-1]
    assert during["count"] == after["count"], f"{during['count']} vs {after['count']} images"
    assert during["top1"] == after["top1"], f"top-1 {during['top1']} vs {after['top1']}"
    assert abs(during["loss"] - after["loss"]) <= 1e-4 * abs(after["loss"]), \
        f"loss {during['loss']} vs {after['loss']}"
    saw(f"2 ranks: validation of {during['count']} images, top-1 {during['top1']:.2f} = the "
        "checkpoint's")


def test_sync_batchnorm_trains(runs, images, saw):
    """Ranks sharing one device talk over gloo, where torch's SyncBatchNorm cannot run: the
    cross-rank layer does (an all-reduce, which gloo does for CUDA tensors too)."""
    log = train(runs, "ranks2-syncbn", "ddp.py", [*SMALL, *SHARED, "--sync-bn", images],
                nproc=2)
    losses = finite_losses(log)
    layer = log["run"][0]["sync_bn"]
    assert layer == "CrossRankBatchNorm", f"--sync-bn over gloo used {layer}"
    saw(f"2 ranks, {layer}: {len(losses)} steps, loss {losses[-1]:.3f}")


def preempt_and_resume(runs, name: str, script: str, args: list, nproc: int,
                       env: dict = None) -> int:
    """SIGUSR1 (as SLURM warns before its time limit; torchrun passes it on) once the run is at
    step 3, expect its mid-epoch checkpoint (exit 75 without torchrun), then resume it to the
    end. -> the step it stopped after."""
    run = Run(runs, name, script, [*args, "-p", "1"], nproc, env)
    wait_for_step(run, 3)
    run.proc.send_signal(signal.SIGUSR1)
    run.finish(300, expect=None if nproc else 75)
    log = read_log(runs / name)
    stopped = log["train"][-1]["epoch_step"]
    assert "preempted" in log["end"][-1]["reason"], f"end record: {log['end'][-1]}"
    Run(runs, name, script, [*args, "-p", "1", "--resume", "auto"], nproc, env).finish(300)
    resumed = read_log(runs / name)["train"][len(log["train"]):]
    assert resumed and (resumed[0]["epoch"], resumed[0]["epoch_step"]) == (0, stopped + 1), \
        f"resumed at {resumed[:1]}, expected epoch 0 step {stopped + 1}"
    return stopped


def test_preempted_ranks_resume_where_they_stopped(runs, images, saw):
    args = [*SMALL[:4], "-b", BATCH, "-j", WORKERS, "--epochs", "1", "--steps-per-epoch", "10",
            "--device", DEVICE, *SHARED, images]
    stopped = preempt_and_resume(runs, "ranks2-preempt", "ddp.py", args, nproc=2)
    steps = len(read_log(runs / "ranks2-preempt")["train"])
    assert steps == 10, f"{steps} steps logged over both runs, expected 10"
    saw(f"2 ranks: SIGUSR1 -> mid-epoch checkpoint after step {stopped}; resumed to step 10")
