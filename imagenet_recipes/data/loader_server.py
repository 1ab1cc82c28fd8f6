"""The loader workers of the `pytorch` and `gpu` backends start from a fork server, started
early.

Imports no torch (the CLI starts the server before the trainer imports torch, so that both
import it at once on two cores); the server itself imports the modules its workers run, once.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import tempfile
from typing import Dict, Iterator, Optional

from ..errors import UsageError
from ..options import DataOptions
from ..registry import DATA_BACKENDS, backends_where

# The backends whose loaders run DataLoader worker processes, started from this server.
WORKER_BACKENDS = backends_where("worker_processes")
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"

# A socket's path holds at most 107 bytes. multiprocessing makes its sockets (the fork server's,
# and each worker's resource sharer, which hands over a batch's shared memory) as
# <temporary directory>/pymp-XXXXXXXX/listener-XXXXXXXX.
SOCKET_PATH_MAX = 107
SOCKET_NAME = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
SHORT_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def loader_worker_context() -> multiprocessing.context.BaseContext:
    """How loader workers start: forked from a fork server, never from the training process.

    The training process has threads of its own by the time its loaders start (gloo's or
    NCCL's, TensorBoard's writer, the other loader's queue feeders); a fork copies any lock one
    of them holds at that moment, unowned, and the worker that next needs it waits forever
    (seen here as a validation that never starts on a loaded 2-core machine). The fork server
    is a fresh, single-threaded process that has imported the data modules once; each worker
    is forked from it and receives the dataset pickled. (Python 3.14 makes it the default on
    Linux for the same reason.)

    The server imports the entry script (multiprocessing's `__main__` preload; a worker would
    otherwise re-run the script's imports itself), `worker_server` first, which keeps the
    server alive through the stop signals meant for the trainer, then the backends that the
    workers run (both: the server starts before the trainer has built its loaders). The list
    only counts when the server starts: the first call decides it."""
    context = multiprocessing.get_context("forkserver")
    backends = [DATA_BACKENDS[name].path for name in WORKER_BACKENDS]
    context.set_forkserver_preload([f"{__package__}.worker_server", "__main__", *backends])
    return context


def uses_loader_workers(cfg: DataOptions) -> bool:
    """Whether this run's loaders start worker processes (-j 0 loads in the trainer itself)."""
    return cfg.backend in WORKER_BACKENDS and cfg.workers != 0


def start_loader_server(cfg: DataOptions) -> None:
    if uses_loader_workers(cfg):
        ensure_loader_server()


def ensure_loader_server() -> None:
    """Start the loader workers' fork server (a no-op once it runs), with no GPU visible.

    Loader workers decode on the CPU and never need a GPU, but a library they import may open
    a CUDA context by itself (nvImageCodec's nvJPEG extension makes a hardware decoder handle
    when it loads): on GPU 0, a few hundred MB each, for every worker of every rank (15 workers
    x 8 ranks on a node). So the server starts with CUDA_VISIBLE_DEVICES empty, from its first
    instruction on, and every worker forked from it inherits that; the trainer's own variable
    is put back as soon as the server has started.

    The server is a new interpreter that imports the preload list by name: multiprocessing
    hands it neither the trainer's sys.path nor its main script (CPython's forkserver looks for
    a 'main_path' key that spawn.get_preparation_data never writes, up to 3.13 at least), so it
    finds this package where any interpreter of the environment does, installed (`pip install
    -e .`). A preload that fails does so silently, and each worker then imports torch,
    torchvision and the engine itself at every start (an epoch 1.19x slower on a 2-core VM,
    validation 2.6x): tests/test_units.py checks that the server has them."""
    loader_worker_context()
    server_env = {CUDA_VISIBLE: ""}  # what the server is started with (its environment block)
    short = socket_tmpdir()
    if short is not None:
        server_env["TMPDIR"] = short  # the workers' sockets
        # this process's own (the server's listening socket): multiprocessing makes its
        # folder once per process, on first use, in tempfile's directory
        with _tempfile_dir(short):
            multiprocessing.util.get_temp_dir()
    with _environment(server_env):
        multiprocessing.forkserver.ensure_running()


def socket_tmpdir() -> Optional[str]:
    """A temporary directory short enough for multiprocessing's sockets, where the one this
    process has ($TMPDIR: a scheduler's per-job folder can be long) is not; else None.

    multiprocessing uses $TMPDIR as it is (Python 3.11), and every loader with workers then
    failed with "AF_UNIX path too long"."""
    if len(tempfile.gettempdir()) + SOCKET_NAME <= SOCKET_PATH_MAX:
        return None
    for folder in SHORT_TMP:
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return folder
    raise UsageError(f"the temporary directory {tempfile.gettempdir()} is too long for the "
                     f"loader workers' sockets ({SOCKET_PATH_MAX - SOCKET_NAME} characters at "
                     f"most) and none of {', '.join(SHORT_TMP)} is writable: set TMPDIR to a "
                     "shorter folder, or -j 0")


@contextlib.contextmanager
def _environment(values: Dict[str, str]) -> Iterator[None]:
    """These environment variables set while the block runs, the old ones put back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _tempfile_dir(folder: str) -> Iterator[None]:
    saved, tempfile.tempdir = tempfile.tempdir, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved
