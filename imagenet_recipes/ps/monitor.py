"""The server's failure monitor: finds workers that died or hang, so no round waits forever.

A worker the server has waited on for PROBE_AFTER_S is pinged; a live worker answers from its
RPC threads even mid-step. One that does not answer is lost at once; one that answers but stays
silent past --dist-timeout is lost too. What losing a worker means (the run stops, or async
carries on) is the server's decision, not the monitor's.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional, Tuple

import torch.distributed.rpc as rpc

from . import wire

PROBE_AFTER_S = 2.0
PROBE_TIMEOUT_S = 5.0


def probe(worker: int) -> Optional[str]:
    """None if the worker's process answers, else why not."""
    try:
        rpc.rpc_sync(wire.worker_name(worker), wire.ping, timeout=PROBE_TIMEOUT_S)
        return None
    except Exception as err:  # connection refused / reset / timeout
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"its process does not answer: {first[:200]}"


class FailureMonitor:
    """Runs in its own thread until `finished` is set.

    `suspects()` -> (workers the server is waiting on, seconds it has waited);
    `lose(worker, reason)` is called for each one found dead or hung."""

    def __init__(self, suspects: Callable[[], Tuple[List[int], float]],
                 lose: Callable[[int, str], None], finished: threading.Event,
                 dist_timeout: float):
        self.suspects, self.lose = suspects, lose
        self.finished, self.dist_timeout = finished, dist_timeout
        self.thread = threading.Thread(target=self._watch, name="ps-monitor", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _watch(self) -> None:
        while not self.finished.wait(1.0):
            workers, waited = self.suspects()
            if waited < PROBE_AFTER_S:
                continue
            for worker in workers:
                reason = probe(worker)
                if reason is None and waited > self.dist_timeout:
                    reason = (f"alive but silent for {waited:.0f} s (--dist-timeout "
                              f"{self.dist_timeout:g})")
                if reason is not None:
                    self.lose(worker, reason)
