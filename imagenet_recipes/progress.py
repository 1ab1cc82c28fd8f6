"""Time left, for the progress lines of the engine and the parameter server.

The run's ETA extrapolates the rate of THIS process since it started (validation, checkpoints
and everything else included), so a resumed run does not count the time of the run it
continues, and the first epoch's ETA settles as soon as a few intervals have passed.
"""
from __future__ import annotations

import datetime
import time


def duration(seconds: float) -> str:
    """H:MM:SS, with days when there are any (e.g. '2 days, 3:04:05')."""
    return str(datetime.timedelta(seconds=int(max(seconds, 0.0))))


class RunClock:
    """Work done (in any unit: samples, steps) against wall time since `start(done)`."""

    def __init__(self, total: float):
        self.total = total
        self.started_at, self.done_at_start = time.perf_counter(), 0.0

    def start(self, done: float) -> None:
        """Count from now, with `done` units already behind (a resumed run's position)."""
        self.started_at, self.done_at_start = time.perf_counter(), done

    def eta(self, done: float) -> str:
        """Time left to `total` at the rate since `start`; '?' before any work is done."""
        progress = done - self.done_at_start
        if progress <= 0:
            return "?"
        rate = progress / (time.perf_counter() - self.started_at)
        return duration((self.total - done) / rate)
