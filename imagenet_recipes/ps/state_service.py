"""ESync's state query service (Li et al., "ESync: Accelerating Intra-Domain Federated Learning
in Heterogeneous Data Centers"): before each local step a worker asks whether it should keep
training locally or is ready to aggregate. Within one round the slowest worker takes one step;
every other worker takes as many as fit into that time.

All times are the server's own clock, taken when a query arrives: a worker queries right after
each local step, so the time between two of its queries is its step *including* the query's
round trip, and the workers' clocks never need to agree. Two rules decide whether another step
fits (`--esync-rule`):

reference  the authors' rule (Lizonghang/ESync, SimpleStateServer/server/views.py): the slowest
           worker is the one whose newest step took longest. A worker is ready to aggregate when
           it is that worker, when that worker is ready, or when its own newest step plus
           `epsilon` seconds would end after the slowest worker's current step is expected to
           end (that step's start + its newest duration). While the slowest worker has not yet
           begun the round, the others keep stepping.
estimate   a moving average of each worker's step time: another step is taken while the time
           the worker has spent in this round plus one more of its average steps stays within
           the slowest worker's average step (5 % tolerance). Steadier under jitter; reacts to
           a worker that slows down within a few rounds.

Until every worker has reported a step time (the first round), each worker takes one step,
which is plain synchronous local SGD.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

RULES = ("reference", "estimate")


class EsyncStateService:
    # estimate rule: a step that overshoots the slowest worker's time by this fraction still
    # counts as fitting (step times jitter, and a fast worker idling most of a step is the
    # larger loss); the newest step's weight in the moving average.
    TOLERANCE = 0.05
    SMOOTHING = 0.5

    def __init__(self, workers: int, max_local_steps: int, rule: str = "reference",
                 epsilon: float = 0.5, clock: Callable[[], float] = time.monotonic):
        if rule not in RULES:
            raise ValueError(f"unknown ESync rule {rule!r}: one of {', '.join(RULES)}")
        self.rule, self.epsilon, self.clock = rule, epsilon, clock
        self.max_local_steps = max_local_steps
        self.round = 0
        self.round_of: List[Optional[int]] = [None] * workers  # the round a worker is in
        self.round_start: List[float] = [0.0] * workers
        self.step_start: List[float] = [0.0] * workers  # when its current step began
        self.newest: List[Optional[float]] = [None] * workers  # its newest step's duration
        self.average: List[Optional[float]] = [None] * workers
        self.ready = [False] * workers
        self._lock = threading.Lock()

    def should_step(self, index: int, round_: int, local_steps: int) -> bool:
        """Worker `index`, in round `round_` (the server step of the weights it holds), has
        taken `local_steps` local steps this round: may it take another one?"""
        now = self.clock()
        with self._lock:
            if round_ > self.round:  # the first query of a new round resets everyone's flags
                self.round, self.ready = round_, [False] * len(self.ready)
            if local_steps == 0:
                self.round_of[index], self.round_start[index] = round_, now
            else:
                self._record_step(index, now - self.step_start[index])
            self.step_start[index] = now
            go = local_steps == 0 or (local_steps < self.max_local_steps
                                      and None not in self.newest
                                      and self._another_fits(index, now))
            self.ready[index] = not go
            return go

    def _record_step(self, index: int, seconds: float) -> None:
        self.newest[index] = seconds
        old = self.average[index]
        self.average[index] = seconds if old is None else (
            self.SMOOTHING * seconds + (1 - self.SMOOTHING) * old)

    def _another_fits(self, index: int, now: float) -> bool:
        if self.rule == "estimate":
            spent = now - self.round_start[index]
            return spent + self.average[index] <= max(self.average) * (1 + self.TOLERANCE)
        slowest = max(range(len(self.newest)), key=lambda i: self.newest[i])
        if self.round_of[slowest] != self.round:
            return True  # it has not begun this round: nothing to wait for yet
        if index == slowest or self.ready[slowest]:
            return False
        remaining = self.step_start[slowest] + self.newest[slowest] - now
        return self.newest[index] + self.epsilon <= remaining

    def estimates(self) -> List[Optional[float]]:
        """Each worker's step time as the rule sees it."""
        with self._lock:
            return list(self.newest if self.rule == "reference" else self.average)
