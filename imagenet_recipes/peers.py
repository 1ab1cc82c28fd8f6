"""PeerWatch: a rank ends, saying why, within seconds of another rank's process ending.

A rank blocked in an NCCL collective or a CUDA synchronisation whose peer has died waits until
NCCL's watchdog fires (--dist-timeout, 600 s by default); its Python signal handlers cannot run
meanwhile, so launchers that stop a job with SIGTERM wait for their kill grace as well, and on
other nodes nothing tells it at all. gloo notices a dead peer by its closed sockets, NCCL inside
a node does not.

So each rank runs a small thread beside the training: every INTERVAL seconds it counts a
heartbeat in the rendezvous store and looks at its neighbour's (rank r watches rank r+1, so the
store sees a few operations per rank, whatever the world size). A neighbour whose count has not
moved for TIMEOUT seconds, and that has not said it finished, has died: the watcher names it in
the store, and every rank's thread, seeing that name, prints the cause and ends its process
with status 1 at once (os._exit: the main thread may be stuck in C++). A hung but living peer
keeps beating: that is --dist-timeout's case. A rank that ends normally (its teardown) says so
first, so ranks that finish at different times are not taken for dead.
"""
from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Callable, Optional

import torch.distributed as dist

INTERVAL = 1.0  # seconds between heartbeats
TIMEOUT = 15.0  # seconds without a heartbeat after which a peer counts as gone


def end_process_now(code: int) -> None:
    """End the process with `code` without Python's shutdown (no exit handlers, no object
    destructors), after flushing what it printed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_process(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    end_process_now(1)


class PeerWatch:
    """Start it after the process group exists (`start`), stop it in teardown (`finish`)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int,
                 interval: float = INTERVAL, timeout: float = TIMEOUT,
                 on_gone: Callable[[str], None] = _end_process):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.interval, self.timeout, self.on_gone = interval, timeout, on_gone
        self.neighbour = (rank + 1) % world_size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)

    @classmethod
    def from_environment(cls, rank: int, world_size: int, **kwargs) -> Optional["PeerWatch"]:
        """A watch over its own connection to the rendezvous store (MASTER_ADDR:MASTER_PORT,
        torchrun's agent or rank 0), so it never waits behind the main thread's store calls."""
        if world_size < 2:
            return None
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                               is_master=False, timeout=datetime.timedelta(seconds=30),
                               wait_for_workers=False)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return cls(dist.PrefixStore(f"recipe_peers_{attempt}", client), rank, world_size,
                   **kwargs)

    def start(self) -> "PeerWatch":
        self.store.add(f"beat/{self.rank}", 1)
        self._thread.start()
        return self

    def stop(self) -> None:
        """This rank ends after a failure: the thread reports nothing more and ends at its next
        turn. Nothing waits for it, since a store call never returns while the store's host
        is frozen; its neighbour, not told that this rank finished, will see it gone."""
        self._stop.set()

    def finish(self) -> None:
        """This rank ends normally: its neighbour stops watching it. Returns once the thread
        has ended: Python 3.11 ends a daemon thread that is still inside a store call when the
        interpreter exits in the middle of C++ code, and that aborts the process ("terminate
        called without an active exception") after a run that succeeded."""
        self.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            # A store call returns once the store answers or its host has ended; while the
            # host (rank 0 or torchrun's agent) is frozen, it waits, and so does this.
            self._thread.join()
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # the store's host has gone first: nobody is left to tell
            pass

    # --- the thread ------------------------------------------------------------------------------
    def _watch(self) -> None:
        seen, seen_at = -1, time.monotonic()
        store_ok_at = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self.store.add(f"beat/{self.rank}", 1)
                gone = self.store.add("gone", 0)
                if gone:
                    return self._report(int(self.store.get("gone_rank")), noticed_by_me=False)
                beats = self.store.add(f"beat/{self.neighbour}", 0)
                finished = self.store.check([f"done/{self.neighbour}"])
                store_ok_at = time.monotonic()
            except Exception:  # the store lives in rank 0 (or the launcher): it is gone
                if time.monotonic() - store_ok_at > self.timeout and not self._stop.is_set():
                    return self.on_gone(
                        f"rank {self.rank} of {self.world_size}: the rendezvous store "
                        f"({os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}, "
                        "held by rank 0 or the launcher) stopped answering: that process has "
                        "ended. Ending this rank; continue with --resume auto.")
                continue
            if finished:
                return
            if beats != seen:
                seen, seen_at = beats, time.monotonic()
            elif time.monotonic() - seen_at > self.timeout and not self._stop.is_set():
                self.store.set("gone_rank", str(self.neighbour))
                self.store.add("gone", 1)
                return self._report(self.neighbour, noticed_by_me=True)

    def _report(self, dead: int, noticed_by_me: bool) -> None:
        if self._stop.is_set():
            return
        how = (f"no heartbeat for {self.timeout:g} s" if noticed_by_me
               else "another rank noticed")
        self.on_gone(f"rank {self.rank} of {self.world_size}: rank {dead} stopped answering "
                     f"({how}): its process has ended, or is frozen, while this rank was still "
                     "training. Its own output holds the cause (an error, out of memory, a "
                     "kill). Ending this rank so the job "
                     "does not wait for --dist-timeout; continue with --resume auto (torchrun "
                     "--max-restarts=K does that automatically).")
