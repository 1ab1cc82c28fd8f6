"""Imported only in the fork server that starts the loader workers (`pytorch`, `gpu` backends)
(loader_server.loader_worker_context names it in the server's preload list; the trainer never
imports it).

The server runs in its trainer's process group, so the stop signals meant for the trainer reach
it too: torchrun passes SIGTERM on to each rank's whole group, SLURM signals every process of a
job step. Killed by one, the server would take the workers with it (a worker ends when its
parent changes) and the trainer would fail on a missing batch before it writes its preemption
checkpoint. So the server ignores them; it ends by itself once its trainer and the workers are
gone, and the workers set their own handlers when they start (loading.WorkerGuard).

When it ends, it skips Python's teardown: with torch loaded, that is close to a second of CPU
(a last garbage collection over every module) taken from the trainer's own exit, for a process
that holds no files and no state. The workers it forks never run this: they leave through
os._exit too.
"""
import atexit
import os
import signal
import sys

for _stop in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(_stop, signal.SIG_IGN)


def _end_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


atexit.register(_end_now)
