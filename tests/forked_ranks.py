"""Entry-script runs forked from an interpreter that has already imported torch, torchvision,
timm and this package, for the tests that check what runs compute (parity, precision,
accumulation, resume): a tiny run's own work is a fraction of a CPU-second, its interpreter's
imports 6-7 CPU-seconds (measured: `nd.py` for 3 steps of timm/test_resnet, 7.2 CPU-s started
as `python train/nd.py`, 0.5 forked from here).

Four roles, one file:
  server  (`python forked_ranks.py server SOCKET`) imports the heavy modules once, then forks a
          child for each request on a Unix socket; the child takes the requester's stdin, stdout
          and stderr, environment, working directory and argv, and runs the script or module
          as `python SCRIPT ARGS` / `python -m MODULE ARGS` would, exiting as that interpreter
          would (thread joins, atexit, flushes; not the teardown of its modules, which are the
          server's); the server reaps it and sends its exit status back.
  run     (`python forked_ranks.py run -- SCRIPT ARGS`) one process through the server named by
          $FORKED_RANKS_SOCKET: it waits for the run and exits with its status, forwards the
          signals a test sends (SIGTERM, SIGINT, SIGUSR1, SIGABRT for stacks), and the run
          kills itself and its process group when this process goes (a test's timeout).
  launch  (`python forked_ranks.py launch --nproc N -- SCRIPT ARGS`) N ranks, as `torchrun
          --standalone --nproc_per_node=N` starts them (RANK, LOCAL_RANK, WORLD_SIZE,
          LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a rank that fails stops the others.
  exec    (`python forked_ranks.py exec [FLAGS] -c CODE ARGS`, through the `python` beside the
          socket) the interpreter that multiprocessing starts for a run's helper processes:
          the loader workers' fork server (data/loader_server.py) and the resource tracker.
          Each forked run has it as multiprocessing's executable, so these helpers are forked
          too: the child takes every descriptor the helper was given, at the same number, and
          runs CODE as `python -c` does (a fork server's imports are 5-6 CPU-s as a new
          interpreter, none here). It is not tied to the requester's life: the helper ends as
          it would after a real exec, when the pipe from its run closes.

Only what the scripts read at run time can differ between requests: variables read at
interpreter start (PYTHONPATH, a planted module) or at import (inductor's cache settings) are
the server's, so conftest.run_forked refuses them. The launch path itself (torchrun, a fresh
interpreter, the loader workers' fork server) is tested with real processes elsewhere.
"""
from __future__ import annotations

import json
import os
import random
import resource
import selectors
import signal
import socket
import struct
import sys
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP,
             signal.SIGABRT)


# Variables a run reads when its interpreter starts, imports torch or first computes (the CPU
# kernels' instruction set: tests force AVX2 with them): a forked run has the server's
# (conftest.run_forked refuses them)
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TORCHINDUCTOR_", "TORCH_COMPILE", "TORCHDYNAMO_",
                        "OMP_", "MKL_", "ONEDNN_", "DNNL_", "ATEN_", "RECIPES_PLANT")

# What the server imports before it forks any run
PRELOAD = ("torch", "torchvision", "timm", "imagenet_recipes.engine", "imagenet_recipes.ps.main",
           *(f"imagenet_recipes.train.{entry}" for entry in ("nd", "ddp", "ddp_apex", "fsdp",
                                                             "ps")))

_server = None  # (process, socket path) of this pytest process's server
_executable = None  # in the server: the `python` that brings a run's helpers here (exec role)
MAX_FDS = 32  # descriptors a request may pass


def import_time_names(env) -> list:
    """The variables of `env` (a dict, or None) that a process reads at its start or import:
    a forked run would have the server's."""
    return [name for name in env or {} if name.startswith(IMPORT_TIME_PREFIXES)]


def server_socket(env: dict) -> str:
    """The socket of this process's server, started on first use with `env` (the tests' run
    environment); it ends when this process does (its stdin closes)."""
    global _server
    if _server is None:
        import atexit
        import shutil
        import subprocess
        import tempfile

        folder = tempfile.mkdtemp(prefix="forked-", dir="/tmp")  # a socket path is <108 bytes
        path = os.path.join(folder, "socket")
        proc = subprocess.Popen([sys.executable, __file__, "server", path], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"forked_ranks: the server did not start ({proc.wait()})")
        atexit.register(lambda: (proc.stdin.close(), proc.wait(), shutil.rmtree(folder)))
        _server = (proc, path)
    return _server[1]


def forked_cpu() -> float:
    """CPU seconds of the runs this process's server has forked and reaped so far (0 before it
    starts): tests/cpu_profile.py counts a test's forked runs with it."""
    if _server is None or _server[0].poll() is not None:
        return 0.0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(_server[1])
        socket.send_fds(conn, [json.dumps({"stats": True}).encode()], [])
        return struct.unpack("!d", _read(conn, 8))[0]


