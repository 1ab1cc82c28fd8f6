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


def test_batches_come_in_order_prepared_ahead_in_another_thread():
    events: list = []
    decoder = StandInDecoder(events, empty=(3,))
    taken = train_on(prepared_ahead(range(8), decoder, CPU, ahead=2), events,
                     step_until_prepared(events, ahead=2, last=7))
    assert taken == [0, 1, 2, 4, 5, 6, 7]  # in order; a None (a batch of unreadable files) skipped
    assert decoder.threads == {"prepare-batches"}
    for i in (4, 5):
        # while batch i trains, batches i+1 and i+2 are prepared
        assert events.index(("prepared", i + 2)) < events.index(("taken", i + 1)), events


def asked_for(events: list, raw_batches):
    """The raw batches, logging ("asked", i) when the thread asks for batch i."""
    for i in raw_batches:
        events.append(("asked", i))
        yield i


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_the_look_ahead_is_bounded_both_ways(ahead):
    """While batch i trains, the thread prepares batches up to i + ahead + 1 (`ahead` waiting
    for the step, one more in hand waiting for room) and then waits: it asks for no further
    batch until the step takes one. A queue shorter than `ahead` never gets to i + ahead + 1
    (the step waits 10 s for it, then fails); an unbounded one asks for more at once (seen
    within the step's 0.3 s of watching; a slower machine can only hide that, never fail a
    bounded queue)."""
    events: list = []

    def step(i: int) -> None:
        if not 2 <= i <= 4:
            return
        reached = ("prepared", i + ahead + 1)
        deadline = time.monotonic() + 10
        while reached not in events and time.monotonic() < deadline:
            time.sleep(0.005)
        assert reached in events, f"batch {i} trains: not {ahead} + 1 ahead: {events}"
        time.sleep(0.3)
        assert ("asked", i + ahead + 2) not in events, f"batch {i} trains: more than " \
                                                        f"{ahead} + 1 ahead: {events}"

    taken = train_on(prepared_ahead(asked_for(events, range(12)), StandInDecoder(events), CPU,
                                    ahead=ahead), events, step)
    assert taken == list(range(12))


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


# --- the thread ends with its loader ------------------------------------------------------------
def prepare_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "prepare-batches" and t.is_alive()]


@pytest.fixture
def gpu_loader(tiny_imagefolder, monkeypatch):
    """A real `--data-backend gpu` training loader on the CPU with one worker process, and the
    order in which its prepare thread and its workers ended (`ends`)."""
    pytest.importorskip("torchcodec")
    from imagenet_recipes.config import parse_args
    from conftest import loaders_for
    from imagenet_recipes.data import Shard, loading

    ends = []
    shutdown = loading.shutdown_workers

    def recorded_shutdown(loader):
        if getattr(loader, "_iterator", None) is not None:
            ends.append(("workers", len(prepare_threads())))
        shutdown(loader)

    monkeypatch.setattr(loading, "shutdown_workers", recorded_shutdown)
    cfg = parse_args(["-a", "timm/test_resnet", "--image-size", "32", "-b", "4", "-j", "1",
                      "--data-backend", "gpu", str(tiny_imagefolder)], entry="nd")
    train, val, _ = loaders_for(cfg, Shard(), CPU)
    train.set_epoch(0)
    yield train, ends
    train.close()
    val.close()


@pytest.mark.slow
def test_after_close_no_prepare_thread_remains_and_the_workers_end_after_it(gpu_loader):
    loader, ends = gpu_loader
    batches = iter(loader)
    next(batches)  # the thread runs ahead, inside the DataLoader's next() or waiting for room
    assert len(prepare_threads()) == 1
    loader.close()
    assert prepare_threads() == []
    assert ends == [("workers", 0)]  # the workers were shut down once the thread had ended
    del batches


@pytest.mark.slow
def test_after_an_exception_mid_epoch_the_loaders_close_ends_the_thread(gpu_loader):
    """As the engine meets it: the step fails, the traceback (kept here, as an `except` block
    has it) still holds the pass, and the loader's close() must end its thread anyway."""
    loader, ends = gpu_loader

    def train_epoch():
        batches = iter(loader)
        for step in range(8):
            next(batches)
            if step == 2:
                raise RuntimeError("CUDA out of memory in the step")

    try:
        train_epoch()
    except RuntimeError as err:
        kept = err  # holds train_epoch's frame, and with it the pass
        assert len(prepare_threads()) == 1
        loader.close()
        assert prepare_threads() == [] and ends == [("workers", 0)]
    assert kept.__traceback__ is not None


@pytest.mark.slow
def test_after_break_no_prepare_thread_remains(gpu_loader):
    loader, _ = gpu_loader
    for step, _ in enumerate(loader):
        if step == 1:
            break
    assert prepare_threads() == []
    # the next epoch starts a thread of its own and ends it at the end of the pass
    assert sum(1 for _ in loader) == len(loader) and prepare_threads() == []
