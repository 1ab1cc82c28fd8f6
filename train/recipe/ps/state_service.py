"""ESync's state query service (Li et al., "ESync: Accelerating Intra-Domain Federated Learning
in Heterogeneous Data Centers", 2019): before each local step a worker asks whether it should
keep training locally or is ready to aggregate.

The rule: within one round, the slowest worker takes exactly one step; every other worker takes
as many steps as fit into that time. The service keeps each worker's recent step time (an
exponential moving average, so a worker that slows down is noticed within a few rounds) and
answers "step" while the worker's time in this round plus one more of its steps stays within the
slowest worker's step time. Until every worker has reported a step time (the first round), each
worker takes one step, which is plain synchronous local SGD."""
from __future__ import annotations

import threading
from typing import List, Optional


class EsyncStateService:
    # A step that overshoots the slowest worker's time by this fraction still counts as fitting:
    # step times jitter, and a fast worker idling most of a step is the larger loss.
    TOLERANCE = 0.05
    SMOOTHING = 0.5  # weight of the newest step time in the moving average

    def __init__(self, workers: int, max_local_steps: int):
        self.step_time: List[Optional[float]] = [None] * workers
        self.max_local_steps = max_local_steps
        self._lock = threading.Lock()

    def report(self, index: int, step_time: float) -> None:
        with self._lock:
            old = self.step_time[index]
            self.step_time[index] = step_time if old is None else (
                self.SMOOTHING * step_time + (1 - self.SMOOTHING) * old)

    def should_step(self, index: int, local_steps: int, elapsed: float) -> bool:
        """May worker `index`, `elapsed` seconds of compute into its round after `local_steps`
        local steps, take another one?"""
        if local_steps == 0:
            return True  # everyone contributes at least one step per round
        if local_steps >= self.max_local_steps:
            return False
        with self._lock:
            if any(t is None for t in self.step_time):
                return False  # first round: measure everyone's step time first
            slowest = max(self.step_time)
            own = self.step_time[index]
        return elapsed + own <= slowest * (1 + self.TOLERANCE)

    def estimates(self) -> List[Optional[float]]:
        with self._lock:
            return list(self.step_time)