def command(nproc: int, program: list, port: int = 0) -> list:
    """The argv that runs `program` (SCRIPT ARGS, or -m MODULE ARGS) through the server: one
    process (nproc 0) or torchrun's N ranks, their store on `port`."""
    role = ["launch", "--nproc", str(nproc), "--port", str(port)] if nproc else ["run"]
    return [sys.executable, __file__, *role, "--", *program]


def unused_port(count: int = 1) -> int:
    """A port P with P .. P+count-1 free now, for a group of processes to meet on (MASTER_PORT,
    a local slurmctld), chosen below the kernel's ephemeral range. A port from that range (what
    binding port 0 gives) can be handed to another process's connection or listener in the
    seconds the group takes to start and bind it: in a CI run two tests side by side crossed
    that way, one's rank 0 found its port taken and its rank 1 talked to the other test's RPC
    agent, failing both. Below the range only a test like this one picks ports, at random."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    lowest = int(ephemeral.read_text().split()[0]) if ephemeral.is_file() else 32768
    choose = random.Random()  # seeded by the OS: xdist workers pick independently
    for _ in range(200):
        port = choose.randrange(10000, lowest - count)
        try:
            for candidate in range(port, port + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
            return port
        except OSError:  # in use, or waiting out TIME_WAIT
            continue
    raise RuntimeError(f"no {count} free consecutive ports below {lowest}")


# --- server ------------------------------------------------------------------------------------
def serve(path: str) -> None:
    import gc
    import importlib

    for module in PRELOAD:  # the imports every run would make
        importlib.import_module(module)
    # Out of the collector's sight: a run's collections then never walk (and copy, page by
    # page) the heap it shares with this process
    gc.freeze()

    # forking is safe only from a process with one thread: say so loudly if an import left one
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise SystemExit(f"forked_ranks: the server has {threads} threads after its imports")
    global _executable
    _executable = _write_executable(os.path.dirname(path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd sees it
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)  # EOF: the pytest worker is gone
    print("ready", flush=True)
    waiting = {}  # pid -> the connection its exit status goes back on
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, MAX_FDS)
                request = json.loads(message)
                if request.get("stats"):  # the CPU seconds of every run finished so far
                    used = resource.getrusage(resource.RUSAGE_CHILDREN)
                    conn.sendall(struct.pack("!d", used.ru_utime + used.ru_stime))
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    os.close(wake_r)
                    os.close(wake_w)
                    for other in (listener, conn, selector, *waiting.values()):
                        other.close()
                    _child(request, fds)  # does not return
                for fd in fds:
                    os.close(fd)
                conn.sendall(struct.pack("!i", pid))
                waiting[pid] = conn
            elif key.fileobj is wake_r:
                os.read(wake_r, 4096)
                _reap(waiting)
            elif not sys.stdin.buffer.read1(4096):
                for pid in waiting:
                    _kill_group(pid)
                # no teardown: the frozen heap's last collection never comes, and a library
                # would report its objects as leaked (nanobind's, in triton)
                os._exit(0)


def _write_executable(folder: str) -> str:
    """`python` in `folder`: what multiprocessing runs for a forked run's helper processes (the
    exec role, through this server)."""
    path = os.path.join(folder, "python")
    with open(path, "w") as script:
        script.write(f'#!/bin/sh\nexec "{sys.executable}" "{os.path.abspath(__file__)}" '
                     'exec "$@"\n')
    os.chmod(path, 0o755)
    return path


def _reap(waiting: dict) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            except OSError:  # its requester is gone
                pass
            conn.close()


def _child(request: dict, fds: list) -> None:
    """In the forked child: become `python ARGV` (`python -c CODE ARGS` for the exec role) of
    the requester, then exit as it would."""
    import multiprocessing
    import tempfile

    signal.set_wakeup_fd(-1)
    for number in (signal.SIGCHLD, *FORWARDED):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()  # a group of its own: what the run starts goes with it
    _take_descriptors(fds, request.get("fds", [0, 1, 2]))
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this run's TMPDIR, as a new interpreter would
    os.chdir(request["cwd"])
    multiprocessing.set_executable(_executable)  # its helper processes come here too
    if "exec" in request:
        _leave(_status_of(lambda: _exec(request["exec"], request["argv"])))
    _die_with(request["requester"])
    _leave(_status_of(lambda: _run(request["argv"], request["cwd"])))


def _run(argv: list, cwd: str) -> None:
    """`python SCRIPT ARGS` or `python -m MODULE ARGS`, in this process."""
    import runpy

    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = cwd
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _status_of(main) -> int:
    """Run main() as the interpreter runs a script, to the exit status it would have: sys.exit's
    code (a message printed, status 1), an uncaught exception's traceback printed (status 1;
    KeyboardInterrupt's is killed by SIGINT)."""
    try:
        main()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _leave(status: int) -> None:
    """Exit as the interpreter does (non-daemon threads joined, atexit handlers run, output
    flushed) but for the teardown of its modules: in a forked run those are the server's, all
    of torch's, freed object by object at every run's end, page by copied page. That was 2.6
    CPU-s of an nd.py run's 4.5 (one epoch, two loader workers; 1.8 with this and the server's
    gc.freeze); what a run leaves to the teardown instead of closing is left to the real
    processes' tests."""
    import atexit
    import threading

    threading._shutdown()  # the interpreter's own first step: join the non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone
            pass
    if status == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def _take_descriptors(fds: list, numbers: list) -> None:
    """Put the received descriptors at the numbers they had in the requester. They arrive at
    whatever numbers were free here, which may be another's target: all are moved above the
    targets first."""
    import fcntl

    floor = max(numbers) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, number in zip(moved, numbers):
        os.dup2(fd, number)  # inheritable, as an exec'd interpreter's descriptors are
        os.close(fd)


