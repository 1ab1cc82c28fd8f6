"""Validation for the parameter server: in a background thread of the server (so training is
never held up by it), or as a separate process watching a run dir's checkpoints."""
from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch.nn as nn

from .. import checkpoint, lifecycle
from ..data import Shard, build_loaders
from ..models import build_model
from ..options import LoaderOptions, PlanOptions
from ..run_plan import plan_as_given
from ..strategies.base import pick_device
from ..validation import evaluate


class BackgroundJobs:
    """One thread running queued jobs in order (evaluations, checkpoint writes). An exception
    is kept and re-raised by `check()` / `close()` in the caller's thread."""

    def __init__(self):
        self._queue: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="ps-background", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._queue.put(job)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self.error is None:
                try:
                    job()
                except BaseException as err:  # surfaced by check()/close()
                    self.error = err

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, timeout: Optional[float] = None) -> None:
        """Finish the queued jobs, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)
        self.check()


# --- evaluator mode: `train/ps.py --evaluator RUN_DIR DATA` ----------------------------------------
def _training_ended(run_dir: Path) -> bool:
    log = run_dir / "log.jsonl"
    if not log.is_file():
        return False
    lines = log.read_text().splitlines()
    return any(json.loads(line).get("kind") == "end" for line in lines[-5:] if line.strip())


def watch(cfg) -> None:
    """Validate every new checkpoint of the run in `cfg.evaluator` (any strategy's run) until
    that run has ended and its last checkpoint was scored, or nothing new came for
    --evaluator-idle-timeout seconds. Records go to the evaluator's own run dir."""
    watched = Path(cfg.evaluator)
    if not watched.is_dir():
        from ..errors import UsageError
        raise UsageError(f"--evaluator {watched}: no such run dir")
    device = pick_device(cfg.device)
    plan = plan_as_given(PlanOptions.of(cfg), 1, device.type)
    cfg = lifecycle.planned_config(cfg, plan)  # its records: the config as planned
    _, val_loader, num_classes = build_loaders(LoaderOptions.of(cfg), Shard(), device, plan)
    out_dir = Path(cfg.logdir) / (cfg.run_name or f"{watched.name}-eval")
    log = lifecycle.open_log(out_dir, cfg, is_main=True)
    lifecycle.write_run_record(log, cfg, "ps-evaluator", None, strategy="evaluator",
                               watched=str(watched), world_size=1, device=str(device))
    log.print(f"=> evaluator: watching {watched / checkpoint.LATEST}; logging to {out_dir}")
    model, seen, idle_since = None, None, time.monotonic()
    try:
        while True:
            path = watched / checkpoint.LATEST
            stamp = path.stat().st_mtime_ns if path.is_file() else None
            if stamp is not None and stamp != seen:
                state = checkpoint.load_newest_valid(watched)
                seen, idle_since = stamp, time.monotonic()
                if state is not None:
                    if model is None:
                        model = build_model(state["arch"], num_classes).to(device)
                    model.load_state_dict(state["model"])
                    stats = evaluate(model, val_loader, device, nn.CrossEntropyLoss())
                    log.write("val", epoch=state["epoch"], step=state["step"],
                              samples_seen=state.get("samples", 0),
                              checkpoint=str(state["path"]), **stats)
                    log.print(f" * Evaluated {state['path'].name} (epoch {state['epoch']}, step "
                              f"{state['step']}): top1 {stats['top1']:.3f}  top5 "
                              f"{stats['top5']:.3f}  ({stats['count']} images)")
                continue
            if _training_ended(watched) and (stamp is None or stamp == seen):
                log.print("=> evaluator: the watched run has ended")
                break
            if time.monotonic() - idle_since > cfg.evaluator_idle_timeout:
                log.print(f"=> evaluator: no new checkpoint for {cfg.evaluator_idle_timeout:g} s")
                break
            time.sleep(1.0)
    finally:
        val_loader.close()
        log.close()
