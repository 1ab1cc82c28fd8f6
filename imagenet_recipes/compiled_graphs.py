"""A --compile run's proof, in its records, that it ran compiled code where it says it did:
the graphs torch.compile made while the model trained and while it was evaluated, counted
apart (`compiled_graphs` in the train_epoch and val records). A phase that ran eagerly made
none, so its count stays 0 however the other phase went."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator


def graphs_made() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's own tally: a graph
    loaded from inductor's cache counts, a guard that reuses one does not)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class GraphCount:
    """Graphs made per phase of a run, in this process; nothing when the run does not
    compile."""

    def __init__(self, compiling: bool):
        self.compiling = compiling
        self.made: Dict[str, int] = {}

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        if not self.compiling:
            yield
            return
        before = graphs_made()
        try:
            yield
        finally:
            self.made[phase] = self.made.get(phase, 0) + graphs_made() - before

    def fields(self, phase: str) -> Dict[str, int]:
        """The record's field: graphs made in `phase` since the process started."""
        return {"compiled_graphs": self.made.get(phase, 0)} if self.compiling else {}