def _exec(code: str, args: list) -> None:
    """Run CODE as `python -c CODE ARGS` does: in a new __main__, '' first on sys.path."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main  # the server's own stays alive: _child's globals
    sys.argv = ["-c", *args]
    sys.path[0] = ""
    exec(compile(code, "<string>", "exec"), main.__dict__)


def _die_with(requester: int) -> None:
    """Kill this run's process group when the process that asked for it goes."""
    import select
    import threading

    pidfd = os.pidfd_open(requester)

    def watch() -> None:
        select.select([pidfd], [], [])
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="forked_ranks-requester", daemon=True).start()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


# --- requester ---------------------------------------------------------------------------------
def request(argv: list, env: dict, fds: tuple = (0, 1, 2), **more) -> tuple:
    """Ask the server for one run with this process's descriptors `fds` (stdin, stdout and
    stderr) -> (connection, the run's pid)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(os.environ["FORKED_RANKS_SOCKET"])
    message = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "fds": list(fds),
                          "requester": os.getpid(), **more}).encode()
    socket.send_fds(conn, [message], list(fds))
    return conn, struct.unpack("!i", _read(conn, 4))[0]


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("forked_ranks: the server closed the connection")
        data += chunk
    return data


def _exit_as(code: int) -> None:
    """Exit with a run's status: its code, or killed by the same signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def run_one(argv: list, fds: tuple = (0, 1, 2), **more) -> None:
    conn, pid = request(argv, dict(os.environ), fds, **more)
    for number in FORWARDED:
        signal.signal(number, lambda n, _f: _signal(pid, n))
    _exit_as(struct.unpack("!i", _read(conn, 4))[0])


def exec_one(argv: list) -> None:
    """`python [FLAGS] -c CODE ARGS` through the server, with every descriptor this process
    was started with (the helper's pipes and sockets, passed by multiprocessing). The flags are
    the run's own interpreter flags, which the server already has (tests' run environment)."""
    import fcntl

    code_at = argv.index("-c") + 1
    numbers = [int(name) for name in os.listdir("/proc/self/fd")]
    opened = []
    for fd in sorted(numbers):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)  # not listdir's own, closed by now
        except OSError:
            continue
        opened.append(fd)
    if len(opened) > MAX_FDS:
        raise SystemExit(f"forked_ranks: {len(opened)} descriptors to pass, at most {MAX_FDS}")
    run_one(argv[code_at + 1:], tuple(opened), exec=argv[code_at])


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def launch(nproc: int, port: int, argv: list) -> None:
    """N ranks, as torchrun --standalone starts them, their store on `port` (conftest's
    unused_port: below the ephemeral range); the first failure stops the rest."""
    runs = {}
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
               "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "TORCHELASTIC_RESTART_COUNT": "0"}
        conn, pid = request(argv, env)
        runs[conn] = pid
    for number in FORWARDED:
        signal.signal(number, lambda n, _f: [_signal(pid, n) for pid in runs.values()])
    selector = selectors.DefaultSelector()
    for conn in runs:
        selector.register(conn, selectors.EVENT_READ)
    failure = 0
    while runs:
        for key, _ in selector.select():
            code = struct.unpack("!i", _read(key.fileobj, 4))[0]
            selector.unregister(key.fileobj)
            runs.pop(key.fileobj)
            if code != 0 and failure == 0:
                failure = code
                for pid in runs.values():
                    _signal(pid, signal.SIGTERM)
    _exit_as(failure)


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    if role == "server":
        serve(rest[0])
    elif role == "run":
        run_one(rest[rest.index("--") + 1:])
    elif role == "exec":
        exec_one(rest)
    elif role == "launch":
        launch(int(rest[rest.index("--nproc") + 1]), int(rest[rest.index("--port") + 1]),
               rest[rest.index("--") + 1:])
    else:
        raise SystemExit(f"forked_ranks: unknown role {role}")
