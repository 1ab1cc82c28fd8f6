"""Batches prepared ahead, beside the training step: a background thread turns each raw batch
into a device batch (decode, crop, resize, normalise) on a CUDA stream of its own while the
training stream computes the step before, as DALI's pipelines do.

    for images, targets in prepared_ahead(raw_batches, prepare, device): ...

The hand-over: the thread records an event on its stream after preparing a batch; the training
stream waits on that event (on the GPU, not the host), and the batch's tensors are marked as used
by the training stream (`record_stream`), so the caching allocator does not give their memory to
the thread's next batch while the step still reads it. Nothing here synchronises the host with
the training stream. At most `ahead` prepared batches wait for the step (default 2: batches N+1
and N+2 while N trains), so device memory holds a bounded number of them.

On a CPU the same thread prepares the batches while the training thread computes (decoders and
torch's kernels release the GIL); there are no streams to order.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Iterable, Iterator, Optional, Tuple

import torch

_DONE = object()


def prepared_ahead(raw_batches: Iterable, prepare: Callable[[object], Optional[Tuple]],
                   device: torch.device, ahead: int = 2) -> Iterator[Tuple]:
    """`prepare(raw)` of each raw batch, in order, computed up to `ahead` batches before the
    caller asks for them; a None from `prepare` is skipped. An exception in `prepare` or in the
    raw batches reaches the caller at the batch where it happened; a caller that stops early
    (break, close) stops the thread. ahead=0: each batch prepared when asked for, in the
    caller's thread and stream (what the overlap is compared with)."""
    if ahead == 0:
        yield from (batch for batch in map(prepare, raw_batches) if batch is not None)
        return
    ready: queue.Queue = queue.Queue(maxsize=ahead)
    stop = threading.Event()
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            if cuda and device.index is not None:  # the current device is per thread
                torch.cuda.set_device(device)
            for raw in raw_batches:
                if stop.is_set():
                    return
                with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                    batch = prepare(raw)
                    event = torch.cuda.Event() if cuda else None
                    if event is not None:
                        event.record(side)
                if batch is not None and not hand_over((batch, event)):
                    return
            hand_over(_DONE)
        except BaseException as err:  # handed to the caller, raised there
            hand_over(err)

    thread = threading.Thread(target=produce, name="prepare-batches", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            batch, event = item
            if event is not None:
                training = torch.cuda.current_stream(device)
                training.wait_event(event)
                for tensor in batch:
                    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                        tensor.record_stream(training)
            yield batch
    finally:
        stop.set()
        thread.join()
