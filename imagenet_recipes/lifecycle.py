"""A run's life, the same for the engine and the parameter server: where it writes, what it
continues from, the records that open and close its log, and the exit status it ends with.

    runs/<prefix><YYYYmmdd-HHMMSS>/   (or runs/<--run-name>/)
        config.json  log.jsonl  events.out.tfevents.*  summary.csv (a row per epoch)
        checkpoint.pth  checkpoint.prev.pth  model_best.pth  model_best_ema.pth (--model-ema)

`--resume auto` continues the newest run of the same entry and arch (or exactly --run-name) in
its own directory; `--resume PATH` starts a new run from that checkpoint's state (PATH a
checkpoint file, or a run dir: its newest valid checkpoint).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from . import checkpoint
from .errors import UsageError
from .runlog import RunLog, environment_info

# Exit statuses, the same for every entry script. 2 (bad input) is config.exit_on_usage_error's.
EXIT_FAILED = 1
# sysexits' EX_TEMPFAIL ("try again later"): the launch scripts requeue the job on it.
PREEMPTED_EXIT_CODE = 75


def _same(obj: Any) -> Any:
    return obj


def planned_config(cfg, plan) -> Any:
    """A copy of `cfg` with its run's plan's values (run_plan.RunPlan.settings), for the run's
    records: config.json, the run record, each checkpoint. `cfg` is unchanged."""
    return dataclasses.replace(cfg, **plan.settings())


def find_resume_state(cfg, prefix: str, broadcast: Callable[[Any], Any] = _same,
                      is_main: bool = True) -> Optional[dict]:
    """The checkpoint `--resume` asks for (its "path" added), or None: start from scratch.

    `broadcast` (the strategy's, from rank 0) makes every rank pick the same run, whatever its
    clock or directory listing says; it is a collective, so every rank must call this."""
    if not cfg.resume:
        return None
    if cfg.resume != "auto":
        path = Path(cfg.resume)
        if not path.is_dir():
            return {**checkpoint.load(path), "path": path}
        state = checkpoint.load_newest_valid(path)  # a run dir: its newest valid checkpoint
        if state is None:
            raise UsageError(f"--resume {path}: that folder has no {checkpoint.LATEST} (nor "
                             f"{checkpoint.PREVIOUS}); give a run dir that holds one, or the "
                             "checkpoint file itself")
        return state
    logdir = Path(cfg.logdir)
    # With --run-name, that run only: never continue some other experiment.
    run_dir = logdir / cfg.run_name if cfg.run_name else checkpoint.find_latest_run(logdir, prefix)
    run_dir = broadcast(run_dir)
    state = checkpoint.load_newest_valid(run_dir) if run_dir else None
    if state is None:
        if is_main:
            print(f"note: --resume auto found no checkpoint under {logdir}; starting from "
                  "scratch", flush=True)
        return None
    if state["path"].name == checkpoint.PREVIOUS and is_main:
        checkpoint.set_aside_damaged(run_dir)
    return state


def check_resume_matches(state: dict, **expected: Any) -> None:
    """Refuse a checkpoint of another model or kind of run (arch, classes, parameter-server
    mode, ...). A key the checkpoint lacks counts as different, except `num_classes`, which
    older checkpoints do not record."""
    differ = {k: v for k, v in expected.items()
              if state.get(k, v if k == "num_classes" else None) != v}
    if differ:
        held = ", ".join(f"{k} {state.get(k)}" for k in differ)
        wanted = ", ".join(f"{k} {v}" for k, v in differ.items())
        raise UsageError(f"--resume {state['path']} holds {held}, but this run has {wanted}: "
                         f"pass the matching flags and data, or another checkpoint")


def run_directory(cfg, prefix: str, resume_state: Optional[dict],
                  broadcast: Callable[[Any], Any] = _same, writes_checkpoints: bool = True
                  ) -> Path:
    """Where this run writes (the same on every rank: `broadcast` is a collective).

    `writes_checkpoints=False` (evaluation only) never continues a run's directory and may
    reuse one that already holds a checkpoint."""
    if cfg.resume == "auto" and resume_state is not None and writes_checkpoints:
        return Path(resume_state["path"]).parent  # continue the interrupted run
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.logdir) / (cfg.run_name or broadcast(prefix + stamp))
    if writes_checkpoints and (run_dir / checkpoint.LATEST).is_file():
        raise UsageError(f"{run_dir} already holds a run's checkpoint: continue it with "
                         "--resume auto, or choose another --run-name")
    return run_dir


def open_log(run_dir: Path, cfg, is_main: bool) -> RunLog:
    """The run's log (JSONL + TensorBoard, main rank only), with the resolved config saved."""
    log = RunLog(run_dir, enabled=is_main)
    if is_main:
        cfg.save(run_dir / "config.json")
    return log


def write_run_record(log: RunLog, cfg, entry: str, resume_state: Optional[dict],
                     **fields: Any) -> None:
    """The first record of every run (the schema is in runlog.py)."""
    log.write("run", config=cfg.to_dict(), entry=entry, **fields,
              resumed_from=str(resume_state["path"]) if resume_state else None,
              **environment_info())


def write_end_record(log: RunLog, epoch: int, step: int, best_top1: float, reason: str,
                     **fields: Any) -> None:
    """The last record: why the run ended ("finished", "preempted by SIGUSR1", "failed: ...",
    "reached --desired-acc ...")."""
    log.write("end", epoch=epoch, step=step, best_top1=best_top1, reason=reason, **fields)


def preempted_message(who: str, signal_name: str) -> str:
    return (f"=> {who}: {signal_name}: checkpoint written; exiting with status "
            f"{PREEMPTED_EXIT_CODE} so the job can be requeued (continue with --resume auto)")


def say_from_signal_handler(text: str) -> None:
    """A line to stdout from a signal handler. Not print: the signal may arrive while the
    interrupted thread is inside a print to the same buffered stdout, and a second print there
    raises "reentrant call inside <_io.BufferedWriter name='<stdout>'>" (seen: a preempted run
    failing instead of checkpointing). os.write goes around the buffer."""
    os.write(sys.stdout.fileno(), (text + "\n").encode())


def resume_step_in_epoch(state: dict, plan, steps_per_epoch: int, world_size: int) -> int:
    """Where in its epoch the checkpoint `state` stopped, in optimizer steps of this run (its
    run_plan.RunPlan `plan` on `world_size` processes).

    The position is kept in global samples, so the sampler continues the same global order
    whatever the number of processes; it must fall on a step boundary of this run."""
    old = state.get("config", {})
    old_world = state.get("world_size", 1)
    old_batch = old.get("batch_size", plan.batch_size) * old_world * old.get("grad_accum", 1)
    # Checkpoints written before the position was kept in samples hold only their steps.
    done = state.get("epoch_samples", state.get("epoch_step", 0) * old_batch)
    if done >= steps_per_epoch * plan.global_batch:
        return steps_per_epoch  # stopped after the epoch's last step: validation is left
    if done % plan.global_batch:
        raise UsageError(
            f"{state['path']} stopped mid-epoch after {done} samples of epoch "
            f"{state['epoch']} (world size {old_world}, global batch {old_batch}); this run "
            f"(world size {world_size}, global batch {plan.global_batch}) cannot continue "
            f"exactly there, because {plan.global_batch} does not divide {done}. Resume with "
            "a global batch that does (-b x processes x --grad-accum), e.g. on "
            f"{old_world} process(es), or from an end-of-epoch checkpoint")
    return done // plan.global_batch
