"""Batches prepared ahead, beside the training step: a background thread turns each raw batch
into a device batch (decode, crop, resize, normalise) on a CUDA stream of its own while the
training stream computes the step before, as DALI's pipelines do.

    batches = PreparedAhead(raw_batches, prepare, device, side_stream=stream)
    for images, targets in batches: ...
    batches.close()   # at the latest when its loader closes: the thread is joined

The hand-over: the thread records an event on its stream after preparing a batch; the training
stream waits on that event (on the GPU, not the host), and the batch's tensors are marked as used
by the training stream (`record_stream`), so the caching allocator does not give their memory to
the thread's next batch while the step still reads it. Nothing here synchronises the host with
the training stream. At most `ahead` prepared batches wait for the step (default 2: batches N+1
and N+2 while N trains) and the thread holds at most one more, waiting for room, so device
memory holds a bounded number of them.

The thread ends with its pass: when the batches run out, when the reader calls `close()` (the
loader's close, also after an exception mid-epoch, where a traceback may still hold the pass),
when a `for` loop over it stops early and drops it, and at interpreter exit for a pass nobody
closed (it is joined there, not killed inside a CUDA call). `close()` returns once the thread
has ended, so the DataLoader it reads can then be shut down.

On a CPU the same thread prepares the batches while the training thread computes (decoders and
torch's kernels release the GIL); there are no streams to order.
"""
from __future__ import annotations

import atexit
import contextlib
import queue
import threading
from typing import Callable, Iterable, Optional, Tuple

import torch

_DONE = object()
# Threads that may still run: stopped and joined at interpreter exit (daemon threads are
# otherwise stopped wherever they are, a CUDA call included)
_RUNNING: "set[_Producer]" = set()


@atexit.register
def _stop_running_threads() -> None:
    for producer in list(_RUNNING):
        producer.close()


class _Producer:
    """The thread's side: it prepares into `ready` until the raw batches end or `stop` is set.
    Kept apart from PreparedAhead so that the running thread does not keep the reader's
    object alive: a loop that drops it (break) ends the thread through its __del__."""

    def __init__(self, raw_batches: Iterable, prepare: Callable, device: torch.device,
                 ahead: int, side: Optional["torch.cuda.Stream"]):
        self.raw_batches, self.prepare, self.device, self.side = raw_batches, prepare, device, \
            side
        self.ready: queue.Queue = queue.Queue(maxsize=ahead)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="prepare-batches", daemon=True)
        _RUNNING.add(self)
        self.thread.start()

    def _hand_over(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        cuda, side = self.side is not None, self.side
        try:
            if cuda and self.device.index is not None:  # the current device is per thread
                torch.cuda.set_device(self.device)
            for raw in self.raw_batches:
                if self.stop.is_set():
                    return
                with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                    batch = self.prepare(raw)
                    event = torch.cuda.Event() if cuda else None
                    if event is not None:
                        event.record(side)
                if batch is not None and not self._hand_over((batch, event)):
                    return
            self._hand_over(_DONE)
        except BaseException as err:  # handed to the reader, raised there
            self._hand_over(err)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join()
        _RUNNING.discard(self)
        # the prepared batches nobody will take: their device memory back to the allocator
        while True:
            try:
                self.ready.get_nowait()
            except queue.Empty:
                break


class PreparedAhead:
    """`prepare(raw)` of each raw batch, in order, computed up to `ahead` batches before the
    reader asks for them; a None from `prepare` is skipped. An exception in `prepare` or in the
    raw batches reaches the reader at the batch where it happened. ahead=0: each batch prepared
    when asked for, in the reader's thread and stream (what the overlap is compared with).
    `side_stream`: the CUDA stream the thread prepares on (the loader's, kept for its life; a
    new one when None)."""

    def __init__(self, raw_batches: Iterable, prepare: Callable[[object], Optional[Tuple]],
                 device: torch.device, ahead: int = 2,
                 side_stream: Optional["torch.cuda.Stream"] = None):
        self.raw_batches, self.prepare, self.device, self.ahead = raw_batches, prepare, \
            device, ahead
        self.side = side_stream
        if device.type == "cuda" and ahead and side_stream is None:
            self.side = torch.cuda.Stream(device)
        self.producer: Optional[_Producer] = None
        self.in_line = None  # ahead=0: the raw batches, read when asked for
        self.ended = False

    def __iter__(self) -> "PreparedAhead":
        return self

    def __next__(self) -> Tuple:
        if self.ended:
            raise StopIteration
        if self.ahead == 0:
            return self._next_in_line()
        if self.producer is None:
            self.producer = _Producer(self.raw_batches, self.prepare, self.device, self.ahead,
                                      self.side)
        item = self.producer.ready.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, event = item
        if event is not None:
            training = torch.cuda.current_stream(self.device)
            training.wait_event(event)
            for tensor in batch:
                if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                    tensor.record_stream(training)
        return batch

    def _next_in_line(self) -> Tuple:
        if self.in_line is None:
            self.in_line = iter(self.raw_batches)
        for raw in self.in_line:
            batch = self.prepare(raw)
            if batch is not None:
                return batch
        self.ended = True
        raise StopIteration

    @property
    def running(self) -> bool:
        """Whether its thread is alive."""
        return self.producer is not None and self.producer.thread.is_alive()

    def close(self) -> None:
        """Stop preparing and return once the thread has ended (at most the batch it is
        preparing is finished first)."""
        self.ended = True
        if self.producer is not None:
            self.producer.close()

    def __del__(self) -> None:  # a `for` loop that broke out and dropped the pass
        self.close()


def prepared_ahead(raw_batches: Iterable, prepare: Callable[[object], Optional[Tuple]],
                   device: torch.device, ahead: int = 2) -> PreparedAhead:
    """PreparedAhead with a side stream of its own (for one pass; a loader keeps one stream)."""
    return PreparedAhead(raw_batches, prepare, device, ahead)
