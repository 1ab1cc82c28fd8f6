"""data/prefetch.py: batches prepared ahead in a thread of their own, with a stand-in decoder
that records when each batch is prepared and when the training loop takes it. On the CPU this
checks the order, how far ahead the thread runs, the hand-over of errors and an early stop; the
GPU tier's decode group compares batches with and without the overlap on a GPU (streams,
events), where they must be identical."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from imagenet_recipes.data.prefetch import prepared_ahead

CPU = torch.device("cpu")


class StandInDecoder:
    """Turns raw batch i into (tensor of i,), logging ("prepared", i) from its own thread."""

    def __init__(self, events: list, fail_at: int = -1, empty: tuple = ()):
        self.events, self.fail_at, self.empty = events, fail_at, empty
        self.threads = set()

    def __call__(self, raw: int):
        self.threads.add(threading.current_thread().name)
        time.sleep(0.01)  # decoding takes time: the trainer would wait without the overlap
        if raw == self.fail_at:
            raise ValueError(f"batch {raw} cannot be decoded")
        self.events.append(("prepared", raw))
        return None if raw in self.empty else (torch.full((2,), float(raw)),)


def train_on(batches, events: list, step=lambda batch: None, stop_after: int = -1) -> list:
    taken = []
    for (images,) in batches:
        events.append(("taken", int(images[0])))
        taken.append(int(images[0]))
        step(int(images[0]))
        if len(taken) == stop_after:
            break
    return taken


def step_until_prepared(events: list, ahead: int, last: int):
    """A step that lasts until the thread has prepared the batch `ahead` after it (10 s at
    most), however slow a loaded machine makes the thread: a bound on the look-ahead, not on
    time."""
    def step(batch: int) -> None:
        deadline = time.monotonic() + 10
        while batch + ahead <= last and ("prepared", batch + ahead) not in events \
                and time.monotonic() < deadline:
            time.sleep(0.005)
    return step


def test_batches_come_in_order_prepared_up_to_two_ahead_in_another_thread():
    events: list = []
    decoder = StandInDecoder(events, empty=(3,))
    taken = train_on(prepared_ahead(range(8), decoder, CPU, ahead=2), events,
                     step_until_prepared(events, ahead=2, last=7))
    assert taken == [0, 1, 2, 4, 5, 6, 7]  # in order; a None (a batch of unreadable files) skipped
    assert decoder.threads == {"prepare-batches"}
    for i in (4, 5):
        # while batch i trains, batches i+1 and i+2 are prepared
        assert events.index(("prepared", i + 2)) < events.index(("taken", i + 1)), events
    for raw in taken:
        # never more than two prepared batches wait, with one more prepared and waiting for
        # room: at most raw + 1 + 2 + 1 prepared when batch raw is taken
        taken_at = events.index(("taken", raw))
        assert sum(e[0] == "prepared" for e in events[:taken_at]) <= raw + 4, events


def test_without_the_overlap_each_batch_is_prepared_when_asked_for():
    events: list = []
    decoder = StandInDecoder(events)
    taken = train_on(prepared_ahead(range(4), decoder, CPU, ahead=0), events)
    assert taken == [0, 1, 2, 3]
    assert events == [(kind, i) for i in range(4) for kind in ("prepared", "taken")]
    assert decoder.threads == {threading.current_thread().name}


def test_a_decode_error_reaches_the_training_loop_at_its_batch():
    events: list = []
    batches = prepared_ahead(range(6), StandInDecoder(events, fail_at=2), CPU)
    with pytest.raises(ValueError, match="batch 2 cannot be decoded"):
        train_on(batches, events)
    assert [e for e in events if e[0] == "taken"] == [("taken", 0), ("taken", 1)]


def test_stopping_early_stops_the_thread():
    events: list = []
    before = threading.active_count()
    taken = train_on(prepared_ahead(range(1000), StandInDecoder(events), CPU), events,
                     stop_after=3)
    assert taken == [0, 1, 2]
    assert threading.active_count() == before  # joined when the generator closed
    assert sum(1 for e in events if e[0] == "prepared") <= 3 + 3  # not the whole epoch
