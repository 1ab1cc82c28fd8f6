"""Validation for the parameter server: in a background thread of the server (so training is
never held up by it), or as a separate process watching a run dir's checkpoints."""
from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn

from .. import checkpoint
from ..models import build_model
from ..runlog import RunLog
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


# --- evaluator mode: `train/ps.py --evaluator RUN_DIR DATA` ------------------------------------
def _training_ended(run_dir: Path) -> bool:
    log = run_dir / "log.jsonl"
    if not log.is_file():
        return False
    lines = log.read_text().splitlines()
    return any(json.loads(line).get("kind") == "end" for line in lines[-5:] if line.strip())


def watch(watched: Path, val_loader, num_classes: int, device: torch.device, log: RunLog,
          idle_timeout: float) -> None:
    """Validate every new checkpoint of the run dir `watched` (any strategy's run) on
    `val_loader` until that run has ended and its last checkpoint was scored, or nothing new
    came for `idle_timeout` seconds (--evaluator-idle-timeout), each score a `val` record of
    `log`."""
    model, seen, idle_since = None, None, time.monotonic()
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
        if time.monotonic() - idle_since > idle_timeout:
            log.print(f"=> evaluator: no new checkpoint for {idle_timeout:g} s")
            break
        time.sleep(1.0)
