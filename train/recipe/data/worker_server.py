"""Imported only in the fork server that starts the `pytorch` backend's loader workers
(pytorch.worker_start_method names it in the server's preload list; the trainer never imports it).

The server runs in its trainer's process group, so the stop signals meant for the trainer reach
it too: torchrun passes SIGTERM on to each rank's whole group, SLURM signals every process of a
job step. Killed by one, the server would take the workers with it (a worker ends when its
parent changes) and the trainer would fail on a missing batch before it writes its preemption
checkpoint. So the server ignores them; it ends by itself once its trainer and the workers are
gone, and the workers set their own handlers when they start (pytorch.WorkerGuard).
"""
import signal

for _stop in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(_stop, signal.SIG_IGN)
